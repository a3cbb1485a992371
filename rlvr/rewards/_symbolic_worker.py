"""Symbolic equivalence worker: runs math-verify in its own process so the parent can kill it.

Started by ``rlvr.rewards.symbolic`` as ``python -I <this file>``; it deliberately imports
nothing from rlvr (the parent's ``sys.path`` is not assumed). Protocol, one JSON object per
line: the parent writes ``{"gold": latex, "pred": latex}``, the worker answers
``{"equal": bool, "parsed": bool}`` or ``{"error": "..."}``. The first line it writes is
``{"ready": true}`` once imports are done, so import time never counts against a timeout.

Only math-verify's LaTeX extraction is used: its plain-expression extraction calls sympy's
``parse_expr``, which evaluates Python, and the inputs here come from model text. math-verify's
own ``signal.alarm`` timeouts are disabled (``None``): the parent's wall-clock kill is the limit.
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
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0)]

    def read(latex: str):
        return parse(f"${latex}$", extraction_config=config, parsing_timeout=None)

    # Warm up: sympy imports much of itself lazily on first use; pay that before "ready" so a
    # fresh worker's first real comparison is not charged for it against its timeout.
    verify(read("(x+1)^2"), read("x^2+2x+1"), timeout_seconds=None)
    verify(read("\\frac{\\sqrt{3}}{2}"), read("\\sqrt{3}/2"), timeout_seconds=None)

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
                reply = {"equal": bool(verify(gold, pred, timeout_seconds=None)), "parsed": True}
        except Exception as exc:  # noqa: BLE001 - any parser failure is "not equal", reported
            reply = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
