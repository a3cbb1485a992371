"""TRL ``GRPOConfig`` names that are not rlvr option names: each is translated, or refused with the way.

rlvr's options carry TRL's names where the two mean the same (``loss_type``, ``beta``,
``num_generations``, ``learning_rate``, ...; a bare name is routed to its section by
``rlvr.config``). The names below mean something rlvr spells differently; ``translate`` rewrites a
raw config tree (before validation) so that a TRL user's keys work as TRL 1.16 reads them:

- ``TRANSLATED``: set the rlvr option(s) shown, with TRL's semantics (see each entry);
- ``REFUSED``: no exact equivalent; the message names what to set instead.

Every other field of ``trl.GRPOConfig`` is either an rlvr option of the same name or listed in
``UNSUPPORTED`` (a feature rlvr does not have), so no TRL key falls through to a generic "unknown
key" (tests/train/test_trl_names.py walks TRL's dataclass).
"""

from __future__ import annotations

import os
from typing import Any

# TRL name -> (rlvr option it sets, how), for the README table and `--help`.
TRANSLATED: dict[str, str] = {
    "reward_weights": "rewards[i].weight, one weight per reward function (the task's defaults when rewards is empty)",
    "bf16": "train.mixed_precision=bf16 (float32 weights, bfloat16 autocast: TRL's meaning; bf16=false: no)",
    "fp16": "model.dtype=float16",
    "use_vllm": "rollout.backend=vllm (vllm_mode=colocate, TRL's default) or vllm-server (vllm_mode=server)",
    "vllm_mode": "with use_vllm: colocate -> rollout.backend=vllm, server -> rollout.backend=vllm-server",
    "generation_batch_size": "train.steps_per_generation = generation_batch_size / (per_device_train_batch_size "
    "x processes), as TRL derives it",
    "scale_rewards": "true -> algo.scale_rewards=group, false -> none (TRL's boolean forms)",
    "log_completions": "false -> log.samples_per_class=0 (no sample tables); true -> the default tables",
    "vllm_importance_sampling_correction": "algo.sampler_importance_sampling_correction",
    "vllm_importance_sampling_mode": "algo.sampler_importance_sampling_mode",
    "vllm_importance_sampling_clip_max": "algo.sampler_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min": "algo.sampler_importance_sampling_clip_min",
    "vllm_importance_sampling_cap": "algo.sampler_importance_sampling_clip_max (TRL's deprecated name)",
    "shuffle_dataset": "data.shuffle",
    "warmup_steps": "train.warmup_ratio when below 1 (transformers reads such a value as a ratio); a step count is "
    "refused with the ratio to set",
    "resume_from_checkpoint": "resume (true, or a checkpoint folder)",
}

REFUSED: dict[str, str] = {
    "num_train_epochs": "rlvr counts optimizer steps: set train.max_steps (one epoch of R prompts is "
    "R x num_generations / (per_device_train_batch_size x gradient_accumulation_steps) steps)",
    "num_completions_to_print": "rlvr prints log.samples_per_class completions per outcome class "
    "(best, worst, truncated) every log.logging_steps; set that",
    "run_name": "rlvr names a run by its folder: set log.output_dir=runs/NAME",
}

# GRPOConfig fields for features rlvr does not have.
UNSUPPORTED = (
    "model_init_kwargs",
    "router_aux_loss_coef",
    "disable_dropout",
    "cast_lm_head_to_fp32",
    "num_generations_eval",
    "ds3_gather_for_generation",
    "pad_to_multiple_of",
    "generation_kwargs",
    "chat_template_kwargs",
    "cache_implementation",
    "vllm_model_impl",
    "vllm_enable_sleep_mode",
    "vllm_structured_outputs_regex",
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout",
    "vllm_group_port",
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "vllm_tensor_parallel_size",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
    "multi_objective_aggregation",
    "sync_ref_model",
    "ref_model_mixup_alpha",
    "ref_model_sync_steps",
    "entropy_coef",
    "use_adaptive_entropy",
    "entropy_coef_min",
    "entropy_coef_max",
    "entropy_coef_delta",
    "entropy_target",
    "max_tool_calling_iterations",
    "off_policy_mask_threshold",
    "log_multimodal",
    "log_unique_prompts",
    "log_completions_hub_repo",
    "use_transformers_continuous_batching",
    "transformers_continuous_batching_config",
    "use_transformers_paged",
)
_VLLM_HINT = {
    f"vllm_{k}": "rollout.engine_options"
    for k in (
        "server_base_url",
        "server_host",
        "server_port",
        "server_timeout",
        "gpu_memory_utilization",
        "max_model_length",
        "tensor_parallel_size",
        "enable_sleep_mode",
        "group_port",
    )
}


def _bool(key: str, v: Any, problems: list[str]) -> bool | None:
    if isinstance(v, bool):
        return v
    problems.append(f"{key} must be true or false (got {v!r})")
    return None


def _section(tree: dict, name: str) -> dict:
    sec = tree.setdefault(name, {})
    return sec if isinstance(sec, dict) else {}


def _set(tree: dict, dotted: str, value: Any, trl_key: str, problems: list[str]) -> None:
    sec_name, key = dotted.split(".", 1)
    sec = _section(tree, sec_name)
    if key in sec and sec[key] != value:
        problems.append(f"{trl_key} sets {dotted}={value!r} but {dotted}={sec[key]!r} is also given; keep one")
        return
    sec[key] = value


def translate(tree: dict) -> tuple[dict, list[str]]:
    """Rewrite TRL's names in a raw config tree; returns (tree, problems: one line each)."""
    problems: list[str] = []
    tree = dict(tree)
    popped = {k: tree.pop(k) for k in list(tree) if k in TRANSLATED or k in REFUSED or k in UNSUPPORTED}
    algo = tree.get("algo")
    if isinstance(algo, dict) and isinstance(algo.get("scale_rewards"), bool):  # routed there already
        popped["scale_rewards"] = algo.pop("scale_rewards")
    for key, v in popped.items():
        if key in REFUSED:
            problems.append(f"{key} (a TRL name) is not used by rlvr: {REFUSED[key]}")
        elif key in UNSUPPORTED:
            hint = f"; its server/engine settings go in {_VLLM_HINT[key]}" if key in _VLLM_HINT else ""
            problems.append(f"{key} (a TRL option) has no rlvr equivalent{hint}; remove it")
    if "scale_rewards" in popped:
        v = popped["scale_rewards"]
        _set(
            tree,
            "algo.scale_rewards",
            {True: "group", False: "none"}.get(v, v) if isinstance(v, bool) else v,
            "scale_rewards",
            problems,
        )
    for key in ("bf16", "fp16"):
        if key in popped and _bool(key, popped[key], problems) is not None:
            # bf16 is TRL's (accelerate's) mixed precision: float32 master weights, bf16 autocast. fp16 would
            # need loss scaling, which rlvr does not do: it keeps the weights themselves in float16.
            if key == "bf16":
                _set(tree, "train.mixed_precision", "bf16" if popped[key] else "no", key, problems)
            elif popped[key]:
                _set(tree, "model.dtype", "float16", key, problems)
    _translate_vllm(tree, popped, problems)
    for key in [k for k in popped if k.startswith("vllm_importance_sampling_")]:
        target = "clip_max" if key.endswith("_cap") else key.removeprefix("vllm_importance_sampling_")
        _set(tree, f"algo.sampler_importance_sampling_{target}", popped[key], key, problems)
    if "warmup_steps" in popped:
        w = popped["warmup_steps"]
        if isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w < 1:
            _set(tree, "train.warmup_ratio", float(w), "warmup_steps", problems)
        else:
            problems.append(
                f"warmup_steps={w!r}: rlvr sets warmup as a fraction of train.max_steps; set "
                "train.warmup_ratio=warmup_steps/max_steps (e.g. 6 of 60 steps: 0.1)"
            )
    if "resume_from_checkpoint" in popped and popped["resume_from_checkpoint"] not in (None, False):
        if "resume" in tree and tree["resume"] != popped["resume_from_checkpoint"]:
            problems.append("resume_from_checkpoint and resume are both given; keep resume")
        else:
            tree["resume"] = popped["resume_from_checkpoint"]
    if "shuffle_dataset" in popped:
        _set(tree, "data.shuffle", popped["shuffle_dataset"], "shuffle_dataset", problems)
    if "log_completions" in popped and _bool("log_completions", popped["log_completions"], problems) is False:
        _set(tree, "log.samples_per_class", 0, "log_completions", problems)
    if "generation_batch_size" in popped:
        _translate_generation_batch(tree, popped["generation_batch_size"], problems)
    if "reward_weights" in popped:
        _translate_weights(tree, popped["reward_weights"], problems)
    _name_training_arguments(tree, problems)
    return tree, problems


# transformers 5's TrainingArguments fields that rlvr has no option for (a GRPOConfig inherits them all).
TRAINING_ARGUMENTS_UNSUPPORTED = frozenset(
    (
        "accelerator_config",
        "activation_checkpointing",
        "activation_checkpointing_kwargs",
        "auto_find_batch_size",
        "average_tokens_across_devices",
        "batch_eval_metrics",
        "bf16_full_eval",
        "data_seed",
        "dataloader_drop_last",
        "dataloader_in_order",
        "dataloader_multiprocessing_context",
        "dataloader_num_workers",
        "dataloader_persistent_workers",
        "dataloader_pin_memory",
        "dataloader_prefetch_factor",
        "ddp_backend",
        "ddp_broadcast_buffers",
        "ddp_bucket_cap_mb",
        "ddp_find_unused_parameters",
        "ddp_static_graph",
        "ddp_timeout",
        "debug",
        "deepspeed",
        "disable_tqdm",
        "do_eval",
        "do_predict",
        "do_train",
        "enable_jit_checkpoint",
        "eval_accumulation_steps",
        "eval_delay",
        "eval_do_concat_batches",
        "eval_on_start",
        "eval_strategy",
        "eval_use_gather_object",
        "fp16_full_eval",
        "fsdp",
        "fsdp_config",
        "full_determinism",
        "gradient_checkpointing_kwargs",
        "greater_is_better",
        "hub_always_push",
        "hub_model_id",
        "hub_private_repo",
        "hub_revision",
        "hub_strategy",
        "hub_token",
        "ignore_data_skip",
        "include_for_metrics",
        "include_num_input_tokens_seen",
        "label_names",
        "label_smoothing_factor",
        "length_column_name",
        "liger_kernel_config",
        "load_best_model_at_end",
        "local_rank",
        "log_level",
        "log_level_replica",
        "log_on_each_node",
        "logging_first_step",
        "logging_nan_inf_filter",
        "logging_strategy",
        "lr_scheduler_kwargs",
        "metric_for_best_model",
        "neftune_noise_alpha",
        "optim_args",
        "optim_target_modules",
        "parallelism_config",
        "per_device_eval_batch_size",
        "prediction_loss_only",
        "project",
        "push_to_hub",
        "remove_unused_columns",
        "restore_callback_states_from_checkpoint",
        "save_on_each_node",
        "save_only_model",
        "save_strategy",
        "skip_memory_metrics",
        "tf32",
        "torch_compile",
        "torch_compile_backend",
        "torch_compile_mode",
        "torch_empty_cache_steps",
        "trackio_bucket_id",
        "trackio_space_id",
        "trackio_static_space_id",
        "train_sampling_strategy",
        "use_cache",
        "use_cpu",
        "use_liger_kernel",
    )
)


def _name_training_arguments(tree: dict, problems: list[str]) -> None:
    """A transformers TrainingArguments name rlvr lacks (optim_args, push_to_hub, ...) is named as such, rather
    than reported as an unknown key with a far-fetched suggestion."""
    for k in [k for k in tree if k in TRAINING_ARGUMENTS_UNSUPPORTED]:
        tree.pop(k)
        problems.append(
            f"{k} (a transformers TrainingArguments option) has no rlvr equivalent; remove it "
            "(`rlvr train --help` lists every option)"
        )


def _translate_vllm(tree: dict, popped: dict, problems: list[str]) -> None:
    if "use_vllm" not in popped and "vllm_mode" not in popped:
        return
    use = popped.get("use_vllm")
    if use is not None and _bool("use_vllm", use, problems) is None:
        return
    mode = popped.get("vllm_mode", "colocate")
    if mode not in ("colocate", "server"):
        problems.append(f"vllm_mode must be 'colocate' or 'server' (got {mode!r})")
        return
    backend = _section(tree, "rollout").get("backend")
    if use is False:
        if backend in ("vllm", "vllm-server"):
            problems.append(f"use_vllm=false but rollout.backend={backend}; keep one")
        return
    if use is None and backend not in ("vllm", "vllm-server"):
        problems.append("vllm_mode applies only with use_vllm=true (or rollout.backend=vllm / vllm-server)")
        return
    want = "vllm-server" if mode == "server" else "vllm"
    if backend not in (None, want):
        problems.append(f"use_vllm/vllm_mode ask for rollout.backend={want} but rollout.backend={backend} is given")
        return
    _section(tree, "rollout")["backend"] = want


def _translate_generation_batch(tree: dict, gbs: Any, problems: list[str]) -> None:
    train = _section(tree, "train")
    if not isinstance(gbs, int) or isinstance(gbs, bool) or gbs < 1:
        problems.append(f"generation_batch_size must be a positive integer (got {gbs!r})")
        return
    if train.get("steps_per_generation") is not None:
        problems.append("generation_batch_size and steps_per_generation cannot both be set (as in TRL); keep one")
        return
    from rlvr.config import TrainConfig

    per_device = train.get(
        "per_device_train_batch_size", TrainConfig.model_fields["per_device_train_batch_size"].default
    )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not isinstance(per_device, int) or gbs % (per_device * world):
        problems.append(
            f"generation_batch_size ({gbs}) must be divisible by per_device_train_batch_size "
            f"({per_device}) x processes ({world}), as in TRL"
        )
        return
    train["steps_per_generation"] = gbs // (per_device * world)


def _translate_weights(tree: dict, weights: Any, problems: list[str]) -> None:
    if not isinstance(weights, list) or not all(
        isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights
    ):
        problems.append(f"reward_weights must be a list of numbers, one per reward function (got {weights!r})")
        return
    from rlvr.reward_refs import normalise_reward_specs

    specs = normalise_reward_specs(tree.get("rewards") or [])
    if not specs:  # the built-in task's default rewards, made explicit so they can carry the weights
        try:
            from rlvr.tasks import get_task

            data = tree.get("data") or {}
            task = get_task(data.get("task", "arithmetic"), **(data.get("task_options") or {}))
            specs = [{"name": n} for n, _ in task.default_rewards]
        except Exception as e:  # noqa: BLE001 - an unknown task is reported by validation
            problems.append(f"reward_weights needs the reward functions it weighs: set rewards ({e})")
            return
    if len(specs) != len(weights):
        names = [s.get("name") if isinstance(s, dict) else s for s in specs]
        problems.append(
            f"reward_weights has {len(weights)} weights for {len(specs)} reward functions {names}; "
            "give one weight per function, in order"
        )
        return
    out = []
    for s, w in zip(specs, weights):
        if isinstance(s, dict) and "weight" in s and s["weight"] != w:
            problems.append(f"reward {s.get('name')!r} has weight {s['weight']} and reward_weights gives {w}; keep one")
        out.append({**s, "weight": float(w)} if isinstance(s, dict) else s)
    tree["rewards"] = out


def help_lines() -> list[str]:
    """One line per translated or refused TRL name (for docs)."""
    return [f"{k} -> {v}" for k, v in TRANSLATED.items()] + [f"{k}: {v}" for k, v in REFUSED.items()]
