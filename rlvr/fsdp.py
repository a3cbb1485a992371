"""FSDP2 (``train.parallelism=fsdp``): the policy, and the reference model, sharded across ranks.

``fully_shard`` (torch.distributed.fsdp, DTensor parameters) is applied to every decoder layer and then
to the root (embeddings, final norm, LM head). Each rank then holds 1/world of every parameter, of its
gradient and of AdamW's two moments; a forward or backward all-gathers one layer's weights just before
that layer runs and frees them after, and gradients are reduce-scattered into shards. What that costs
next to DDP: the same reduce traffic plus one all-gather of the weights per forward and one per backward
(and one more for the old/reference log-prob passes); in exchange the largest trainable model grows with
the number of ranks. The training loop does not change: parameters are DTensors, clipping
(``clip_grad_norm_``), AdamW and the checkpoint (torch.distributed.checkpoint) understand them.

Mixed precision: when ``model.dtype`` is bfloat16/float16 the trainable shards are kept in float32 (master
weights, AdamW state; frozen weights stay in that dtype) and FSDP casts each gathered layer to that dtype
for the compute, reducing gradients in float32 (torchtitan's default). ``fsdp_cpu_offload`` keeps the
shards in CPU memory.

Rollouts need whole weights: the native and hf engines run on a plain copy of the model
(`GatheredEngine`), refreshed from the shards by one all-gather per parameter at each weight sync (all
ranks together, so rank 0's held-out evaluation still finds it ready) and freed as soon as the sharded
model forwards again (the old/ref log-prob pass or the update), so the copy and the update's gradients
and activations are never in memory together. Engines that keep their own weights (vLLM, a server) are
handed the gathered copy's tensors through their ``load_weights``, and the copy is freed right after.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rlvr.rollout.base import Completion, RolloutEngine, SamplingParams


_COMPUTE_DTYPE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # sharded model -> its compute dtype


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks, named by transformers' ``_no_split_modules`` (LlamaDecoderLayer, ...)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # through a PEFT wrapper
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"train.parallelism=fsdp: {type(base).__name__} names no decoder-layer class "
            "(_no_split_modules), so there is nothing to shard layer by layer; use "
            "train.parallelism=ddp for this model."
        )
    return layers


def shard(
    model: torch.nn.Module, device: torch.device, cpu_offload: bool = False, trainable: bool = True
) -> torch.nn.Module:
    """``fully_shard`` every decoder layer, then the root, over all ranks (in place; returns `model`).

    The trainable parameters of a model loaded in bfloat16/float16 are first upcast to float32 (master
    weights: a full float32 copy of them per rank for a moment, before the shards are cut) and compute in
    the load dtype; frozen parameters (the reference model, LoRA's base weights) stay in their dtype:
    nothing updates them, so a float32 copy would only double their shards (FSDP2 needs one dtype among
    the trainable parameters only). Every rank must hold the same weights here:
    they do, since each loaded the same files and drew LoRA's random init from the same seed.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    dtype = next(model.parameters()).dtype
    mp = MixedPrecisionPolicy()
    if trainable and dtype != torch.float32:
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
        for b in model.buffers():  # as model.float() would (rotary tables): the compute is as before
            if b.is_floating_point():
                b.data = b.data.float()
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        _COMPUTE_DTYPE[model] = dtype
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5; older: the next name
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if trainable and checkpointing:
        # Activation checkpointing per decoder layer, non-reentrant: the reentrant form reruns the
        # forward outside autograd, where FSDP2's gather/free hooks for the recompute do not fire.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # pin_memory makes the host<->device copies asynchronous; there is no device to copy to on CPU.
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if cpu_offload else OffloadPolicy()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    return model


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype forwards run in: the load dtype `shard` kept as FSDP's compute dtype, else the
    parameters' own."""
    return _COMPUTE_DTYPE.get(model) or next(model.parameters()).dtype


def full_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    """Each parameter whole, one at a time: an all-gather per DTensor (every rank must iterate the same
    names in the same order), plain tensors as they are. Peak extra memory: one full parameter."""
    for name, t in named:
        yield name, t.full_tensor() if isinstance(t, DTensor) else t


class GatheredEngine:
    """The rollout engine of a sharded policy (see the module docstring). Same protocol as the engine it
    wraps, which is built over a plain full copy of the policy; `load_weights` is called by every rank
    after each update (the trainer's weight sync) and gathers the shards into that copy.

    An engine that samples from the module it is given (native, hf) keeps the copy until the trainer's
    next forward. One that keeps its own weights (vLLM colocated or as a server, a reloading OpenAI
    server) is then handed the copy's tensors (or reads the copy: vLLM server mode pushes
    ``self.model``, a LoRA policy saves its adapter from it, a stale server exports it), and the copy
    is freed right after: such engines get whole weights from the sharded state with no change to them.
    """

    def __init__(self, model: torch.nn.Module, make: Callable[[torch.nn.Module], RolloutEngine]):
        """`model` is the full policy *before* it is sharded; `make` builds the real engine over a model."""
        # The copy's parameters share the loaded tensors instead of duplicating them: sharding then rebinds the
        # policy's parameters to new shard storage and leaves these alone (nothing writes into them in place),
        # so until the first update the copy costs nothing beyond the weights loaded anyway. A deep copy made
        # each rank hold the weights twice plus its shards while it started (9.9 GiB per rank for 1.7B LoRA).
        shared = {id(p): torch.nn.Parameter(p.data, requires_grad=False) for p in model.parameters()}
        self._copy = copy.deepcopy(model, shared).eval().requires_grad_(False)
        self._params = dict(self._copy.named_parameters())
        self.inner = make(self._copy)
        self.samples_live_policy = self.inner.samples_live_policy
        self._ready = True  # the copy holds the loaded weights until the first update
        # Free the copy when the policy forwards next (fully_shard keeps this hook): by then the batch
        # is sampled, and the update's forward and backward want the memory.
        model.register_forward_pre_hook(lambda *_: self.release())

    def release(self) -> None:
        if not self._ready:
            return
        with torch.no_grad():
            for p in self._params.values():
                p.data = p.data.new_empty(0)
        self._ready = False

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        with torch.no_grad():
            for name, full in full_tensors(named_tensors):
                p = self._params[name]
                p.data = full.to(device=p.device, dtype=p.dtype, copy=True)
        self._ready = True
        if not self.samples_live_policy:  # push on; the engine holds its own weights from here
            self.inner.load_weights((n, p.detach()) for n, p in self._params.items())
            self.release()

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        if self.samples_live_policy and not self._ready:
            raise RuntimeError(
                "the sharded policy's rollout copy was released by a forward of the trainer and not "
                "gathered again: sample only after the trainer's weight sync (engine.load_weights)."
            )
        return self.inner.generate(prompt_ids, n, sampling)

    def close(self) -> None:
        """The engine's own close, and the copy freed: the run's final save gathers the weights whole on rank 0,
        which beside the copy and the shards was the run's largest resident set (9.9 GiB on rank 0 for 1.7B LoRA
        on 2 ranks, against 6.7 on rank 1)."""
        self.inner.close()
        self.release()

    def __getattr__(self, name: str) -> Any:  # the engine's own attributes (receives_weights, policy_lag, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
