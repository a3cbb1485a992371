"""What a run writes to its folder besides the diagnostics' own files: the run header (header.json,
config.yaml), the metric sinks (metrics.jsonl always, TensorBoard and W&B when asked for), and the
phase timer behind ``timing/<phase>``."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from rlvr.config import Config, dump_config


def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_run_header(run_dir: Path, cfg: Config, stream: Any, reward_fns: list, extra: dict[str, Any]) -> None:
    """header.json and config.yaml. Fingerprints say which data and checkers made this run: a file dataset
    whole, a task's stream by its first 1,000 rows (same seed and options => same stream), plus the
    held-out rows."""
    import transformers

    import rlvr
    from rlvr.diagnostics.header import run_fingerprints
    from rlvr.tasks.stream import eval_rows

    fingerprints = run_fingerprints(stream.peek(1000) + eval_rows(cfg), {rf.name: rf.fn for rf in reward_fns})

    header = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
        "versions": {
            "rlvr": rlvr.__version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "git_revision": _git_revision(),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "config": cfg.model_dump(mode="json"),
        "rewards": [rf.name for rf in reward_fns],
        **extra,
        **fingerprints,
    }
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    (run_dir / "header.json").write_text(json.dumps(header, indent=2, default=str))


class MetricLogger:
    """metrics.jsonl (always), TensorBoard and W&B (when asked for)."""

    def __init__(self, run_dir: Path, cfg: Config, warn: Callable[[str], None] = print):
        self.path = run_dir / "metrics.jsonl"
        self._tb = self._wandb = None
        if "tensorboard" in cfg.log.report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:
                warn("tensorboard is not installed: `pip install tensorboard`, or set log.report_to=[]")
        if "wandb" in cfg.log.report_to:
            import wandb  # an explicit choice: fail loudly if it is missing

            self._wandb = wandb.init(project="rlvr", dir=str(run_dir), config=cfg.model_dump(mode="json"))

    def truncate_after(self, step: int) -> None:
        """Drop metrics.jsonl lines past ``step``: what a killed attempt wrote after its last checkpoint."""
        from rlvr.runfolder import truncate_jsonl

        truncate_jsonl(self.path, step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # Strict JSON has no NaN/inf: an undefined value is left out of the line (docs/metrics.md).
        metrics = {k: v for k, v in metrics.items() if not (isinstance(v, float) and not math.isfinite(v))}
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **metrics}, allow_nan=False) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class PhaseTimer:
    """Wall time per named phase; `timing/<phase>` in the logs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def pop(self) -> dict[str, float]:
        out, self.seconds = {f"timing/{k}": v for k, v in self.seconds.items()}, {}
        return out
