"""Measured: how much generation each informative group costs, with and without DAPO's
dynamic sampling and rlvr's predictive prompt skipping, and the held-out accuracy each run ends at.

The default task (2-digit addition, the shipped tiny model) over a fixed pool of training prompts,
so prompts recur across epochs: that is when skipping can act (a stream that never repeats a prompt
gives skipping nothing to remember). Three runs, same number of optimizer steps, same seed:

- ``grpo``:  plain GRPO (every sampled group is trained on, zero-spread or not);
- ``dynamic``: DAPO dynamic sampling (zero-spread groups dropped, more prompts sampled);
- ``dynamic+skip``: dynamic sampling + skipping prompts that were all-pass/all-fail twice running.

Prints JSON: per run, rollout tokens generated, informative (mixed) groups trained on, tokens per
informative group, groups dropped by kind, prompts skipped, and held-out greedy accuracy.

    python benchmarks/dapo_sampling.py [--steps 120] [--pool 256] [key=value overrides ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

VARIANTS = {
    "grpo": [],
    "dynamic": ["dapo.dynamic_sampling=true", "dapo.max_generation_rounds=4", "dapo.oversample_factor=1.25"],
    "dynamic+skip": [
        "dapo.dynamic_sampling=true",
        "dapo.max_generation_rounds=4",
        "dapo.oversample_factor=1.25",
        "dapo.skip_solved_prompts=true",
        "dapo.skip_after=2",
        "dapo.reprobe_fraction=0.1",
    ],
}


def write_pool(folder: Path, pool: int, eval_n: int) -> tuple[Path, Path]:
    from rlvr.tasks import get_task

    task = get_task("arithmetic")
    train, held = folder / "train.jsonl", folder / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in islice(task.train_rows(seed=0), pool)))
    held.write_text("".join(json.dumps(r) + "\n" for r in task.eval_rows(eval_n, seed=0)))
    return train, held


def run(name: str, extra: list[str], train: Path, held: Path, steps: int, overrides: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"rlvr-dapo-{name.replace('+', '-')}-"))
    cmd = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        f"data.path={train}",
        f"data.eval_path={held}",
        "rewards=[{name: arithmetic}]",
        f"train.max_steps={steps}",
        "log.logging_steps=1",
        "log.progress=false",
        f"log.output_dir={out}",
        *extra,
        *overrides,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps_m = [m for m in lines if "num_tokens" in m]  # training lines (eval lines carry eval/* only)
    evals = [m for m in lines if "eval/accuracy" in m]
    # Without dynamic sampling (the grpo variant) no dapo/* is logged: every group sampled was trained on.
    fallback = {"dapo/tokens_generated": "num_tokens", "dapo/groups_generated": "groups/count"}
    total = lambda key: sum(m.get(key, m.get(fallback.get(key, ""), 0.0)) for m in steps_m)  # noqa: E731
    informative_trained = sum(m["groups/mixed"] * m["groups/count"] for m in steps_m)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall_s": round(wall, 1),
        "rollout_tokens": int(total("dapo/tokens_generated")),
        "groups_generated": int(total("dapo/groups_generated")),
        "informative_groups_trained": int(round(informative_trained)),
        "tokens_per_informative_group": round(total("dapo/tokens_generated") / max(1.0, informative_trained), 1),
        "dropped_all_pass": int(total("dapo/dropped_all_pass")),
        "dropped_all_fail": int(total("dapo/dropped_all_fail")),
        "skipped_prompts": int(total("dapo/skipped_prompts")),
        "accuracy_before": evals[0]["eval/accuracy"],
        "accuracy_after": evals[-1]["eval/accuracy"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--pool", type=int, default=256, help="distinct training prompts (they recur each epoch)")
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--only", nargs="*", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="rlvr-dapo-pool-"))
    train, held = write_pool(folder, args.pool, args.eval)
    results = {name: run(name, VARIANTS[name], train, held, args.steps, args.overrides) for name in args.only}
    print(
        json.dumps(
            {
                "task": "arithmetic (2-digit +), shipped tiny model",
                "pool": args.pool,
                "steps": args.steps,
                "results": results,
            },
            indent=2,
        )
    )
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
