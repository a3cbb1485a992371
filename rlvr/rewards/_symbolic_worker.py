"""Symbolic equivalence worker: runs math-verify in its own process so the parent can kill it.

Started by ``rlvr.rewards.symbolic`` as ``python -I <this file>``; it deliberately imports
nothing from rlvr (the parent's ``sys.path`` is not assumed). Protocol, one JSON object per
line: the parent writes ``{"gold": latex, "pred": latex, "decimals": int | null}``, the worker answers
``{"equal": bool, "parsed": bool}`` or ``{"error": "..."}``. The first line it writes is
``{"ready": true}`` once imports are done, so import time never counts against a timeout.

Only math-verify's LaTeX extraction is used: its plain-expression extraction calls sympy's
``parse_expr``, which evaluates Python, and the inputs here come from model text. math-verify's
own ``signal.alarm`` timeouts are disabled (``None``): the parent's wall-clock kill is the limit.

Exactness. math-verify rounds floats to ``float_rounding`` places whenever one side holds one, and
compares other numbers with ``evalf(chop=True)``, which calls 1/2^99 and 1/2^98 equal (both chop
to 0). Here, when the gold has no decimal (``decimals`` is null), every float in the prediction is
turned into the exact rational it denotes (3.141593 -> 3141593/1000000, which is not pi), and a
"yes" on two numbers is confirmed by a relative comparison at 120 digits. When the gold is a
decimal, the prediction is rounded to the gold's own number of places.
"""

import json
import resource
import sys


def main() -> None:
    # A runaway sympy expansion should die on memory, not take the machine with it.
    limit = 2 * 1024**3
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.CRITICAL)
    import sympy
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0)]

    def read(latex: str):
        return parse(f"${latex}$", extraction_config=config, parsing_timeout=None)

    # Warm up: sympy imports much of itself lazily on first use; pay that before "ready" so a
    # fresh worker's first real comparison is not charged for it against its timeout.
    verify(read("(x+1)^2"), read("x^2+2x+1"), timeout_seconds=None)
    verify(read("\\frac{\\sqrt{3}}{2}"), read("\\sqrt{3}/2"), timeout_seconds=None)

    def exact(expr):
        # A float in the prediction denotes the rational it spells, not "about this much".
        if isinstance(expr, sympy.Basic) and not isinstance(expr, sympy.MatrixBase):
            return expr.xreplace({f: sympy.Rational(str(f)) for f in expr.atoms(sympy.Float)})
        if isinstance(expr, sympy.MatrixBase):
            return expr.applyfunc(exact)
        return expr

    def same_number(a, b) -> bool:
        # Relative, so tiny values are told apart: |a - b| <= 1e-100 * max(|a|, |b|) at 120 digits.
        # A decimal in an answer has at most 60 digits (the parent's bound), so no decimal
        # approximation of an irrational number gets this close.
        if not (isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr) and a.is_number and b.is_number):
            return True  # not two numbers: math-verify's structural answer stands
        diff, scale = abs((a - b).evalf(120)), max(abs(a.evalf(120)), abs(b.evalf(120)))
        try:
            return bool(diff == 0 or diff <= scale * sympy.Float("1e-100", 120))
        except TypeError:  # complex or undecidable comparison: keep math-verify's answer
            return True

    def compare(gold, pred, decimals) -> bool:
        if decimals is None:
            pred = [exact(p) for p in pred]
            if not verify(gold, pred, float_rounding=60, numeric_precision=60, timeout_seconds=None):
                return False
            return any(same_number(g, p) for g in gold[:1] for p in pred[:1])
        return bool(verify(gold, pred, float_rounding=int(decimals), timeout_seconds=None))

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold, pred = read(request["gold"]), read(request["pred"])
            if not gold or not pred:
                reply = {"equal": False, "parsed": False}
            else:
                reply = {"equal": compare(gold, pred, request.get("decimals")), "parsed": True}
        except Exception as exc:  # noqa: BLE001 - any parser failure is "not equal", reported
            reply = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
