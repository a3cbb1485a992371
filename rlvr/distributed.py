"""Many processes through plain torch.distributed: one rank per process, launched by ``torchrun``.

``torchrun --nproc_per_node=K -m rlvr.cli train ...`` sets RANK, WORLD_SIZE and LOCAL_RANK; `init`
reads them and joins the process group (gloo on CPU, nccl on CUDA). Without them (a plain ``rlvr
train``) nothing is initialised, every helper below is a no-op and the loop is bitwise the
single-process one. There is no cluster layer: each rank runs the same loop on its own prompts,
DDP averages the gradients (or FSDP2 shards the model, ``train.parallelism=fsdp``, rlvr/fsdp.py),
and the few collectives the loop needs live here, each with its cost. docs/scaling.md: the user's view.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def init() -> tuple[Dist, torch.device]:
    """Join the process group torchrun describes (env vars), and pick this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if world == 1:
        return Dist(), torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"process {rank} has local rank {local_rank} but this node has {torch.cuda.device_count()} GPUs: "
                "rlvr runs one process per GPU. Launch with torchrun --nproc_per_node at most the GPU count, or "
                "hide the GPUs (CUDA_VISIBLE_DEVICES='') to run CPU processes with gloo."
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # nccl's object collectives run on the current device
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        # device_id binds nccl's communicator to this rank's GPU (barriers then need no guess).
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    return Dist(rank, world, local_rank), device


def close() -> None:
    if dist.is_initialized():
        dist.barrier()  # rank 0 may still be writing the final model: nobody leaves before it is done
        dist.destroy_process_group()


def leave(code: int = 0) -> None:
    """End a rank of a finished multi-process run without the interpreter's teardown.

    Every result is written and the process group destroyed by now, yet a rank can still die in
    interpreter finalization: objects that outlive `close` (DDP's reducer, the optimizer, gloo's
    transport) are then freed in arbitrary order while C++ threads of the collective backend still
    exist, and a rank aborts ("terminate called without an active exception", SIGABRT) now and then
    under load, which torchrun reports as a failed run. So a rank runs the exit hooks that matter
    (atexit: checker pools, logging), flushes its streams and leaves with os._exit. A one-process
    run never comes here and exits normally.
    """
    import atexit
    import sys

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _comm_device() -> torch.device:
    """Where a backend's tensors must live: nccl only moves CUDA tensors, gloo CPU ones."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (a copy, on x's device; one small all-reduce). Identity in one process."""
    if not dist.is_initialized():
        return x
    y = x.to(_comm_device(), copy=True)
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y.to(x.device)


def all_gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0 (rank order). All ranks must pass the same shape:
    they do, since every rank keeps exactly its share of whole groups. One all-gather of x.numel()·world."""
    if not dist.is_initialized():
        return x
    y = x.to(_comm_device()).contiguous()
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, y)
    return torch.cat(parts).to(x.device)


def gather_to_main(obj: Any) -> list[Any] | None:
    """Every rank's object on rank 0 (rank order), None elsewhere. Pickles obj: one gather of a few
    kB per completion, once per generation batch; cheap next to sampling them."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def wrap(
    model: torch.nn.Module, d: Dist, device: torch.device, parallelism: str = "ddp", cpu_offload: bool = False
) -> torch.nn.Module:
    """The module the update forwards through: DDP over `model`, or `model` sharded in place by FSDP2
    (``parallelism="fsdp"``, rlvr/fsdp.py), with several ranks; `model` itself in one.

    DDP broadcasts rank 0's weights once here, then all-reduces (averages) gradients in buckets
    during backward: one all-reduce of every trainable parameter per optimizer step (with ``no_sync``
    on all but the last micro-batch of a gradient-accumulation window). ``broadcast_buffers=False``:
    a causal LM's buffers (rotary frequencies) are constants, so the per-forward broadcast would
    only cost time. The rollout engine and the no-grad log-prob passes use the unwrapped `model`
    (under FSDP the sharded `model` is both, and the engine samples from a gathered copy).
    """
    if not d.enabled:
        return model
    if parallelism == "fsdp":
        from rlvr import fsdp

        return fsdp.shard(model, device, cpu_offload=cpu_offload)
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)


def wrap_reference(
    ref_model: torch.nn.Module | None, d: Dist, device: torch.device, parallelism: str = "ddp"
) -> torch.nn.Module | None:
    """The frozen reference model (beta > 0): sharded like the policy under FSDP (its forward gathers
    layer by layer, so every rank must run the same number of reference passes: they do, since ranks
    keep the same number of groups); a plain full copy on every rank otherwise."""
    if ref_model is None or not d.enabled or parallelism != "fsdp":
        return ref_model
    from rlvr import fsdp

    return fsdp.shard(ref_model, device, trainable=False)


def rollout_engine(model: torch.nn.Module, make: Any, d: Dist, parallelism: str = "ddp") -> Any:
    """`make(model)`, the rollout engine; under FSDP with several ranks, one that samples from a gathered
    full copy of the policy (`model` must not be sharded yet) and frees it while the trainer works."""
    if not d.enabled or parallelism != "fsdp":
        return make(model)
    from rlvr.fsdp import GatheredEngine

    return GatheredEngine(model, make)


def reduce_step_metrics(per_rank: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Optimizer-step metrics of every rank -> one list, each key averaged over the ranks that have it.
    Ranks take the same optimizer steps, so the lists line up; grad_norm and learning_rate are the
    same on every rank after DDP's all-reduce, and the mean leaves them unchanged."""
    out = []
    for steps in zip(*per_rank):
        keys = dict.fromkeys(k for s in steps for k in s)
        out.append({k: sum(s[k] for s in steps if k in s) / sum(1 for s in steps if k in s) for k in keys})
    return out


def reduce_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Per-rank scalars (DAPO counters, phase timings) -> one dict describing the whole generation
    batch: DAPO's counts add up over ranks, its round count is the most any rank needed, the rest
    (timings) is the mean over ranks."""
    out = {}
    for k in dict.fromkeys(k for m in per_rank for k in m):
        vals = [m[k] for m in per_rank if k in m]
        if k == "dapo/rounds":
            out[k] = max(vals)
        elif k.startswith("dapo/"):
            out[k] = sum(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out


def sum_counts(per_rank: list[dict[str, int]]) -> dict[str, int]:
    """Per-rank counters (reward-function errors) -> totals."""
    out: dict[str, int] = {}
    for m in per_rank:
        for k, v in m.items():
            out[k] = out.get(k, 0) + v
    return out


def common_count(n: int) -> int:
    """The smallest of every rank's n (one scalar all-reduce). Ranks must run the same number of
    micro-batches and optimizer steps or DDP's all-reduces would pair up wrongly and hang, so a rank
    whose DAPO refill came up short makes the others cut their batch to the same number of groups."""
    if not dist.is_initialized():
        return n
    t = torch.tensor([n], dtype=torch.long, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def no_sync(module: torch.nn.Module, sync: bool) -> Any:
    """Skip the gradient all-reduce (DDP's ``no_sync()``) or reduce-scatter (FSDP2's
    ``set_requires_gradient_sync(False)``) unless this backward must do it: gradients of the first GA-1
    micro-batches accumulate locally and are averaged once, with the last one's. Under FSDP2 the
    accumulating gradients are unsharded (a full gradient per rank until the synced backward)."""
    if hasattr(module, "set_requires_gradient_sync"):
        return _fsdp_gradient_sync(module, sync)
    if sync or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()


@contextlib.contextmanager
def _fsdp_gradient_sync(module: Any, sync: bool) -> Any:
    module.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's name and raw bytes: equal digests = bitwise equal weights. Reads
    every parameter once (about a second per GB)."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_in_sync(model: torch.nn.Module, d: Dist) -> list[str] | None:
    """Every rank's weights digest on rank 0 (None elsewhere); raises there if the ranks diverged,
    which DDP should make impossible (it would mean a rank skipped an all-reduce). Nothing to check,
    and nothing computed, in one process or under FSDP."""
    if not d.enabled or any(isinstance(p, DTensor) for p in model.parameters()):
        return None  # one process, or FSDP: each shard exists once, so there is nothing to diverge
    digests = gather_to_main(weights_digest(model))
    if digests is not None and len(set(digests)) > 1:
        raise RuntimeError(
            f"the {d.world} processes ended with different weights (digests {digests}); "
            "DDP keeps them equal, so a rank ran a different number of optimizer steps."
        )
    return digests
