"""Plain constructors of what the loop in train.py trains: tokenizer, model, optimizer, schedule.

No registries: anyone copying the loop can swap one of these. What the run writes to its folder
(header, metric sinks, phase timings) is in ``rlvr.diagnostics.sinks``.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from rlvr import core
from rlvr.config import AlgoConfig, Config, attention_implementation, stale_sampler_problem
from rlvr.rollout.common import FasterOf, one_thread_suits, torch_threads

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(path: str) -> str:
    if path == "tiny":
        from rlvr.models import tiny_model_path

        return str(tiny_model_path())
    from rlvr.models.gguf import resolve_gguf

    return resolve_gguf(path) or path  # a .gguf file or a fetched model's name -> its converted folder


def cannot_load(what: str, path: str, err: Exception) -> OSError:
    """One clear error for a model or tokenizer that is neither a folder nor reachable on the hub."""
    if not os.path.isdir(path) and os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return OSError(
            f"cannot load {what} {path!r}: it is not a local folder, and HF_HUB_OFFLINE=1 forbids downloading it "
            f"from the hub (it is not in the local cache). Download it first (`hf download {path}`) or set "
            "model.path to a local folder."
        )
    return OSError(
        f"cannot load {what} {path!r}: {err}\nGive a local folder with config.json and weights, "
        "'tiny' for the shipped model, or a hub id on a machine that can reach the hub."
    )


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(resolve_model_path(path))
    except OSError as e:
        raise cannot_load("the tokenizer of", path, e) from None
    if tok.pad_token is None:  # many base models ship without one; pad positions are masked anyway
        tok.pad_token = tok.eos_token
    return tok


def load_model(cfg: Config, device: torch.device, trainable: bool = True) -> torch.nn.Module:
    """A Hugging Face causal LM from a local folder, the shipped tiny model, or the hub."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(cfg.model.path)
    kwargs: dict[str, Any] = {"dtype": _DTYPES[cfg.model.dtype], "trust_remote_code": cfg.model.trust_remote_code}
    if cfg.model.attn_implementation:
        kwargs["attn_implementation"] = cfg.model.attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as e:
        raise cannot_load("model", cfg.model.path, e) from None
    attention = attention_implementation(cfg, device.type, getattr(model.config, "hidden_size", None))
    if attention and attention != getattr(model.config, "_attn_implementation", None):
        model.set_attn_implementation(attention)  # rlvr's choice where the default measured slow (its docstring)
    model.to(device)
    if not trainable:
        model.eval().requires_grad_(False)
        return model
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if cfg.model.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lc = cfg.model.lora
        model = get_peft_model(
            model,
            LoraConfig(
                r=lc.r,
                lora_alpha=lc.alpha,
                lora_dropout=lc.dropout,
                target_modules=lc.target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    model.train()
    return model


class UpdateThreads(FasterOf):
    """The torch threads of the trainer's passes (``train.update_threads``): one setting (an int, or None for
    torch's own), or, for ``auto`` on a small CPU model, one thread and torch's threads chosen between by the
    update phase's time (:class:`rlvr.rollout.common.FasterOf`). Such a model's update ran 1.2x faster on two
    threads than on one on a quiet 2-core machine and 4-14x slower on a loaded one (a descheduled sibling thread
    stalls every op), so neither is right everywhere."""

    @contextlib.contextmanager
    def applied(self, measure: bool = False) -> Iterator[None]:
        """The block on this step's threads; ``measure``: the block is the step's update phase (timed, and the
        step counted)."""
        threads, start = self.current(), time.perf_counter()
        with torch_threads(threads):
            yield
        if measure:
            self.record(time.perf_counter() - start)


def update_threads(cfg: Config, model: torch.nn.Module, device: torch.device) -> UpdateThreads:
    """``train.update_threads`` resolved for this model."""
    setting = cfg.train.update_threads
    if setting != "auto":
        return UpdateThreads([setting])
    if device.type == "cpu" and one_thread_suits(model) and torch.get_num_threads() > 1:
        return UpdateThreads([1, None])
    return UpdateThreads([None])


def load_reference(cfg: Config, device: torch.device, run_dir: Path, rank: int = 0) -> torch.nn.Module | None:
    """The frozen reference model: None with beta = 0 (TRL's default: nothing to load) and with LoRA (the base
    model with the adapter switched off is the reference). With train.ref_offload its weights wait in a file
    between reference passes (rlvr.offload.park)."""
    if cfg.algo.beta == 0 or cfg.model.lora.enabled:
        return None
    ref_model = load_model(cfg, device, trainable=False)
    if cfg.train.ref_offload:
        from rlvr.offload import park, scratch_file

        park(ref_model, scratch_file(cfg.train.optim_offload_dir, run_dir, "reference", rank))
    return ref_model


def build_optimizer(
    cfg: Config, model: torch.nn.Module, run_dir: Path | None = None, rank: int = 0
) -> torch.optim.Optimizer:
    """``run_dir`` and ``rank`` place train.optim_offload's scratch file (one per process)."""
    t = cfg.train
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(
        lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_epsilon, weight_decay=t.weight_decay
    )
    if t.optim_offload:
        if any(isinstance(p, DTensor) for p in params):
            raise ValueError(
                "train.optim_offload=true cannot stream FSDP's sharded parameters: use train.fsdp_cpu_offload=true "
                "to keep the shards and AdamW state in host memory instead"
            )
        from rlvr.offload import DiskAdamW, scratch_file

        if t.grad_offload and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise ValueError(
                "train.grad_offload=true runs in one process: DDP averages gradients in memory. Drop it, or run "
                "one process"
            )
        folder = run_dir or Path(cfg.log.output_dir)
        path = scratch_file(t.optim_offload_dir, folder, "optimizer-moments", rank)
        grads = scratch_file(t.optim_offload_dir, folder, "gradients", rank) if t.grad_offload else None
        return DiskAdamW(params, path, **kwargs, fused=t.optim == "adamw_torch_fused", grads_path=grads)
    if t.optim == "adamw_torch_8bit":  # 8-bit moments: 2 bytes/parameter of Adam state instead of 4 (bf16) or 8
        try:
            from torchao.optim import AdamW8bit
        except ImportError:
            raise ImportError(
                "train.optim=adamw_torch_8bit needs torchao: `pip install torchao`, or set train.optim=adamw_torch"
            ) from None
        return AdamW8bit(params, **kwargs)
    # Fused: one vectorised pass over p, grad, m, v per parameter instead of ~10 elementwise kernels
    # (AdamW's step was a quarter of the update on CPU). DTensor shards (FSDP2) take the foreach path,
    # which handles them on every backend.
    fused = t.optim == "adamw_torch_fused" and not any(isinstance(p, DTensor) for p in params)
    return torch.optim.AdamW(params, **kwargs, fused=True) if fused else torch.optim.AdamW(params, **kwargs)


def build_scheduler(cfg: Config, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """Multiplier on the peak LR per optimizer step; a LambdaLR so its state is a plain step count."""
    total, kind = cfg.train.max_steps, cfg.train.lr_scheduler_type
    warmup = math.ceil(cfg.train.warmup_ratio * total)

    def factor(step: int) -> float:
        if kind != "constant" and step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_loss_settings(algo: AlgoConfig) -> core.LossSettings:
    """The config's loss choices as ``rlvr.core``'s plain settings (core takes no config objects)."""
    return core.LossSettings(
        loss_type=algo.loss_type,
        beta=algo.beta,
        epsilon=algo.epsilon,
        epsilon_high=algo.epsilon_high,
        delta=algo.delta,
        importance_sampling_level=algo.importance_sampling_level,
        kl_estimator=algo.kl_estimator,
        kl_bias_correction=algo.use_bias_correction_kl,
        sapo_temperature_pos=algo.sapo_temperature_pos,
        sapo_temperature_neg=algo.sapo_temperature_neg,
        top_entropy_quantile=algo.top_entropy_quantile,
    )


def _samples_fast_in_bf16(model: torch.nn.Module, on_gpu: bool) -> bool:
    """Whether the native engine should sample a bf16 mixed-precision policy in bfloat16: at the precision
    it trains in (as TRL's bf16 generation does), where that is the fast way. On a GPU, always. On a CPU,
    where the C decode kernel runs the model and has AVX512-BF16: bfloat16 weights there halve the bytes a
    decode step reads (SmolLM2-135M's rollout 5.85 -> 2.95 s a step). Elsewhere on a CPU the float32 kernel stays:
    it measured ~8x less CPU time than the bf16 PyTorch decoder on a 25M Llama
    (engine_options.compute_dtype=bfloat16 still asks for the latter)."""
    if on_gpu:
        return True
    from rlvr.rollout import cpu_kernel, native

    return native.kernel_unsupported(model) is None and cpu_kernel.bf16_fast()


def build_engine(cfg: Config, model: torch.nn.Module, tokenizer: Any, run_dir: Path) -> Any:
    """The rollout engine of ``rollout.backend``; refuses a stale sampler the config did not allow."""
    from rlvr.rollout import engine_class, make_engine

    options = dict(cfg.rollout.engine_options)
    on_gpu = next(model.parameters()).device.type == "cuda"
    if cfg.train.mixed_precision == "bf16" and cfg.rollout.backend == "native" and _samples_fast_in_bf16(model, on_gpu):
        options.setdefault("compute_dtype", "bfloat16")
    if "export_dir" in inspect.signature(engine_class(cfg.rollout.backend, options)).parameters:
        options.setdefault("export_dir", str(run_dir / "policy-exports"))  # a reloading server's policy exports
        Path(options["export_dir"]).mkdir(parents=True, exist_ok=True)
    engine = make_engine(cfg.rollout.backend, model, tokenizer, **options)
    stale = stale_sampler_problem(
        cfg.rollout.backend, options, cfg.rollout.allow_stale_sampler, receives_weights=engine.receives_weights
    )  # options may have changed it
    if stale:
        raise ValueError(stale)
    return engine
