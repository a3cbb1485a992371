"""Atomic, complete, reshardable checkpoints: a run killed at any moment resumes to the same result
(bitwise on CPU at the same number of processes), and a checkpoint resumes at any number of processes,
under DDP or FSDP alike.

A checkpoint is a folder ``OUTPUT_DIR/checkpoints/step-000050/`` holding:

- ``dcp/``: the trainable parameters (all weights, or only the LoRA adapter: frozen weights are re-read
  from ``model.path`` on resume, so a LoRA checkpoint stays small) and the AdamW state, written by
  torch.distributed.checkpoint (DCP): each rank writes the shards it owns (under DDP the replicated
  tensors once), keyed by parameter name, with a ``.metadata`` index. DCP reads them back into whatever
  layout the resuming run has, so 2 FSDP ranks -> 1 process, 1 -> 2, and DDP <-> FSDP all load;
- ``optimizer-moments.bin``, with ``train.optim_offload`` only: AdamW's moments, which that optimizer keeps in a
  file rather than in its state (``rlvr.offload``); copied by rank 0 (DDP's ranks hold the same), resumed by all;
- ``scheduler.pt``: its ``state_dict()`` (a step count, the same on every rank);
- ``state.json``: step counters, diagnostics and anything else JSON-able that rank 0 owns;
- ``rank-state{r}.json``, ``rng-rank{r}.pt`` per process r: what differs between ranks (data
  position, sampling counters, DAPO histories) and the Python, NumPy and torch (CPU and CUDA)
  generator states. One process writes only rank 0's. `resplit` says how they are dealt out again
  when the number of processes changes.

It is written into ``.tmp-step-000050`` and renamed into place only when complete: ``os.replace``
of a directory is atomic on POSIX, so a checkpoint folder either exists whole or not at all. With
several processes, every rank writes its files into the temporary folder and rank 0 renames it once
all have (DCP's own gather of write results, then a barrier); the run folder must be on a file system
all ranks share.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from rlvr import distributed
from rlvr.offload import DiskAdamW

MOMENTS_FILE = "optimizer-moments.bin"

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


@contextlib.contextmanager
def _single_process_is_intended() -> Iterator[None]:
    """DCP warns on every save and load without a process group; one process is a normal rlvr run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized")
        yield


def _state_dict_options(model: torch.nn.Module, strict: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Frozen weights (a LoRA run's base model) come from model.path, not from the checkpoint.
    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _frozen_names(model: torch.nn.Module) -> set[str]:
    """Every name of a frozen parameter, tied aliases included. DCP's ``ignore_frozen_params`` skips the
    frozen parameters by their first name only, so a tied ``lm_head.weight`` (the embedding under a second
    name) would still be saved in every LoRA checkpoint: 1.2 GB for a 1.7B model's vocabulary."""
    return {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _trainable_state(model: torch.nn.Module, model_sd: dict[str, Any]) -> dict[str, Any]:
    frozen = _frozen_names(model)
    return {k: v for k, v in model_sd.items() if k not in frozen} if frozen else model_sd


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
    """Called by every rank with its own `rank_state`; `model` is the unwrapped (or FSDP-sharded) module,
    without DDP's ``module.`` prefix."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = ckpt_root / f"step-{step:06d}"
    tmp = ckpt_root / f".tmp-step-{step:06d}"
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    distributed.barrier()  # the temporary folder exists before any rank writes into it
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_state_dict_options(model))
    model_sd = _trainable_state(model, model_sd)
    # Collective: every rank writes its shards; rank 0 writes .metadata once all have reported.
    with _single_process_is_intended():
        dcp.save(
            {"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp / "dcp", no_dist=not dist.is_initialized()
        )
    torch.save(_rng_state(), tmp / f"rng-rank{rank}.pt")
    (tmp / f"rank-state{rank}.json").write_text(json.dumps(rank_state or {}))
    if rank != 0:
        _fsync_files(tmp, (f"rng-rank{rank}.pt", f"rank-state{rank}.json"))
        _fsync_files(tmp / "dcp", [f.name for f in (tmp / "dcp").iterdir() if f.name.startswith(f"__{rank}_")])
    distributed.barrier()  # every rank's files are on disk before rank 0 makes the folder visible
    if rank != 0:
        return final
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    if isinstance(optimizer, DiskAdamW):
        optimizer.save_moments(tmp / MOMENTS_FILE)
    (tmp / "state.json").write_text(json.dumps({**state, "world_size": world}))
    _fsync_files(tmp, [f.name for f in tmp.iterdir() if f.is_file()])  # on disk before the rename shows them
    _fsync_files(tmp / "dcp", [f.name for f in (tmp / "dcp").iterdir()])
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
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rank: int = 0,
    world: int = 1,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore everything save_checkpoint wrote, resharded to this run's layout; returns (the shared JSON
    state, this rank's JSON state). Every rank calls it (DCP's load is collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    missing = [
        f for f in ("dcp", "scheduler.pt", "rng-rank0.pt", "rank-state0.json", "state.json") if not (path / f).exists()
    ]
    if missing:
        hint = (
            (
                " (it is in the older single-file layout, trainable.safetensors: resume it with the rlvr that "
                "wrote it, or start a new run from its weights)"
            )
            if (path / "trainable.safetensors").exists()
            else ""
        )
        raise FileNotFoundError(f"checkpoint {path} is incomplete (missing {', '.join(missing)}){hint}; pick another")
    if (path / MOMENTS_FILE).exists() != isinstance(optimizer, DiskAdamW):
        written = "true" if (path / MOMENTS_FILE).exists() else "false"
        raise ValueError(
            f"checkpoint {path} was written with train.optim_offload={written} (AdamW's moments "
            f"{'in a file' if written == 'true' else 'in the optimizer state'}): resume with "
            f"train.optim_offload={written}"
        )
    state = json.loads((path / "state.json").read_text())
    saved_world = state.get("world_size", 1)
    options = _state_dict_options(model)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    target = {"model": _trainable_state(model, model_sd), "optimizer": optim_sd}
    # Each rank reads the pieces of its own shards, whatever layout wrote them.
    with _single_process_is_intended():
        dcp.load(target, checkpoint_id=path / "dcp", no_dist=not dist.is_initialized())
    # Frozen weights (a LoRA base) are not in the checkpoint: load non-strictly, then require that nothing
    # but those is missing.
    result = set_state_dict(
        model,
        optimizer,
        model_state_dict=target["model"],
        optim_state_dict=target["optimizer"],
        options=_state_dict_options(model, strict=False),
    )
    frozen = _frozen_names(model)
    missing = [k for k in result.missing_keys if k not in frozen]
    unexpected = list(result.unexpected_keys)
    if missing or unexpected:
        raise KeyError(
            f"checkpoint {path} does not match the model (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}): wrong model.path, or another LoRA setting?"
        )
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    if isinstance(optimizer, DiskAdamW):
        optimizer.load_moments(path / MOMENTS_FILE)
    if saved_world == world:
        _set_rng_state(torch.load(path / f"rng-rank{rank}.pt", weights_only=False))
        return state, json.loads((path / f"rank-state{rank}.json").read_text())
    if rank < saved_world:  # a rank the checkpoint knows keeps its generators; new ranks keep their seeded ones
        _set_rng_state(torch.load(path / f"rng-rank{rank}.pt", weights_only=False))
    saved = [json.loads((path / f"rank-state{r}.json").read_text()) for r in range(saved_world)]
    return state, resplit(saved, rank, world)


def resplit(saved: list[dict[str, Any]], rank: int, world: int) -> dict[str, Any]:
    """Rank `rank`'s run state in a `world`-process run, from the states of every rank of a run with a
    different number of processes (the fields save_run writes).

    Data: old rank r handed out rows r, r+W, ..., r+W(p_r-1) of the one seeded stream. The resumed
    stream starts at the first row after the last row any rank took, and is dealt out anew: rank r'
    takes rows start + r', start + r' + world, ... With equal positions (the usual case, and always
    without DAPO refills) that start is exactly W·p: no row is repeated or skipped. When a DAPO refill
    left ranks uneven, the rows the lagging ranks had not reached yet are skipped, never repeated.
    Sampling seeds: generation counts continue from the highest any rank reached, so no new rank
    reuses a seed. DAPO histories (per prompt) are merged so any rank finds a prompt's history.
    Reward-error counters are totals over ranks, so rank 0 carries the sum and new ranks start at 0.
    """
    old_world = len(saved)
    start = max(
        (
            r + old_world * (s["stream"]["position"] - 1) + 1 + s["stream"].get("offset", 0)
            for r, s in enumerate(saved)
            if s["stream"]["position"] > 0
        ),
        default=0,
    )
    filters = [s["group_filter"] for s in saved if s.get("group_filter") is not None]  # None: DAPO was off
    group_filter = None
    if filters:
        history: dict[str, list] = {}
        for f in filters:
            history.update(f["history"])
        group_filter = {
            "history": history,
            "draws": max(f["draws"] for f in filters),
            "warned_short": any(f["warned_short"] for f in filters),
        }
    errors: dict[str, int] = {}
    for s in saved:
        for k, v in s["reward_errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "generation": max(s["generation"] for s in saved),
        "stream": {"position": 0, "offset": start},
        "group_filter": group_filter,
        "reward_errors": errors if rank == 0 else {},
    }


def save_final(final_dir: Path, model: torch.nn.Module, tokenizer: Any, d: distributed.Dist) -> None:
    """The model for users, in ``save_pretrained`` format (transformers or peft loads it). Every rank
    calls this: under FSDP the weights are gathered whole onto rank 0 (one all-gather per parameter,
    held in CPU memory: the full model once, on rank 0 only) and cast to the model's configured dtype
    (the shards are float32 master weights under mixed precision). Under DDP rank 0 also writes
    every rank's weight digest (rank-digests.json): the proof that all ranks ended on these weights."""
    from rlvr import fsdp

    digests = distributed.check_in_sync(model, d)  # one gather of a hash; raises if DDP ranks diverged
    full = None
    if fsdp.is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        dtype = fsdp.compute_dtype(model)
        # A tied weight (lm_head = embed_tokens) is gathered under both names; save_pretrained keeps one.
        aliases = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {
            n for n, _ in model.named_parameters()
        }
        full = {k: v.to(dtype) if v.is_floating_point() else v for k, v in full.items() if k not in aliases}
    if d.is_main:
        model.save_pretrained(final_dir, **({} if full is None else {"state_dict": full}))
        if full is not None and (final_dir / "config.json").exists():
            # save_pretrained wrote the shards' dtype (float32 master weights) into config.json.
            model.config.dtype = str(fsdp.compute_dtype(model)).removeprefix("torch.")
            model.config.save_pretrained(final_dir)
        tokenizer.save_pretrained(final_dir)
        if digests is not None:
            (final_dir / "rank-digests.json").write_text(json.dumps(digests))


# ------------------------------------------------------------------ the training loop's state


def save_run(run: Any) -> Path:
    """Every rank calls this: its data position, counters and RNG go into the checkpoint beside rank 0's."""
    run.diagnostics.flush()  # the run folder's prompt history as of this checkpoint (rank 0 writes it)
    state = {"step": run.step, "engine_version": run.engine_version, "diagnostics": run.diagnostics.state_dict()}
    rank_state = {
        "generation": run.generation,
        "stream": run.stream.state_dict(),
        "reward_errors": run.reward_errors,
        "group_filter": None if run.group_filter is None else run.group_filter.state_dict(),
    }
    return save_checkpoint(
        run.run_dir / "checkpoints",
        run.step,
        run.model,
        run.optimizer,
        run.scheduler,
        state,
        keep=run.cfg.log.save_total_limit,
        rank_state=rank_state,
        rank=run.dist.rank,
        world=run.dist.world,
    )


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
        run.diagnostics.truncate_after(run.step)
    return path
