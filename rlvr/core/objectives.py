"""Leaves of the policy loss: per-token objectives, KL estimators, aggregations.

Every preset in :mod:`rlvr.core.loss` is one objective x one aggregation x one ratio level (+ optional KL),
so GRPO, DAPO, Dr. GRPO, ... are configurations of these pieces, not code paths (docs/architecture.md).

Shapes: ``ratio`` is [N, T] at token level or [N, 1] at sequence level (GSPO); ``adv`` is [N, 1] (or [N, T]
for per-token advantages); both broadcast against ``logp_NT``. An objective returns the per-token loss
(to be *minimised*) and boolean "was clipped" indicators keyed by the metric name TRL logs them under.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from rlvr.registry import Registry

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "OBJECTIVES",
    "BatchGeometry",
    "ObjectiveParams",
]


class ObjectiveParams(NamedTuple):
    """Hyper-parameters an objective may read (TRL names). Plain numbers, not a config object."""

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05


Objective = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, ObjectiveParams], tuple[torch.Tensor, dict[str, torch.Tensor]]
]
OBJECTIVES: Registry[Objective] = Registry("objective")


@OBJECTIVES.register("clip")
def clipped_surrogate(
    ratio: torch.Tensor, logp_NT: torch.Tensor, adv: torch.Tensor, p: ObjectiveParams
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate ``-min(r·A, clip(r, 1-ε_low, 1+ε_high)·A)`` (Schulman et al. 2017).

    Separate ``epsilon_high`` is DAPO's clip-higher (arXiv:2503.14476 §3.1): a larger upper bound lets
    low-probability tokens that earned a positive advantage grow, which keeps entropy from collapsing.
    ``delta`` caps the *unclipped* branch too (INTELLECT-2, arXiv:2505.07291): with A < 0 and a huge
    ratio, ``min`` picks ``r·A`` unbounded; capping r at delta bounds that step.
    """
    clipped = torch.clamp(ratio, 1 - p.epsilon_low, 1 + p.epsilon_high)
    if p.delta is not None:
        ratio = torch.clamp(ratio, max=p.delta)
    per_token_loss = -torch.min(ratio * adv, clipped * adv)
    # A token counts as clipped only when clipping removed its gradient (the min chose the clipped branch).
    is_low = (ratio < 1 - p.epsilon_low) & (adv < 0)
    is_high = (ratio > 1 + p.epsilon_high) & (adv > 0)
    return per_token_loss, {
        "clip_ratio/low_mean": is_low,
        "clip_ratio/high_mean": is_high,
        "clip_ratio/region_mean": is_low | is_high,
    }


@OBJECTIVES.register("cispo")
def clipped_is_weight(
    ratio: torch.Tensor, logp_NT: torch.Tensor, adv: torch.Tensor, p: ObjectiveParams
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv:2506.13585 §3.1): ``-sg(min(r, ε_max))·A·logp``.

    Clips the importance weight (stop-gradient) instead of the update, so every token keeps a gradient,
    including the rare "fork" tokens PPO clipping silences. As in TRL, ``epsilon_high`` *is* ε_max (an
    absolute cap on the ratio, ScaleRL recommends 5.0), not an offset from 1.
    """
    weight = torch.clamp(ratio, max=p.epsilon_high).detach()
    per_token_loss = -weight * adv * logp_NT
    return per_token_loss, {"cispo_clip_ratio": (ratio > p.epsilon_high) & (adv > 0)}


@OBJECTIVES.register("sapo")
def soft_gate(
    ratio: torch.Tensor, logp_NT: torch.Tensor, adv: torch.Tensor, p: ObjectiveParams
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (arXiv:2511.20347): replace the hard clip with ``-(4/τ)·σ(τ·(r-1))·A``.

    The gate's gradient ``4σ(1-σ)`` is 1 at r = 1 and decays smoothly as r leaves 1, so off-policy tokens are
    attenuated rather than cut off. τ differs by advantage sign (``sapo_temperature_pos`` for A > 0, else
    ``..._neg``): a larger τ for negative advantages damps them faster, as they are the less stable ones.
    """
    tau = torch.where(adv > 0, p.sapo_temperature_pos, p.sapo_temperature_neg)
    per_token_loss = -(torch.sigmoid(tau * (ratio - 1)) * 4 / tau) * adv
    return per_token_loss, {}


KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


# Estimators of KL(π_θ || π_ref) from samples of π_θ (Schulman, "Approximating KL divergence", 2020).
@KL_ESTIMATORS.register("k1")
def kl_k1(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> torch.Tensor:
    """``log π/π_ref``: unbiased, but negative on some tokens and high-variance."""
    return logp_NT - ref_logp_NT


@KL_ESTIMATORS.register("k2")
def kl_k2(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> torch.Tensor:
    """``½(log π/π_ref)²``: non-negative, low variance, biased."""
    return 0.5 * (logp_NT - ref_logp_NT) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> torch.Tensor:
    """``π_ref/π - log(π_ref/π) - 1``: unbiased and non-negative; GRPO's choice (arXiv:2402.03300 eq. 4), TRL's only."""
    log_ref_over_pi = ref_logp_NT - logp_NT
    return torch.exp(log_ref_over_pi) - log_ref_over_pi - 1


@dataclass(frozen=True)
class BatchGeometry:
    """How the micro-batch being scored sits inside the generation batch (needed by some aggregations).

    ``num_items_in_batch`` is the number of active completion tokens of the whole generation batch, summed
    over all processes (a number or 0-dim tensor); ``None`` means "this micro-batch is the whole generation
    batch", allowed only with one process and ``steps_per_generation == 1``.
    """

    gradient_accumulation_steps: int = 1
    steps_per_generation: int = 1
    num_processes: int = 1
    num_items_in_batch: torch.Tensor | int | float | None = None
    max_completion_length: int | None = None


Aggregation = Callable[[torch.Tensor, torch.Tensor, BatchGeometry], torch.Tensor]
AGGREGATIONS: Registry[Aggregation] = Registry("aggregation")


def _broadcast_masked(loss_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    # A sequence-level loss [N, 1] broadcasts to [N, T] here, so every active token carries its sequence's term.
    return loss_NT * mask_NT


@AGGREGATIONS.register("sequence_mean")
def sequence_mean(loss_NT: torch.Tensor, mask_NT: torch.Tensor, g: BatchGeometry) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean (GRPO's 1/G Σ 1/|o_i| Σ_t). Favours short correct
    and long wrong answers, the length bias Dr. GRPO and DAPO remove."""
    per_seq_N = _broadcast_masked(loss_NT, mask_NT).sum(-1) / mask_NT.sum(-1).clamp(min=1.0)
    return per_seq_N.mean() / g.gradient_accumulation_steps


@AGGREGATIONS.register("token_mean")
def token_mean(loss_NT: torch.Tensor, mask_NT: torch.Tensor, g: BatchGeometry) -> torch.Tensor:
    """Token mean over the micro-batch (BNPO). Depends on how the batch is cut into micro-batches."""
    return _broadcast_masked(loss_NT, mask_NT).sum() / mask_NT.sum().clamp(min=1.0) / g.gradient_accumulation_steps


@AGGREGATIONS.register("constant_norm")
def constant_norm(loss_NT: torch.Tensor, mask_NT: torch.Tensor, g: BatchGeometry) -> torch.Tensor:
    """Token sum over (micro-batch sequences · max_completion_length) (Dr. GRPO, arXiv:2503.20783 §3.1):
    a constant normaliser, so no sequence's tokens weigh more because the sequence is short."""
    if g.max_completion_length is None:
        raise ValueError(
            "the dr_grpo aggregation divides by max_completion_length, but it was not given; pass "
            "max_completion_length= (the generation limit, TRL's max_completion_length), not the padded length."
        )
    normaliser = loss_NT.shape[0] * g.max_completion_length
    return _broadcast_masked(loss_NT, mask_NT).sum() / normaliser / g.gradient_accumulation_steps


@AGGREGATIONS.register("global_token_mean")
def global_token_mean(loss_NT: torch.Tensor, mask_NT: torch.Tensor, g: BatchGeometry) -> torch.Tensor:
    """Token sum over the active tokens of one accumulation window (DAPO token-level loss, arXiv:2503.14476 §3.3).

    TRL 1.16: ``normaliser = num_items_in_batch / num_processes · GA / steps_per_generation``, i.e. the
    generation batch's tokens per process, per optimizer step. Summed over the GA micro-batches of a step and
    averaged over processes by DDP, the gradient is that of the token mean over the whole window, so every
    token weighs the same however the batch is cut.
    """
    if g.num_items_in_batch is None:
        if g.num_processes != 1 or g.steps_per_generation != 1:
            raise ValueError(
                "the dapo/cispo aggregation needs num_items_in_batch (active completion tokens of the whole "
                "generation batch, summed over all processes) when num_processes > 1 or steps_per_generation > 1; "
                "count it once per generation batch (mask.sum(), all-reduced) and pass it with every micro-batch."
            )
        num_items = mask_NT.sum()
    else:
        num_items = torch.as_tensor(g.num_items_in_batch, device=loss_NT.device)
    normaliser = num_items.clamp(min=1.0) / g.num_processes
    normaliser = normaliser * g.gradient_accumulation_steps / g.steps_per_generation
    return _broadcast_masked(loss_NT, mask_NT).sum() / normaliser


@AGGREGATIONS.register("sequence_sum")
def sequence_sum(loss_NT: torch.Tensor, mask_NT: torch.Tensor, g: BatchGeometry) -> torch.Tensor:
    """Mean over sequences of each sequence's token *sum* (LUSPO, arXiv:2602.05261): with a sequence-level
    ratio this weighs each sequence's GSPO term by its length, undoing GSPO's bias toward short answers."""
    return _broadcast_masked(loss_NT, mask_NT).sum(-1).mean() / g.gradient_accumulation_steps
