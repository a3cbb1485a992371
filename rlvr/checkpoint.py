"""Atomic, complete checkpoints: a run killed at any moment resumes to the same result (DESIGN.md §9).

A checkpoint is a folder ``OUTPUT_DIR/checkpoints/step-000050/`` holding:

- ``trainable.safetensors``: every trainable parameter (all weights, or only the LoRA adapter);
  frozen weights are re-read from ``model.path`` on resume, so a LoRA checkpoint stays small;
- ``optimizer.pt``, ``scheduler.pt``: their ``state_dict()``;
- ``state.json``: step counters, data position, diagnostics and DAPO histories (anything JSON-able);
- ``rng.pt``: Python, NumPy and torch (CPU and CUDA) generator states.

It is written into ``.tmp-step-000050`` and renamed into place only when complete: ``os.replace``
of a directory is atomic on POSIX, so a checkpoint folder either exists whole or not at all.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

try:
    import numpy as np
except ImportError:  # numpy is optional for rlvr itself
    np = None  # type: ignore[assignment]


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if np is not None:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    keep: int | None = None,
) -> Path:
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step-{step:06d}"
    tmp = ckpt_root / f".tmp-step-{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    trainable = {n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad}
    save_file(trainable, str(tmp / "trainable.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state))
    for f in tmp.iterdir():  # data on disk before the rename makes it visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # re-saving the same step (e.g. the final save): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_root)
    if keep is not None:
        for old in list_checkpoints(ckpt_root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    if not ckpt_root.exists():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    ckpts = list_checkpoints(ckpt_root)
    return ckpts[-1] if ckpts else None


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> dict[str, Any]:
    """Restore everything saved by save_checkpoint; returns the JSON state."""
    missing = [f for f in ("trainable.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "state.json")
               if not (path / f).exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {path} is incomplete (missing {', '.join(missing)}); pick another")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in load_file(str(path / "trainable.safetensors")).items():
            if name not in params:
                raise KeyError(f"checkpoint {path} has parameter {name!r} that the model lacks: wrong model.path?")
            params[name].copy_(value)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return json.loads((path / "state.json").read_text())
