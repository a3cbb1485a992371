"""The typed config tree: one documented field per option, validated at load, before any model loads.

Field names follow TRL's ``GRPOConfig`` wherever TRL has the option, with the same defaults, so a
TRL user can carry their numbers over; they are grouped into sections (``model``, ``data``,
``rewards``, ``algo``, ``rollout``, ``train``, ``dapo``, ``log``). On the command line a dotted key
sets a nested field (``algo.loss_type=gspo``); a bare TRL name that lives in exactly one section is
routed there (``loss_type=gspo`` works too).

The defaults are the CPU default job: the shipped tiny model on the built-in arithmetic task.
Where those differ from TRL's defaults (learning rate, batch shape, completion length) the field's
description says so.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator


class ConfigError(ValueError):
    """A config that cannot run. The message names every problem and how to fix it."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def registered_choices(field: str) -> tuple[str, ...]:
    """The valid values of an algorithm field, read from the registry that implements them (``rlvr.core``):
    registering a new estimator or mode there makes it valid here, with no config edit."""
    from rlvr import core

    return tuple(
        {
            "loss_type": core.loss_type_names(),
            "importance_sampling_level": core.IMPORTANCE_SAMPLING_LEVELS,
            "scale_rewards": core.SCALE_REWARDS,
            "advantage_estimator": core.ADVANTAGE_ESTIMATORS.names(),
            "kl_estimator": core.KL_ESTIMATORS.names(),
            "sampler_importance_sampling_mode": core.SAMPLER_IS_MODES,
        }[field]
    )


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


class LoraConfig(_Section):
    enabled: bool = Field(False, description="Train a LoRA adapter (peft) instead of all weights.")
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA alpha (scaling = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] | str = Field(
        "all-linear", description="Modules to adapt: a list of names or peft's 'all-linear'."
    )


class ModelConfig(_Section):
    path: str = Field(
        "tiny",
        description="Model to train: 'tiny' (the model shipped with rlvr), a local Hugging Face folder, "
        "a .gguf file (converted once and cached), 'smollm2' (after `rlvr models get smollm2`), "
        "or a hub id (needs the hub or a warm cache; set HF_HUB_OFFLINE=1 to forbid downloads).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Parameter dtype. bfloat16 halves memory; float32 is exact on CPU."
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory, ~30% more compute."
    )
    trust_remote_code: bool = Field(False, description="Passed to transformers' from_pretrained.")
    attn_implementation: str | None = Field(
        None,
        description="Passed to from_pretrained ('sdpa', 'eager', 'flash_attention_2', ...). Unset: transformers' "
        "default (SDPA), except 'eager' on a CPU under train.mixed_precision=bf16 or for a model under hidden size "
        "512, where PyTorch's CPU flash attention was the slow part of the update (eager: 9-17% faster updates, "
        "and N x heads x T x S attention probabilities per layer kept for backward, which the memory plan "
        "counts; rlvr.config.attention_implementation).",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)


# Below this hidden size PyTorch's CPU flash attention costs more per call than the arithmetic it does.
EAGER_ATTENTION_BELOW_HIDDEN = 512


def attention_implementation(cfg: Config, device_type: str, hidden_size: int | None) -> str | None:
    """The attention the policy runs: model.attn_implementation, else transformers' default (SDPA) but where it
    measured slow, on a CPU:
    - under bf16 autocast, PyTorch's flash attention for CPU ran the update's attention at a few GFLOP/s (16% of
      a SmolLM2-135M update at 8 x 128 completion tokens over a 100-token prompt, 19% of a 27M Llama's at
      16 x 64 over 64); the matmul form (eager: bf16 matmuls, softmax in float32) made those updates 9% and
      17% faster;
    - for a model under hidden size 512, whose ops take microseconds, its fixed cost per call (0.7 ms forward
      and 1.4 ms backward per layer and pass on the shipped tiny model: a third of the default job's update)
      is the attention's cost; eager's few small ops made that update ~16% faster on two threads.
    In float32 at hidden 512 and 576 the two measured the same, and SDPA keeps no attention probabilities for
    backward (eager keeps N x heads x T x S per layer, which the memory plan counts), so it stays there."""
    if cfg.model.attn_implementation:
        return cfg.model.attn_implementation
    if device_type != "cpu":
        return None
    small = hidden_size is not None and hidden_size < EAGER_ATTENTION_BELOW_HIDDEN
    return "eager" if cfg.train.mixed_precision == "bf16" or small else None


class DataConfig(_Section):
    task: str | None = Field(
        "arithmetic",
        description="Built-in task to train on (see `rlvr.tasks`); ignored when `path` is set.",
    )
    task_options: dict[str, Any] = Field(
        default_factory=dict, description="Options of the built-in task, e.g. {digits: 3, operations: '+-'}."
    )
    path: str | None = Field(
        None,
        description="A prompt-only dataset: JSONL, CSV, Parquet, a `datasets` folder saved to disk, or "
        "a GSM8K-format file. Every column besides the prompt is passed to the reward functions.",
    )
    format: Literal["auto", "jsonl", "json", "csv", "parquet", "datasets", "gsm8k"] = Field(
        "auto",
        description="File format; 'auto' infers it from the name. 'gsm8k' reads question/answer rows "
        "and keeps the final answer after '####' as the gold.",
    )
    split: str | None = Field(None, description="Split to read from a `datasets` folder.")
    prompt_template: str | None = Field(
        None,
        description="Rewrite each prompt with a Python format string over the row's columns, e.g. "
        "'{prompt}\\nPut your final answer within \\\\boxed{{}}.'",
    )
    system_prompt: str | None = Field(None, description="Make prompts chat messages with this system message.")
    chat: bool = Field(False, description="Send plain-text prompts as a user chat message (chat template applied).")
    prompt_column: str = Field("prompt", description="Column that holds the prompt (text or chat messages).")
    answer_column: str | None = Field(None, description="Column holding the gold answer, renamed to 'answer'.")
    eval_path: str | None = Field(
        None,
        description="Held-out prompts for evaluation (same formats as `path`). Unset with `path` set: "
        "`eval_fraction` of the file is held out instead.",
    )
    eval_fraction: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="Without `eval_path`: the fraction of `path`'s distinct prompts held out "
        "for evaluation and never trained on (chosen by a stable hash of the prompt; 0 = train on every row).",
    )
    eval_size: int = Field(200, ge=0, description="Number of held-out prompts evaluated (0 = no evaluation).")
    shuffle: bool = Field(True, description="Shuffle a file dataset each epoch (seeded by train.seed).")


class RewardSpec(_Section):
    name: str = Field(
        description="A built-in reward (REWARDS registry), 'module:function' (a module in the working "
        "directory is found too) or 'path/to/file.py:function'."
    )
    weight: float = Field(1.0, description="Weight in the weighted sum of rewards (TRL's reward_weights).")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options for a built-in reward.")
    role: Literal["correctness", "format", "length", "other"] | None = Field(
        None,
        description="What the reward is for (diagnostics, docs/diagnostics.md). None = the function's own "
        "declaration, else inferred from the first step and printed in the run header.",
    )


class AlgoConfig(_Section):
    loss_type: str = Field(
        "dapo",
        description="Objective preset: grpo, bnpo, dr_grpo, dapo, gspo, cispo, sapo, luspo (docs/algorithms.md). "
        "'dapo' here is DAPO's token-level loss aggregation only; DAPO's dynamic sampling is the separate "
        "`dapo:` section.",
    )
    beta: float = Field(0.0, ge=0.0, description="KL coefficient. 0 = no reference model is loaded (TRL default).")
    epsilon: float = Field(0.2, gt=0.0, description="Lower clip range: ratio clipped at 1 - epsilon.")
    epsilon_high: float | None = Field(
        None,
        gt=0.0,
        description="Upper clip range (DAPO clip-higher, 0.28 in the paper). None = epsilon. "
        "For cispo it is the absolute cap on the ratio, eps_max (TRL's meaning; 5.0 is the usual value).",
    )
    delta: float | None = Field(None, gt=1.0, description="Two-sided clip: cap the unclipped ratio at delta.")
    importance_sampling_level: str | None = Field(
        None,
        description="Importance ratio per token or per sequence (GSPO's length-normalised ratio); "
        "None = the preset's own level (sequence for gspo and luspo, token otherwise).",
    )
    scale_rewards: str = Field(
        "group", description="Divide centred rewards by the group std, the batch std, or not at all (Dr. GRPO)."
    )
    advantage_estimator: str = Field("grpo", description="Baseline: group mean (grpo) or leave-one-out mean (rloo).")
    num_iterations: int = Field(1, ge=1, description="Updates per generation batch (PPO's mu).")
    mask_truncated_completions: bool = Field(
        False, description="Exclude truncated completions from the loss (DAPO overlong filtering)."
    )
    top_entropy_quantile: float = Field(
        1.0, gt=0.0, le=1.0, description="Train only on the top-q highest-entropy tokens (1.0 = all)."
    )
    kl_estimator: str = Field("k3", description="Per-token KL estimator (Schulman): k1, k2 or k3.")
    use_bias_correction_kl: bool = Field(True, description="Multiply the k3 KL by the importance ratio (TRL default).")
    sampler_importance_sampling_correction: bool = Field(
        True,
        description="Correct for sampler/trainer log-prob mismatch with truncated importance sampling "
        "(TRL's vllm_importance_sampling_correction). Only acts when the engine reports log-probs "
        "that can differ from the trainer's (vLLM, stale servers).",
    )
    sampler_importance_sampling_mode: str = Field(
        "sequence_mask",
        description="How the sampler importance weights are applied: token_truncate, token_mask, "
        "sequence_truncate or sequence_mask (TRL's vllm_importance_sampling_mode).",
    )
    sampler_importance_sampling_clip_max: float | None = Field(3.0, description="Upper bound on the weights.")
    sampler_importance_sampling_clip_min: float | None = Field(None, description="Lower bound (mask modes).")
    sapo_temperature_pos: float = Field(1.0, gt=0.0, description="SAPO gate temperature for positive advantages.")
    sapo_temperature_neg: float = Field(1.05, gt=0.0, description="SAPO gate temperature for negative advantages.")

    @field_validator(
        "loss_type",
        "importance_sampling_level",
        "scale_rewards",
        "advantage_estimator",
        "kl_estimator",
        "sampler_importance_sampling_mode",
    )
    @classmethod
    def _registered(cls, v: str | None, info: ValidationInfo) -> str | None:
        names = registered_choices(info.field_name)
        if v is not None and v not in names:
            raise ValueError(f"unknown {info.field_name} {v!r}; valid choices: {', '.join(names)}")
        return v


class RolloutConfig(_Section):
    backend: str = Field("native", description="Rollout engine: hf, native, vllm, vllm-server, openai.")
    engine_options: dict[str, Any] = Field(default_factory=dict, description="Backend-specific options.")
    num_generations: int = Field(8, ge=2, description="Completions per prompt: the group size G.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (log-probs use it too).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    top_k: int = Field(0, ge=0, description="Top-k sampling (0 = off).")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Min-p sampling (0 = off).")
    repetition_penalty: float = Field(1.0, gt=0.0, description="Repetition penalty (1 = off).")
    max_completion_length: int = Field(
        8, ge=1, description="Max completion tokens (TRL default 512; 8 fits the default arithmetic task)."
    )
    max_prompt_length: int | None = Field(None, ge=1, description="Left-truncate longer prompts (None = never).")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    allow_stale_sampler: bool = Field(
        False,
        description="Allow an engine that cannot take new weights (an OpenAI-compatible server); the "
        "trainer then counts the policy lag and corrects with importance sampling.",
    )

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        from rlvr.rollout import ENGINE_NAMES

        if v not in ENGINE_NAMES:
            raise ValueError(f"unknown rollout backend {v!r}; valid choices: {', '.join(ENGINE_NAMES)}")
        return v


def stale_sampler_problem(
    backend: str, engine_options: dict, allow_stale_sampler: bool, receives_weights: bool | None = None
) -> str | None:
    """The one stale-sampler rule, read from the engine's declared ``receives_weights`` capability (its
    class's at config load; pass the built engine's own value to check again once it exists)."""
    if receives_weights is None:
        from rlvr.rollout import engine_class

        receives_weights = engine_class(backend, engine_options).receives_weights
    if receives_weights or allow_stale_sampler:
        return None
    return (
        f"rollout.backend={backend} cannot receive new weights after each step, so it samples from a stale "
        "policy; set rollout.allow_stale_sampler=true to accept that (the lag is logged as policy_lag and "
        "corrected by importance sampling; the openai engine's engine_options.reload_every=k bounds it), "
        "or use a backend that takes weights (native, hf, vllm)"
    )


class TrainConfig(_Section):
    learning_rate: float = Field(
        3e-4,
        gt=0.0,
        description="Peak learning rate. 3e-4 suits the shipped 0.34M-parameter model (1e-3 "
        "overshoots and accuracy falls back); TRL's 1e-6 suits billion-parameter models.",
    )
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field(
        "linear", description="Learning-rate schedule over max_steps (linear decay to 0, as TRL)."
    )
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of max_steps spent warming up.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2.")
    adam_epsilon: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping (global L2 norm).")
    per_device_train_batch_size: int = Field(
        256, ge=1, description="Completions per micro-batch (TRL's meaning). Must be a multiple of num_generations."
    )
    gradient_accumulation_steps: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    steps_per_generation: int | None = Field(
        None, ge=1, description="Micro-batches served by one generation batch (None = gradient_accumulation_steps)."
    )
    max_steps: int = Field(60, ge=1, description="Optimizer steps to run.")
    seed: int = Field(42, description="Seed for data order, sampling and initialisation.")
    num_threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads for torch (None = torch's default, one per core). Tiny models "
        "gain little from more threads, and a busy machine makes extra threads spin: 1 is often fastest.",
    )
    parallelism: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How several processes (torchrun) hold the model. ddp: every rank a full copy of "
        "weights, gradients and AdamW state (4x the weights in float32), gradients averaged once per step. fsdp: "
        "FSDP2, each decoder layer and the root sharded, so each rank keeps ~1/world of that, at the cost of "
        "gathering every layer's weights for each forward and backward; with model.dtype bfloat16/float16 the "
        "trainable weights are kept in float32 and only the compute runs in that dtype (frozen ones, e.g. LoRA's "
        "base, stay in that dtype). One process: both are the plain "
        "model. See docs/scaling.md.",
    )
    fsdp_cpu_offload: bool = Field(
        False,
        description="fsdp: keep the weight, gradient and AdamW shards in CPU memory and run the optimizer "
        "step there (frees accelerator memory; costs a host copy of every layer per forward and backward).",
    )

    update_threads: int | Literal["auto"] | None = Field(
        "auto",
        description="CPU threads for the trainer's forward and backward passes (update, old and reference log-probs). "
        "auto: for models with hidden_size < 512 on CPU, measured: every 100 steps start with 6 update phases taking "
        "turns on 1 thread and on torch's setting, and the rest run on the one with the lower median time; else "
        "torch's setting (None). A small model's ops take microseconds and OpenMP's fork/join per op costs as "
        "much; on a busy machine a descheduled sibling thread stalls every op: the shipped model's update measured "
        "4-14x faster on 1 thread than on 2 on a loaded 2-core box, and 1.2x slower on the same box quiet (57 vs "
        "48 ms). The rollout engine keeps its own threads.",
    )
    mixed_precision: Literal["no", "bf16"] = Field(
        "no",
        description="bf16: the policy's forward and backward (update, old and reference log-probs) run under "
        "bfloat16 autocast, weights, gradients and AdamW state stay float32 (TRL's bf16=true). Matmuls ~2-4x "
        "faster on CPUs with AVX512-BF16/AMX and on GPUs; log-probs carry bf16 rounding (~1e-2), so it is "
        "opt-in and float32 stays exact. The native engine samples in bf16 too on GPUs and, with bf16 copies "
        "of the weights in its C kernel, on CPUs with AVX512-BF16; elsewhere it samples in float32 (the "
        "mismatch/* metrics show the gap).",
    )
    optim: Literal["adamw_torch_fused", "adamw_torch", "adamw_torch_8bit"] = Field(
        "adamw_torch_fused",
        description="Optimizer (transformers' names). adamw_torch_fused (transformers' and so TRL's default): "
        "PyTorch's AdamW as one fused kernel per step, ~3x less CPU time than the per-parameter loop on CPU; "
        "the same update to float32 rounding. adamw_torch: the per-parameter (CPU) or foreach (CUDA) "
        "AdamW. adamw_torch_8bit: AdamW with block-wise 8-bit "
        "moments from torchao (`pip install torchao`): half the state of bf16 AdamW, a quarter of fp32; its step "
        "is torch.compile'd once per parameter shape (minutes on a small CPU) and the quantised moments change "
        "the trajectory slightly.",
    )
    optim_offload: bool = Field(
        False,
        description="Keep AdamW's moments in a file (optim_offload_dir) and stream them through each optimizer "
        "step in 16M-element chunks, instead of holding them in memory (ZeRO-Infinity's NVMe offload, on one "
        "machine): saves 2x the trainable weights' bytes (6.4 GiB for a 1.7B model in bf16), the weights come out "
        "bitwise the same, and each step reads and writes the moments once (the page cache absorbs it when "
        "memory is free; an NVMe disk serves 1.7B's ~13 GiB in seconds). For full fine-tuning on a small machine; "
        "not with adamw_torch_8bit or several FSDP processes (fsdp_cpu_offload there). See docs/memory.md.",
    )
    grad_offload: bool = Field(
        False,
        description="With optim_offload, keep the gradients in a file too: each gradient autograd accumulates is "
        "added to its slot in the file (the same additions micro-batches make in memory) and freed, and clipping "
        "and the optimizer step read them back; saves the trainable weights' bytes again (3.2 GiB at 1.7B bf16). "
        "Costs a read and write of the gradients per micro-batch (page cache or disk); the same weights bitwise. "
        "One process only (DDP averages gradients in memory). See docs/memory.md.",
    )
    ref_offload: bool = Field(
        False,
        description="Keep the reference model's weights (algo.beta > 0 with full fine-tuning) in a file "
        "(optim_offload_dir) and read them back for the reference log-prob pass only, so they are not held "
        "through the update, where memory peaks: saves the weights' bytes (3.2 GiB for a 1.7B model in bf16) at "
        "one read of them per generation batch; same log-probs. No effect with LoRA (the reference is the base "
        "model with the adapter off) or beta = 0. See docs/memory.md.",
    )
    optim_offload_dir: str | None = Field(
        None,
        description="Folder for the offloads' scratch files (None: the run folder); give a fast local disk with "
        "room for them: 2x the trainable weights' bytes for the moments, 1x for the gradients, the reference's "
        "weights (12.8 GiB in all at 1.7B bf16). They are deleted when the run ends; checkpoints keep a copy of the "
        "moments.",
    )
    shared_prompt_forward: bool = Field(
        True,
        description="Score the G completions of a group against one forward of their shared prompt (its keys "
        "and values cached, gradients flowing back through them) instead of G forwards over [prompt | completion]: "
        "same loss and gradients, (G-1)/G less prompt compute, in the update and the old/reference log-prob "
        "passes. Used where verified (Llama, Qwen2, Qwen3; sdpa/eager attention; no active dropout) when a "
        "micro-batch repeats a prompt; otherwise the one-forward path, with a warning. false: always one forward "
        "over [prompt | completion] per completion, as TRL does. See docs/architecture.md.",
    )
    length_bucket_pass_cost: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="With shared_prompt_forward: a micro-batch's completions are scored in passes grouped by "
        "length, each padded only to its own longest (EOS-stopped completions are mostly shorter than the "
        "longest). An extra pass costs its own overhead (one more forward and backward through every layer: the "
        "weights read again, every op dispatched again), priced here in token positions: a split is made when it "
        "saves more padded positions than this. auto: estimated from the model's size and device "
        "(rlvr.policy_logprobs.bucket_pass_cost; on CPU 64 for models of 27M parameters and up, ~300 for the "
        "shipped model, whose ops are dispatch-bound). 0: a pass per distinct length; a very large value: one "
        "pass padded to the longest, as without grouping. Same log-probs and gradients either way (float64 tests).",
    )
    group_packing: bool | Literal["auto"] = Field(
        "auto",
        description="With shared_prompt_forward: score each group of completions as one sequence [prompt | "
        "completion 1 | ... | completion G] whose attention mask lets each completion see the prompt and itself "
        "only: one pass per micro-batch, no copy of the prompt's keys and values per completion, no padding between "
        "completions; same log-probs and gradients (float64 tests). Its attention is dense in the group's length, so "
        "auto packs only where that scores no more query-key pairs than one forward per completion would and the "
        "estimate of its cost is lower (rlvr.policy_logprobs.packing_pays): short completions, as the shipped "
        "task's. true: wherever the pairs are within that bound (which the memory plan assumes); false: never.",
    )
    release_freed_memory: bool | Literal["auto"] = Field(
        "auto",
        description="CPU runs on Linux (glibc): allocations over 128 KiB are mapped from and returned to the "
        "system when freed (mallopt M_MMAP_THRESHOLD), so the resident set follows the tensors alive. glibc's "
        "default keeps freed blocks of up to 32 MiB in its heap for reuse, which raised the measured peak of a "
        "step 0.4-0.6 GiB over the tensors on the small benchmark (docs/memory.md). Costs a page fault per "
        "fresh page of a large allocation: the shipped model's update took ~2x the CPU time with it, a 27M "
        "model's 1.4x the wall time. auto: "
        "applied when memory binds, i.e. the plan's estimated peak is over half the free memory (or the "
        "check is skipped). Never applied when MALLOC_MMAP_THRESHOLD_ is set in the environment.",
    )
    memory_check: Literal["refuse", "warn", "skip"] = Field(
        "refuse",
        description="Before loading the model, estimate the run's peak memory (`rlvr plan`) and refuse "
        "to start when it exceeds the device's free memory ('warn': print the plan and start anyway; "
        "'skip': no estimate).",
    )

    @property
    def micro_batches_per_generation(self) -> int:
        """steps_per_generation resolved: micro-batches one generation batch is cut into."""
        return self.steps_per_generation or self.gradient_accumulation_steps

    @model_validator(mode="after")
    def _offloads_combine(self) -> TrainConfig:
        if self.fsdp_cpu_offload and self.parallelism != "fsdp":
            raise ValueError(
                "train.fsdp_cpu_offload=true offloads FSDP's shards, but train.parallelism is "
                f"{self.parallelism!r}: set train.parallelism=fsdp too, or drop the offload"
            )
        if self.ref_offload and self.parallelism == "fsdp":
            raise ValueError(
                "train.ref_offload=true parks the reference model's weights in a file, but train.parallelism=fsdp "
                "shards them: drop one (FSDP already keeps 1/world of the reference per process)"
            )
        if self.grad_offload and not self.optim_offload:
            raise ValueError(
                "train.grad_offload=true keeps the gradients in the offloaded optimizer's file: set "
                "train.optim_offload=true too"
            )
        if self.optim_offload and self.optim == "adamw_torch_8bit":
            raise ValueError(
                "train.optim_offload=true streams full-size AdamW moments from disk; train.optim=adamw_torch_8bit "
                "keeps quantised ones in memory: choose one (drop optim_offload, or set train.optim=adamw_torch_fused)"
            )
        return self


class DapoConfig(_Section):
    """DAPO's dynamic sampling and prompt skipping: which groups a generation batch keeps (batch assembly).
    Independent of the loss: `algo.loss_type=dapo` (the default preset) does not turn any of this on."""

    dynamic_sampling: bool = Field(
        False,
        description="Drop zero-spread groups and sample more prompts until the batch is full (DAPO's "
        "dynamic sampling; not the `dapo` loss preset).",
    )
    max_generation_rounds: int = Field(
        4, ge=1, description="Sampling rounds per batch before training on what there is."
    )
    oversample_factor: float = Field(1.0, ge=1.0, description="Prompts drawn per round, as a multiple of the need.")
    skip_solved_prompts: bool = Field(
        False, description="Skip prompts that were all-pass (or all-fail) the last `skip_after` times they were seen."
    )
    skip_after: int = Field(2, ge=1, description="Consecutive zero-spread outcomes before a prompt is skipped.")
    reprobe_fraction: float = Field(0.1, ge=0.0, le=1.0, description="Chance that a skipped prompt is probed again.")


class LogConfig(_Section):
    output_dir: str = Field(
        "runs/default",
        description="Run folder: config, metrics, samples, checkpoints. A folder that already holds "
        "a run is refused unless resume=true (continue it) or overwrite=true (replace it); it is locked while a run "
        "trains, so a second run into it is refused.",
    )
    logging_steps: int = Field(10, ge=1, description="Print a sample table and a metrics line every N steps.")
    save_steps: int = Field(50, ge=1, description="Checkpoint every N optimizer steps (and at the end).")
    save_total_limit: int | None = Field(2, ge=1, description="Keep only the newest N checkpoints.")
    eval_steps: int | None = Field(None, ge=1, description="Evaluate held-out accuracy every N steps.")
    eval_before_after: bool = Field(True, description="Evaluate held-out greedy accuracy before and after training.")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["tensorboard"], description="Extra metric sinks besides metrics.jsonl."
    )
    record_rollouts: bool = Field(True, description="Append every completion to the compressed rollout record.")
    shadow_grading: bool = Field(
        True,
        description="Grade every completion again with rlvr's strict checker when rows have a gold answer "
        "(what each reward paid to wrong answers; docs/diagnostics.md). Costs checker time only.",
    )
    samples_per_class: int = Field(2, ge=0, description="Sample completions shown per outcome class each log.")
    progress: bool = Field(True, description="Show a progress bar on the console.")


class Config(_Section):
    """A whole run."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rewards: list[RewardSpec] = Field(
        default_factory=list,
        description="Reward functions; empty = the built-in task's default rewards. Short "
        "forms: [math, myrewards:exact, path/to/file.py:fn] (weight 1 each); long: [{name: math, weight: 0.5}].",
    )
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    dapo: DapoConfig = Field(default_factory=DapoConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    resume: bool | str = Field(
        False,
        description="true = continue from the newest checkpoint in output_dir; a path = that checkpoint. "
        "Config changes are recorded in config-history.jsonl; a changed model or LoRA setting is refused.",
    )
    overwrite: bool = Field(
        False,
        description="Delete the run already in log.output_dir and start again (without it, rlvr refuses "
        "to write into a folder that holds a run).",
    )

    @field_validator("rewards", mode="before")
    @classmethod
    def _short_reward_forms(cls, v: Any) -> Any:
        from rlvr.reward_refs import normalise_reward_specs

        return normalise_reward_specs(v)

    @field_validator("rewards")
    @classmethod
    def _known_rewards(cls, specs: list[RewardSpec]) -> list[RewardSpec]:
        from rlvr.rewards.scoring import reward_names

        names = reward_names()
        for s in specs:
            if ":" not in s.name and s.name not in names:
                raise ValueError(
                    f"unknown reward {s.name!r}; valid built-in rewards: {', '.join(names)} "
                    "(or your own function as 'module:function' or 'path/to/file.py:function')"
                )
        return specs

    @model_validator(mode="after")
    def _consistent(self) -> "Config":
        g, t = self.rollout.num_generations, self.train
        steps_per_generation = t.micro_batches_per_generation
        problems = []
        if t.per_device_train_batch_size * steps_per_generation % g:
            problems.append(
                f"the generation batch (per_device_train_batch_size {t.per_device_train_batch_size} x "
                f"steps_per_generation {steps_per_generation}) must be divisible by rollout.num_generations {g}: "
                "each prompt's group must be whole"
            )
        if steps_per_generation % t.gradient_accumulation_steps:
            problems.append(
                f"train.steps_per_generation ({steps_per_generation}) must be a multiple of "
                f"gradient_accumulation_steps ({t.gradient_accumulation_steps})"
            )
        if self.data.path is None and self.data.task is None:
            problems.append("set data.path (a dataset file) or data.task (a built-in task)")
        if self.data.path is None and self.data.task is not None:
            from rlvr.tasks import TASKS

            if self.data.task not in TASKS:
                problems.append(f"unknown data.task {self.data.task!r}; valid choices: {', '.join(TASKS.names())}")
        if self.data.path is not None and not self.rewards:
            problems.append("a dataset from data.path needs `rewards:` (e.g. [{name: math}])")
        stale = stale_sampler_problem(
            self.rollout.backend, self.rollout.engine_options, self.rollout.allow_stale_sampler
        )
        if stale:
            problems.append(stale)
        from rlvr.core import LOSS_TYPES

        min_cap, algo = LOSS_TYPES.get(self.algo.loss_type).min_epsilon_high, self.algo
        if min_cap is not None and (algo.epsilon_high is None or algo.epsilon_high < min_cap):
            problems.append(
                f"loss_type {algo.loss_type} caps the ratio at epsilon_high (eps_max), which is {algo.epsilon_high}; "
                f"a cap below {min_cap:g} stops every token from learning. Set algo.epsilon_high (5.0 in "
                "MiniMax-M1/ScaleRL)"
            )
        if self.algo.epsilon >= 1.0:
            problems.append(f"algo.epsilon {self.algo.epsilon} must be < 1 (the ratio is clipped at 1 - epsilon)")
        if self.resume is not False and self.overwrite:
            problems.append(
                "resume and overwrite exclude each other: resume=true continues the run in "
                "log.output_dir, overwrite=true deletes it"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # ------------------------------------------------------------------ derived quantities
    @property
    def generation_batch_size(self) -> int:
        """Completions per generation batch (N = B·G), on one process."""
        return self.train.per_device_train_batch_size * self.train.micro_batches_per_generation

    @property
    def prompts_per_generation(self) -> int:
        """B: prompts sampled per generation batch."""
        return self.generation_batch_size // self.rollout.num_generations


# --------------------------------------------------------------------------------------------
# Loading: YAML + key=value overrides -> validated Config
# --------------------------------------------------------------------------------------------

_SECTIONS = ("model", "data", "algo", "rollout", "train", "dapo", "log")


def _section_fields() -> dict[str, list[str]]:
    """Bare field name -> sections that define it (for routing TRL's flat names)."""
    out: dict[str, list[str]] = {}
    for sec in _SECTIONS:
        for name in Config.model_fields[sec].annotation.model_fields:  # type: ignore[union-attr]
            out.setdefault(name, []).append(sec)
    return out


def _route_flat_key(key: str) -> str:
    """'loss_type' -> 'algo.loss_type' when the bare name lives in exactly one section."""
    head = key.split(".", 1)[0]
    if head in Config.model_fields:
        return key
    owners = _section_fields().get(head, [])
    if len(owners) == 1:
        return f"{owners[0]}.{key}"
    return key  # left as is: validation reports it as an unknown key with suggestions


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = _route_flat_key(key).split(".")
    node = tree
    for p in parts[:-1]:
        if not isinstance(node.get(p, {}), dict):
            raise ConfigError(f"cannot set {key!r}: {p!r} is not a section")
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict:
    """['algo.beta=0.04', 'rollout.stop=["\\n"]'] -> nested dict. Values are parsed as YAML scalars."""
    tree: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(
                f"override {item!r} is not of the form key=value (e.g. algo.loss_type=gspo or train.max_steps=200)"
            )
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(tree, key.strip(), value)
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _normalise_top_level(tree: dict) -> dict:
    """Route flat TRL keys found at the top level of a YAML file into their sections."""
    out: dict = {}
    for k, v in tree.items():
        if k in Config.model_fields:
            out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        else:
            _set_dotted(out, k, v)
    return out


def _valid_keys_at(loc: tuple) -> list[str]:
    model: Any = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            model = RewardSpec
            continue
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        elif part == "rewards":
            model = RewardSpec
        else:
            return []
    return sorted(model.model_fields)


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        where = ".".join(str(p) for p in loc) or "(config)"
        if e["type"] == "extra_forbidden":
            valid = _valid_keys_at(loc)
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            lines.append(f"- {where}: unknown key.{hint} Valid keys here: {', '.join(valid)}.")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = e.get("input")
            shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
            lines.append(f"- {where}: {msg}{shown}.")
    return "invalid config:\n" + "\n".join(lines) + "\nSee `rlvr train --help` or docs/config.md for every option."


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (optional), apply key=value overrides, validate. Raises ConfigError."""
    tree: dict = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            # A bare name like `dapo_math` resolves to the ready config shipped in the package (rlvr/configs/).
            alt = Path(__file__).resolve().parent / "configs" / f"{p.stem}.yaml"
            if p.suffix in ("", ".yaml", ".yml") and alt.exists():
                p = alt
            else:
                raise ConfigError(
                    f"config file {str(path)!r} does not exist (nor is it a ready config: "
                    f"{', '.join(sorted(q.stem for q in alt.parent.glob('*.yaml')))})"
                )
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections, got {type(loaded).__name__}")
        tree = _normalise_top_level(loaded)
    tree = _merge(tree, parse_overrides(overrides or []))
    from rlvr.trl_compat import translate

    tree, problems = translate(tree)  # TRL's names for options rlvr spells differently
    if problems:
        raise ConfigError("invalid config:\n" + "\n".join(f"- {p}." for p in problems))
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


def override_config(tree: dict | None, overrides: list[str]) -> Config:
    """A config tree (e.g. a run's resolved config.yaml, as a dict) with key=value overrides applied, validated."""
    try:
        return Config.model_validate(_merge(tree or {}, parse_overrides(overrides)))
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def _option_sections(
    model: type[BaseModel] | None = None, prefix: str = ""
) -> list[tuple[str, list[tuple[str, Any, str]]]]:
    """[(section, [(dotted key, default, description)])], a section's own options before its subsections;
    what `rlvr train --help` and docs/config.md are both made from."""
    model = model or Config
    own, subs = [], []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            subs.extend(_option_sections(ann, f"{prefix}{name}."))
        else:
            own.append((f"{prefix}{name}", f.get_default(call_default_factory=True), f.description or ""))
    title = f"`{prefix[:-1]}`" if prefix else "top level"
    if own and prefix and "__doc__" in vars(model) and model.__doc__:  # a section's own docstring introduces it
        title += "\n\n" + " ".join(model.__doc__.split())
    return ([(title, own)] if own else []) + subs


def describe_options() -> str:
    """Every option with its default and documentation, for `rlvr train --help`."""
    return "\n".join(
        f"{key} = {default!r}\n    {desc}" for _, options in _option_sections() for key, default, desc in options
    )


def config_markdown() -> str:
    """docs/config.md, generated: `python -m rlvr.config > docs/config.md` (a test checks it is current)."""
    out = [
        "# Configuration reference",
        "",
        "Generated from `rlvr/config.py` by `python -m rlvr.config > docs/config.md`; a test fails when it is stale.",
        "Set any option in a YAML file or on the command line (`rlvr train [CONFIG.yaml] section.key=value`);",
        "TRL's flat names (`loss_type=gspo`) are routed to their section.",
        "",
    ]

    for title, options in _option_sections():
        out.extend([f"## {title}", "", "| key | default | meaning |", "| --- | --- | --- |"])
        for key, default, desc in options:
            cell = desc.replace("|", "\\|")  # a pipe would end the table cell
            out.append(f"| `{key}` | `{default!r}` | {cell} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(config_markdown(), end="")
