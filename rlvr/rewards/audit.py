"""``rlvr audit``: measure a checker on cases with known answers before training against it.

A case is one JSON object per line:

    {"completion": "...", "expected": true|false, "gold": ...}        # --checker math
    {"completion": "...", "expected": true|false, "tests": [...]}     # --checker code
    {"completion": "...", "expected": true|false, "schema": {...}}    # --checker json

optionally with ``name``, ``category`` (grouping in the report), ``truncated`` (math/code/json:
score as a completion that hit the length limit) and, for json, ``gold`` and ``incomplete_reward``.
``expected`` says whether a trustworthy checker should accept the completion.

Report: true/false positives and negatives, errors (the checker raised), timeouts, per-category
counts and every disagreement; the false-negative rate on the expected-true cases (and on the
``well_formed`` category, correct answers written in the many styles people use, when the case file
has one); the slowest case; for code, which sandbox isolation ran (a loud warning when the host
filesystem was visible to the programs) and which cases have tests that are not tamper-proof (an
expected value judged inside the sandbox). The exit code is 1 when any case disagrees (a false
positive is an exploitable checker; a false negative is a correct answer the policy is punished
for) or the checker raised, 2 when the cases cannot be read, else 0.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlvr.rewards.base import Verdict

FIXTURES = Path(__file__).with_name("fixtures")
CHECKERS = ("math", "code", "json")


def _math(case: dict) -> Verdict:
    from rlvr.rewards.mathcheck import check_math

    return check_math(
        case["completion"],
        case["gold"],
        truncated=bool(case.get("truncated", False)),
        timeout_s=float(case.get("timeout_s", 5.0)),
    )


def _code(case: dict) -> Verdict:
    from rlvr.rewards.codecheck import check_code
    from rlvr.rewards.sandbox import Limits

    limits = Limits(
        timeout_s=float(case.get("timeout_s", 3.0)), memory_mb=int(case.get("memory_mb", 256)), output_bytes=1 << 18
    )
    return check_code(case["completion"], case["tests"], truncated=bool(case.get("truncated", False)), limits=limits)


def _json(case: dict) -> Verdict:
    from rlvr.rewards.jsoncheck import check_json

    return check_json(
        case["completion"],
        case["schema"],
        gold=case.get("gold"),
        incomplete_reward=float(case.get("incomplete_reward", 0.0)),
        truncated=bool(case.get("truncated", False)),
        timeout_s=float(case.get("timeout_s", 2.0)),
    )


_RUNNERS: dict[str, tuple[Callable[[dict], Verdict], tuple[str, ...], int]] = {
    # checker -> (runner, required keys besides completion/expected, parallel workers)
    "math": (_math, ("gold",), 2),  # two symbolic workers per process
    "code": (_code, ("tests",), 8),  # sandboxes mostly wait: run many at once
    "json": (_json, ("schema",), 1),
}


def _warm_math() -> None:
    from rlvr.rewards.mathcheck import check_math

    check_math("\\boxed{x+1}", "1+x")


def _warm_json() -> None:
    from rlvr.rewards.jsoncheck import check_json

    check_json("{}", {"type": "object"})


_WARM_UP = {"math": _warm_math, "json": _warm_json}


class CaseError(ValueError):
    pass


def load_cases(checker: str, cases: str | Path | None = None) -> list[dict]:
    path = Path(cases) if cases is not None else FIXTURES / f"{checker}.jsonl"
    if not path.is_file():
        raise CaseError(f"audit: no case file at {path}; pass --cases FILE.jsonl with one JSON object per line")
    required = ("completion", "expected") + _RUNNERS[checker][1]
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CaseError(
                f"audit: {path}:{lineno} is not valid JSON ({exc.msg}); each line must be one JSON object"
            ) from None
        missing = [k for k in required if k not in row]
        if missing or not isinstance(row.get("expected"), bool):
            raise CaseError(
                f"audit: {path}:{lineno} needs the keys {', '.join(required)} with a boolean 'expected' "
                f"(missing: {', '.join(missing) or 'expected must be true or false'})"
            )
        row.setdefault("name", f"case_{lineno}")
        row.setdefault("category", "adversarial" if not row["expected"] else "correct")
        rows.append(row)
    return rows


def audit(checker: str | Callable[[dict], Verdict], rows: list[dict], workers: int | None = None) -> dict[str, Any]:
    """Run the checker on every row; return the report as plain data.

    ``checker`` is a built-in name or your own function ``case_row -> Verdict`` (the row is the
    case's JSON object), which is how a custom checker is audited from Python.
    """
    if callable(checker):
        runner, name, default_workers = checker, getattr(checker, "__name__", "custom"), 1
    else:
        runner, _, default_workers = _RUNNERS[checker]
        name = checker
    workers = workers or default_workers

    def one(row: dict) -> tuple[dict, Verdict | None, str | None, float]:
        start = time.perf_counter()
        try:
            verdict, error = runner(row), None
        except Exception as exc:  # noqa: BLE001 - a raising checker is a finding, not a crash
            verdict, error = None, f"{type(exc).__name__}: {exc}"
        return row, verdict, error, time.perf_counter() - start

    if not callable(checker) and checker in _WARM_UP:
        _WARM_UP[checker]()  # start the worker processes first: their start-up is not a case's time
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        timed = list(pool.map(one, rows))
    results = [(row, verdict, error) for row, verdict, error, _ in timed]
    slowest_row, _, _, slowest_s = max(timed, key=lambda r: r[3]) if timed else ({"name": None}, None, None, 0.0)
    counts: Counter[str] = Counter()
    by_category: dict[str, Counter[str]] = defaultdict(Counter)
    disagreements = []
    for row, verdict, error in results:
        if error is not None:
            outcome = "error"
        elif verdict.correct:
            outcome = "tp" if row["expected"] else "fp"
        else:
            outcome = "fn" if row["expected"] else "tn"
        counts[outcome] += 1
        by_category[row["category"]][outcome] += 1
        if verdict is not None and verdict.reason == "timeout":
            counts["timeouts"] += 1
        if outcome in ("fp", "fn", "error"):
            disagreements.append(
                {
                    "name": row["name"],
                    "category": row["category"],
                    "outcome": outcome,
                    "expected": row["expected"],
                    "reason": error if error is not None else verdict.reason,
                    "extracted": None if verdict is None else verdict.extracted,
                    "completion": row["completion"][:160],
                }
            )
    positives = [(row, verdict, error) for row, verdict, error in results if row["expected"]]
    well_formed = [(row, verdict, error) for row, verdict, error in positives if row["category"] == "well_formed"]

    def fn_rate(group: list) -> float | None:
        return round(sum(1 for _, v, e in group if e is not None or not v.correct) / len(group), 4) if group else None

    isolations = Counter(v.extra.get("isolation") for _, v, _ in results if v is not None and v.extra.get("isolation"))
    not_tamper_proof = [
        {"name": row["name"], "tests": v.extra["not_tamper_proof"]}
        for row, v, _ in results
        if v is not None and v.extra.get("not_tamper_proof")
    ]
    return {
        "checker": name,
        "false_negative_rate": fn_rate(positives),
        "well_formed_false_negative_rate": fn_rate(well_formed),
        "well_formed_cases": len(well_formed),
        "slowest_case": {"name": slowest_row.get("name"), "seconds": round(slowest_s, 3)},
        "isolation": dict(isolations),
        "host_visible_to_programs": isolations.get("rlimits", 0) > 0,
        "not_tamper_proof": not_tamper_proof,
        "cases": len(rows),
        "true_positives": counts["tp"],
        "false_positives": counts["fp"],
        "true_negatives": counts["tn"],
        "false_negatives": counts["fn"],
        "errors": counts["error"],
        "timeouts": counts["timeouts"],
        "by_category": {k: dict(v) for k, v in sorted(by_category.items())},
        "disagreements": disagreements,
        "seconds": round(time.monotonic() - start, 2),
    }


def _print_table(report: dict[str, Any], out=None) -> None:
    out = out or sys.stdout  # looked up per call: pytest and the CLI may swap sys.stdout
    p = lambda *a: print(*a, file=out)
    p(f"audit of the {report['checker']} checker: {report['cases']} cases in {report['seconds']} s")
    p(f"  true positives  {report['true_positives']:5d}   (correct answers accepted)")
    p(f"  true negatives  {report['true_negatives']:5d}   (wrong / adversarial answers rejected)")
    p(f"  false positives {report['false_positives']:5d}   (accepted but should not be: exploitable)")
    p(f"  false negatives {report['false_negatives']:5d}   (rejected but correct: punishes right answers)")
    p(f"  errors          {report['errors']:5d}   (the checker raised)")
    p(f"  timeouts        {report['timeouts']:5d}   (scored 0)")
    if report["false_negative_rate"] is not None:
        p(f"  false-negative rate {report['false_negative_rate']:.2%} of the cases that should be accepted")
    if report["well_formed_false_negative_rate"] is not None:
        rate, n = report["well_formed_false_negative_rate"], report["well_formed_cases"]
        p(f"  false-negative rate {rate:.2%} on {n} well-formed answers")
    p(f"  slowest case    {report['slowest_case']['name']} ({report['slowest_case']['seconds']} s)")
    if report["isolation"]:
        p(f"  sandbox isolation: {', '.join(f'{k} ({n} cases)' for k, n in report['isolation'].items())}")
    if report["host_visible_to_programs"]:
        p("  WARNING: programs ran with isolation=rlimits and could see the host filesystem and its unix sockets;")
        p("           install bubblewrap (apt-get install bubblewrap) or run as root with CAP_SYS_ADMIN")
    if report["not_tamper_proof"]:
        n = len(report["not_tamper_proof"])
        p(f"  not tamper-proof: {n} case(s) have tests whose expected value is judged in the sandbox:")
        for item in report["not_tamper_proof"][:20]:
            p(f"    {item['name']}: tests {item['tests']}")
    p("")
    p(f"  {'category':<18} {'tp':>5} {'tn':>5} {'fp':>5} {'fn':>5} {'err':>5}")
    for category, c in report["by_category"].items():
        p(
            f"  {category:<18} {c.get('tp', 0):5d} {c.get('tn', 0):5d} {c.get('fp', 0):5d} {c.get('fn', 0):5d} {c.get('error', 0):5d}"
        )
    if report["disagreements"]:
        p("")
        p("disagreements:")
        for d in report["disagreements"]:
            p(
                f"  [{d['outcome'].upper()}] {d['name']} ({d['category']}): expected {'accept' if d['expected'] else 'reject'}, "
                f"reason={d['reason']!r}, extracted={d['extracted']!r}"
            )
            p(f"        {d['completion']!r}")
    else:
        p("")
        p("no disagreements.")


def run_audit(checker: str, cases: str | None = None, as_json: bool = False) -> int:
    """Entry point for ``rlvr audit``; returns the process exit code (see module doc)."""
    if checker == "json_schema":
        checker = "json"
    if checker not in _RUNNERS:
        print(f"audit: unknown checker {checker!r}; choose one of {', '.join(CHECKERS)}", file=sys.stderr)
        return 2
    try:
        rows = load_cases(checker, cases)
    except CaseError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    report = audit(checker, rows)
    if as_json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_table(report)
    bad = report["false_positives"] + report["false_negatives"] + report["errors"]
    return 1 if bad else 0


if __name__ == "__main__":  # python -m rlvr.rewards.audit math [cases.jsonl] [--json]
    args = [a for a in sys.argv[1:] if a != "--json"]
    sys.exit(run_audit(args[0] if args else "math", args[1] if len(args) > 1 else None, "--json" in sys.argv))
