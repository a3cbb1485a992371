"""The default job's requirement, measured: `rlvr train` with no arguments on this machine.

Runs the whole command in a subprocess, as a user would (model load and both evaluations included),
and prints JSON: held-out greedy accuracy before and after, wall time, steps, and the requirement
(start <= 50%, end >= 85%, wall <= 300 s on 2 CPU cores).

    python benchmarks/default_run.py [--runs 1] [extra key=value overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(overrides: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix="rlvr-default-"))
    cmd = [sys.executable, "-m", "rlvr.cli", "train", f"log.output_dir={out}", "log.progress=false", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"rlvr train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" in line]
    steps = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" not in line
    ]
    timing = {k: round(sum(s.get(k, 0.0) for s in steps), 2) for k in steps[-1] if k.startswith("timing/")}
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall_s": round(wall, 1),
        "before": evals[0]["eval/accuracy"],
        "after": evals[-1]["eval/accuracy"],
        "steps": evals[-1]["step"],
        "logged_timing_s": timing,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    runs = [one_run(args.overrides) for _ in range(args.runs)]
    ok = [r["before"] <= 0.50 and r["after"] >= 0.85 and r["wall_s"] <= 300 for r in runs]
    print(
        json.dumps(
            {
                "cpus": os.cpu_count(),
                "runs": runs,
                "requirement": "before <= 0.50, after >= 0.85, wall <= 300 s",
                "met": all(ok),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
