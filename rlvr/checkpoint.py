"""Atomic, complete checkpoints: a run killed at any moment resumes to the same result (docs/architecture.md).

A checkpoint is a folder ``OUTPUT_DIR/checkpoints/step-000050/`` holding:

- ``trainable.safetensors``: every trainable parameter (all weights, or only the LoRA adapter);
  frozen weights are re-read from ``model.path`` on resume, so a LoRA checkpoint stays small;
- ``optimizer.pt``, ``scheduler.pt``: their ``state_dict()``;
- ``state.json``: step counters, diagnostics and anything else JSON-able that rank 0 owns;
- ``rank-state{r}.json``, ``rng-rank{r}.pt`` per process r: what differs between ranks (data
  position, sampling counters, DAPO histories) and the Python, NumPy and torch (CPU and CUDA)
  generator states. One process writes only rank 0's.

It is written into ``.tmp-step-000050`` and renamed into place only when complete: ``os.replace``
of a directory is atomic on POSIX, so a checkpoint folder either exists whole or not at all. With
several processes, every rank writes its own two files into the temporary folder and rank 0
renames it once all have (two barriers); the run folder must be on a file system all ranks share.
Weights, optimizer and scheduler are the same on every rank under DDP, so only rank 0 writes them.
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

from rlvr import distributed

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


def save_checkpoint(ckpt_root: Path, step: int, *args: Any, rank: int = 0, **kwargs: Any) -> Path:
    """Write a checkpoint (see `_save_checkpoint`). A full disk leaves no partial folder behind (the
    temporary one is removed, freeing its space) and is raised as ENOSPC naming the checkpoint."""
    from rlvr.errors import disk_full_names

    tmp = ckpt_root / f".tmp-step-{step:06d}"
    try:
        with disk_full_names(tmp):
            return _save_checkpoint(ckpt_root, step, *args, rank=rank, **kwargs)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _save_checkpoint(
    ckpt_root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    keep: int | None = None,
    rank_state: dict[str, Any] | None = None,
    rank: int = 0,
    world: int = 1,
) -> Path:
    """Called by every rank with its own `rank_state`; `model` is the unwrapped module (no ``module.``)."""
    final = ckpt_root / f"step-{step:06d}"
    tmp = ckpt_root / f".tmp-step-{step:06d}"
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    distributed.barrier()  # the temporary folder exists before any rank writes into it
    torch.save(_rng_state(), tmp / f"rng-rank{rank}.pt")
    (tmp / f"rank-state{rank}.json").write_text(json.dumps(rank_state or {}))
    if rank != 0:
        _fsync_files(tmp, (f"rng-rank{rank}.pt", f"rank-state{rank}.json"))
    distributed.barrier()  # every rank's files are on disk before rank 0 makes the folder visible
    if rank != 0:
        return final
    trainable = {n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad}
    save_file(trainable, str(tmp / "trainable.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    (tmp / "state.json").write_text(json.dumps({**state, "world_size": world}))
    _fsync_files(tmp, [f.name for f in tmp.iterdir()])  # data on disk before the rename makes it visible
    if final.exists():  # re-saving the same step (e.g. the final save): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_root)
    if keep is not None:
        for old in list_checkpoints(ckpt_root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync_files(folder: Path, names: Any) -> None:
    for name in names:
        with open(folder / name, "rb") as fh:
            os.fsync(fh.fileno())


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    if not ckpt_root.exists():
        return []
    return sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    ckpts = list_checkpoints(ckpt_root)
    return ckpts[-1] if ckpts else None


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, rank: int = 0,
    world: int = 1,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore everything save_checkpoint wrote for this rank; returns (the shared JSON state, this
    rank's JSON state)."""
    missing = [f for f in ("trainable.safetensors", "optimizer.pt", "scheduler.pt", f"rng-rank{rank}.pt",
                           f"rank-state{rank}.json", "state.json") if not (path / f).exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {path} is incomplete (missing {', '.join(missing)}); pick another")
    state = json.loads((path / "state.json").read_text())
    if state.get("world_size", 1) != world:
        raise ValueError(
            f"checkpoint {path} was written by {state.get('world_size', 1)} processes and this run has {world}: "
            "each process resumes its own data shard and random state, so resume with the same number of "
            "processes (torchrun --nproc_per_node), or start a new run from its weights (model.path).")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in load_file(str(path / "trainable.safetensors")).items():
            if name not in params:
                raise KeyError(f"checkpoint {path} has parameter {name!r} that the model lacks: wrong model.path?")
            params[name].copy_(value)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    _set_rng_state(torch.load(path / f"rng-rank{rank}.pt", weights_only=False))
    return state, json.loads((path / f"rank-state{rank}.json").read_text())


# ------------------------------------------------------------------ the training loop's state


def save_run(run: Any) -> Path:
    """Every rank calls this: its data position, counters and RNG go into the checkpoint beside rank 0's."""
    state = {"step": run.step, "engine_version": run.engine_version, "diagnostics": run.diagnostics.state_dict()}
    rank_state = {"generation": run.generation, "stream": run.stream.state_dict(), "reward_errors": run.reward_errors,
                  "group_filter": None if run.group_filter is None else run.group_filter.state_dict()}
    return save_checkpoint(run.run_dir / "checkpoints", run.step, run.model, run.optimizer, run.scheduler,
                           state, keep=run.cfg.log.save_total_limit, rank_state=rank_state,
                           rank=run.dist.rank, world=run.dist.world)


def resume_run(run: Any) -> Path | None:
    """Load the checkpoint ``run.cfg.resume`` names into the run's model, optimizer, scheduler, counters and
    data position (train.py's ``Run``); None when there is none to resume from. Every rank calls this."""
    if run.cfg.resume is False:
        return None
    path = latest_checkpoint(run.run_dir / "checkpoints") if run.cfg.resume is True else Path(run.cfg.resume)
    if path is None:
        run.console.info(f"resume: no checkpoint in {run.run_dir / 'checkpoints'} yet; starting fresh")
        return None
    state, mine = load_checkpoint(path, run.model, run.optimizer, run.scheduler, run.dist.rank, run.dist.world)
    run.step, run.generation, run.engine_version = state["step"], mine["generation"], state["engine_version"]
    run.stream.load_state_dict(mine["stream"])
    run.diagnostics.load_state_dict(state["diagnostics"])
    if run.group_filter is not None and mine.get("group_filter") is not None:
        run.group_filter.load_state_dict(mine["group_filter"])
    run.reward_errors = mine["reward_errors"]
    if run.dist.is_main:
        run.logger.truncate_after(run.step)  # lines the killed attempt wrote after the checkpoint
    return path
