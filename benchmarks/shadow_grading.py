"""What shadow grading costs: strict-checker time per completion and per step, beside the run's rewards.

Shadow grading never generates: it re-runs a checker over completions the step already has. This
measures that checker time on completions shaped like a real step's, for each strict checker rlvr
picks (the arithmetic task's checker, the math checker for a gold column), and the whole
``Diagnostics.observe`` call with and without it, in memory (no run folder). Prints JSON.

    python benchmarks/shadow_grading.py [--completions 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time


def records(n: int, kind: str, rng: random.Random) -> list[dict]:
    out = []
    for i in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        gold = a + b
        guess = gold if rng.random() < 0.3 else gold + rng.choice([-10, -1, 1, 100])
        text = str(guess) if kind == "arithmetic" else f"We add {a} and {b}. The answer is \\boxed{{{guess}}}."
        out.append(
            {
                "step": 0,
                "prompt_id": f"p{i // 8}",
                "group": i // 8,
                "index": i % 8,
                "prompt": f"{a}+{b}=",
                "completion": text,
                "n_tokens": len(text),
                "finish_reason": "stop",
                "truncated": False,
                "rewards": {"lenient": float(str(gold) in text)},
                "reward": float(str(gold) in text),
                "advantage": 0.0,
                "correct": None,
                "verdict": None,
                "data_source": kind,
                "columns": {"answer": str(gold)},
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--completions", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from rlvr.diagnostics import Diagnostics
    from rlvr.diagnostics.shadow import shadow_checker

    rng = random.Random(0)
    result = {"completions_per_step": args.completions}
    for kind, task in (("arithmetic", "arithmetic"), ("math", None)):
        recs = records(args.completions, kind, rng)
        grader = shadow_checker(task, {}, [r["columns"] for r in recs], {})
        grader.grade(recs)  # warm-up (imports, worker start)
        grade = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            grader.grade(recs)
            grade.append(time.perf_counter() - t)
        observe = {}
        for label, shadow in (("with_shadow", grader), ("without_shadow", None)):
            times = []
            for _ in range(args.repeats):
                diag = Diagnostics(
                    None, 8, ["lenient"], [1.0], {"lenient": "correctness"}, console=lambda m: None, shadow=shadow
                )
                t = time.perf_counter()
                diag.observe(0, recs)
                times.append(time.perf_counter() - t)
            observe[label] = statistics.median(times)
        result[kind] = {
            "checker": grader.name,
            "shadow_seconds_per_step": statistics.median(grade),
            "shadow_ms_per_completion": 1000 * statistics.median(grade) / args.completions,
            "observe_seconds": observe,
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
