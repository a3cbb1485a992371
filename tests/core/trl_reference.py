"""Call TRL 1.16's own GRPOTrainer code on fixed tensors, without building a model or a dataset.

The trainer is created with ``object.__new__`` (no ``__init__``), and only the attributes the called method
reads are set. Its forward pass is replaced by one returning our fixed log-probs, so what is compared is
TRL's loss arithmetic, not a re-derivation of it.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from types import SimpleNamespace
from unittest import mock

import torch
import trl.trainer.grpo_trainer as grpo_module
from trl import GRPOTrainer  # noqa: E402  (test-only dependency: pytest.importorskip in the callers)


class _SingleProcessAccelerator:
    """What GRPOTrainer asks of accelerate, for one process: collectives are identities."""

    num_processes = 1
    process_index = 0
    device = torch.device("cpu")

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x

    def gather_for_metrics(self, x):
        return x


def _bare_trainer(**attrs) -> GRPOTrainer:
    trainer = object.__new__(GRPOTrainer)
    trainer.accelerator = _SingleProcessAccelerator()
    trainer.model = SimpleNamespace(training=True, is_gradient_checkpointing=False)
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    for name, value in attrs.items():
        setattr(trainer, name, value)
    return trainer


def trl_compute_loss(
    logp_NT: torch.Tensor,
    old_logp_NT: torch.Tensor | None,
    adv_N: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    loss_type: str,
    beta: float = 0.0,
    ref_logp_NT: torch.Tensor | None = None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    max_completion_length: int = 16,
    num_items_in_batch: torch.Tensor | None = None,
    gradient_accumulation_steps: int = 1,
    steps_per_generation: int = 1,
    use_bias_correction_kl: bool = True,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    entropy_NT: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
    importance_sampling_ratio: torch.Tensor | None = None,
    off_policy_mask_threshold: float | None = None,
    sampling_logp_NT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """TRL's ``_compute_loss`` on these tensors (training mode, one process); returns (loss, logged metrics)."""
    N, T = logp_NT.shape
    args = SimpleNamespace(
        use_bias_correction_kl=use_bias_correction_kl,
        delta=delta,
        sapo_temperature_pos=sapo_temperature_pos,
        sapo_temperature_neg=sapo_temperature_neg,
        steps_per_generation=steps_per_generation,
    )
    trainer = _bare_trainer(
        args=args,
        loss_type=loss_type,
        beta=beta,
        epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high,
        importance_sampling_level=importance_sampling_level,
        max_completion_length=max_completion_length,
        current_gradient_accumulation_steps=gradient_accumulation_steps,
        top_entropy_quantile=top_entropy_quantile,
        off_policy_mask_threshold=off_policy_mask_threshold,
        use_vllm=importance_sampling_ratio is not None,
        vllm_importance_sampling_correction=importance_sampling_ratio is not None,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
    )
    entropies = entropy_NT if entropy_NT is not None else torch.zeros_like(logp_NT.detach())
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp_NT, entropies, None)
    inputs = {
        "prompt_ids": torch.zeros(N, 1, dtype=torch.long),
        "prompt_mask": torch.ones(N, 1, dtype=torch.long),
        "completion_ids": torch.zeros(N, T, dtype=torch.long),
        "completion_mask": mask_NT,
        "advantages": adv_N,
        "num_items_in_batch": num_items_in_batch,
    }
    if old_logp_NT is not None:
        inputs["old_per_token_logps"] = old_logp_NT
    if ref_logp_NT is not None:
        inputs["ref_per_token_logps"] = ref_logp_NT
    if importance_sampling_ratio is not None:
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    if sampling_logp_NT is not None:
        inputs["sampling_per_token_logps"] = sampling_logp_NT
    loss = trainer._compute_loss(model=None, inputs=inputs)
    return loss, dict(trainer._metrics["train"])


@contextmanager
def _no_distributed_gather():
    with mock.patch.object(grpo_module, "gather_object", lambda x: list(x)):
        yield


def trl_generate_and_score(
    rewards_NK: torch.Tensor,
    group_size: int,
    weights_K: torch.Tensor | None = None,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
    *,
    completion_lengths: list[int] | None = None,
    old_logp_NT: torch.Tensor | None = None,
    sampler_logp_rows: list[list[float | None]] | None = None,
    is_mode: str = "sequence_mask",
    is_clip_min: float | None = None,
    is_clip_max: float | None = 3.0,
) -> tuple[dict, dict[str, list[float]]]:
    """Run TRL's ``_generate_and_score_completions`` with generation, rewards and forward passes stubbed out.

    The advantage and vLLM importance-sampling arithmetic sit in the middle of that 600-line method and are
    not callable on their own, so the method runs end to end on a batch whose ``_generate`` returns
    completions of ``completion_lengths`` tokens (with ``sampler_logp_rows`` as the engine's log-probs, which
    switches TRL's vLLM correction on), whose forward returns ``old_logp_NT``, and whose
    ``_calculate_rewards`` returns ``rewards_NK``. Returns TRL's output dict and its logged metrics.
    """
    N, K = rewards_NK.shape
    weights = torch.ones(K, dtype=rewards_NK.dtype) if weights_K is None else weights_K
    lengths = completion_lengths or [1] * N
    use_sampler = sampler_logp_rows is not None
    trainer = _bare_trainer(
        args=SimpleNamespace(
            per_device_train_batch_size=N,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            gradient_checkpointing_kwargs=None,
        ),
        environment_factories=None,
        environments=None,
        tools=None,
        num_iterations=1,
        num_generations=group_size,
        beta=0.0,
        use_vllm=use_sampler,
        vllm_importance_sampling_correction=use_sampler,
        vllm_importance_sampling_mode=is_mode,
        vllm_importance_sampling_clip_min=is_clip_min,
        vllm_importance_sampling_clip_max=is_clip_max,
        mask_truncated_completions=False,
        pad_to_multiple_of=None,
        _tokenizer=SimpleNamespace(pad_token_id=0),
        multi_objective_aggregation=multi_objective_aggregation,
        scale_rewards=scale_rewards,
        reward_weights=weights,
        reward_func_names=[f"r{k}" for k in range(K)],
        reward_funcs=[None] * K,
        **_log_buffers(),
    )
    completion_ids = [[1] * length for length in lengths]
    prompt_ids = [[1] for _ in range(N)]
    trainer._generate = lambda prompts: (prompt_ids, completion_ids, None, ["x"] * N, sampler_logp_rows, {}, None, None)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (old_logp_NT, None, None)
    trainer._calculate_rewards = lambda *a, **k: rewards_NK.clone()
    with _no_distributed_gather():
        out = trainer._generate_and_score_completions([{"prompt": "p"} for _ in range(N)])
    return out, dict(trainer._metrics["train"])


def _log_buffers() -> dict:
    """The logging attributes TRL's scoring methods append to (GRPO and RLOO share them)."""
    return dict(
        _logs={
            "prompt": [],
            "completion": [],
            "rewards": defaultdict(list),
            "advantages": [],
            "extra": defaultdict(list),
        },
        _pending_extra_logs=defaultdict(list),
        _pending_metrics=defaultdict(list),
        log_multimodal=False,
    )


def trl_advantages(rewards_NK: torch.Tensor, group_size: int, **kwargs) -> torch.Tensor:
    """TRL's advantages for ``rewards_NK`` (see :func:`trl_generate_and_score`)."""
    out, _ = trl_generate_and_score(rewards_NK, group_size, **kwargs)
    return out["advantages"]


def trl_rloo_advantages(rewards_NK: torch.Tensor, group_size: int, normalize_advantages: bool = False) -> torch.Tensor:
    """TRL 1.16 ``RLOOTrainer``'s advantages for ``rewards_NK`` (its scoring method, stubbed like the GRPO one)."""
    from trl import RLOOTrainer

    N, K = rewards_NK.shape
    trainer = object.__new__(RLOOTrainer)
    attrs = dict(
        accelerator=_SingleProcessAccelerator(),
        model=SimpleNamespace(training=True, is_gradient_checkpointing=False),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(per_device_train_batch_size=N, gradient_checkpointing_kwargs=None),
        _tokenizer=SimpleNamespace(pad_token_id=0),
        pad_to_multiple_of=None,
        mask_truncated_completions=False,
        beta=0.0,
        num_generations=group_size,
        reward_weights=torch.ones(K, dtype=rewards_NK.dtype),
        reward_clip_range=None,
        normalize_advantages=normalize_advantages,
        reward_func_names=[f"r{k}" for k in range(K)],
        reward_funcs=[None] * K,
        **_log_buffers(),
    )
    for name, value in attrs.items():
        setattr(trainer, name, value)
    one_token = [[1] for _ in range(N)]
    trainer._generate = lambda prompts: (one_token, one_token, ["x"] * N)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (torch.zeros(N, 1, dtype=rewards_NK.dtype), None, None)
    trainer._calculate_rewards = lambda *a, **k: rewards_NK.clone()
    import trl.trainer.rloo_trainer as rloo_module

    with mock.patch.object(rloo_module, "gather_object", lambda x: list(x)):
        out = trainer._generate_and_score_completions([{"prompt": "p"} for _ in range(N)])
    return out["advantages"]
