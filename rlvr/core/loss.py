"""The GRPO loss family: ``policy_loss`` = per-token objective x aggregation (+ beta · KL), as pure tensors.

A *loss type* (TRL's ``loss_type``; DAPO is the default, as in TRL 1.16) is a named preset of three leaves
(see :mod:`rlvr.core.objectives`): which ratio level, which per-token objective, which aggregation. For
every preset, value and gradient equal TRL 1.16 ``GRPOTrainer._compute_loss`` (tests/core/test_core_trl_parity.py).
Add a preset with ``LOSS_TYPES.add("name", LossPreset(...))``; no other code changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlvr.core.corrections import high_entropy_mask, off_policy_sequence_mask
from rlvr.core.objectives import AGGREGATIONS, KL_ESTIMATORS, OBJECTIVES, BatchGeometry, ObjectiveParams
from rlvr.registry import Registry

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "LossPreset",
    "LossSettings",
    "loss_type_names",
    "policy_loss",
    "policy_loss_from",
]

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class LossPreset:
    """A named combination of leaves. ``trl_loss_type`` is the TRL 1.16 ``loss_type`` that computes the same
    thing (with ``importance_sampling_level`` set to ours); ``paper`` is where the combination comes from."""

    objective: str
    aggregation: str
    importance_sampling_level: str
    trl_loss_type: str
    paper: str
    #: Smallest ``epsilon_high`` that can learn: cispo caps the ratio *at* epsilon_high (eps_max), so a cap
    #: below 1 stops every token; None = no requirement (there it is a clip range above 1).
    min_epsilon_high: float | None = None


LOSS_TYPES: Registry[LossPreset] = Registry("loss type")
LOSS_TYPES.add("grpo", LossPreset("clip", "sequence_mean", "token", "grpo", "arXiv:2402.03300"))
LOSS_TYPES.add("bnpo", LossPreset("clip", "token_mean", "token", "bnpo", "TRL (batch-normalised token mean)"))
LOSS_TYPES.add("dr_grpo", LossPreset("clip", "constant_norm", "token", "dr_grpo", "arXiv:2503.20783"))
LOSS_TYPES.add("dapo", LossPreset("clip", "global_token_mean", "token", "dapo", "arXiv:2503.14476"))
LOSS_TYPES.add("gspo", LossPreset("clip", "sequence_mean", "sequence", "grpo", "arXiv:2507.18071"))
LOSS_TYPES.add(
    "cispo", LossPreset("cispo", "global_token_mean", "token", "cispo", "arXiv:2506.13585", min_epsilon_high=1.0)
)
LOSS_TYPES.add("sapo", LossPreset("sapo", "sequence_mean", "token", "sapo", "arXiv:2511.20347"))
LOSS_TYPES.add("luspo", LossPreset("clip", "sequence_sum", "sequence", "luspo", "arXiv:2602.05261"))


@dataclass(frozen=True)
class LossSettings:
    """The algorithm's choices for the loss, fixed for a run (``policy_loss``'s keyword arguments of the same
    names; see there). With ``BatchGeometry`` (where a micro-batch sits) it is everything but the tensors."""

    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str | None = None
    kl_estimator: str = "k3"
    kl_bias_correction: bool = True
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    top_entropy_quantile: float = 1.0
    off_policy_mask_threshold: float | None = None


def loss_type_names() -> list[str]:
    """Valid ``loss_type`` values, for config validation."""
    return LOSS_TYPES.names()


def _masked_mean(x: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """TRL's metric mean: over active tokens for [N, T], over all sequences for a sequence-level [N, 1]."""
    x = x.to(mask_NT.dtype)
    if x.shape[-1] == 1 and mask_NT.shape[-1] != 1:
        return x.mean()
    x = x.expand_as(mask_NT)
    return (x * mask_NT).sum() / mask_NT.sum().clamp(min=1.0)


def _per_sequence_mean(x: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """[N]: each sequence's active-token mean (NaN for an empty sequence), or the value itself at sequence level."""
    x = x.to(mask_NT.dtype)
    if x.shape[-1] == 1 and mask_NT.shape[-1] != 1:
        return x.squeeze(-1)
    return (x * mask_NT).sum(-1) / mask_NT.sum(-1)


def policy_loss(
    logp_NT: torch.Tensor,
    old_logp_NT: torch.Tensor | None,
    adv_N: torch.Tensor,
    mask_NT: torch.Tensor,
    loss_type: str = "dapo",
    beta: float = 0.0,
    ref_logp_NT: torch.Tensor | None = None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str | None = None,
    max_completion_length: int | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
    gradient_accumulation_steps: int = 1,
    steps_per_generation: int = 1,
    num_processes: int = 1,
    *,
    kl_estimator: str = "k3",
    kl_bias_correction: bool = True,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    entropy_NT: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
    entropy_threshold: torch.Tensor | float | None = None,
    sampler_is_weights_NT: torch.Tensor | None = None,
    off_policy_mask_threshold: float | None = None,
    sampler_logp_NT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch, ready for ``.backward()``, and its metrics (0-dim detached tensors, no host sync).

    Equal in value and gradient to TRL 1.16 ``GRPOTrainer._compute_loss`` in training mode for the same
    settings (``loss_type``, ``beta``, ``epsilon``, ``epsilon_high``, ``delta``, ``importance_sampling_level``,
    ``use_bias_correction_kl`` = ``kl_bias_correction``, ``sapo_temperature_*``, ``top_entropy_quantile``,
    ``off_policy_mask_threshold``, vLLM importance sampling = ``sampler_is_weights_NT``). The loss already
    includes the gradient-accumulation scaling: sum ``.backward()`` over the GA micro-batches of a step.

    Args:
        logp_NT: [N, T] log-probs of the completion tokens under the current policy, from *temperature-scaled*
            logits (:func:`rlvr.core.logprobs.token_logprobs`), with grad. Float64 works (tests use it).
        old_logp_NT: [N, T] log-probs under the policy that sampled (no grad), or ``None`` when the update is
            on-policy (one iteration and ``steps_per_generation <= gradient_accumulation_steps``): the ratio is
            then exactly 1 and its gradient that of ``logp``; TRL skips the old-logprob pass in that case too.
        adv_N: [N] advantages (:func:`compute_advantages`, this process's rows), or [N, T] per-token.
        mask_NT: [N, T] 1 for completion tokens that count (up to and including the first EOS), 0 for padding.
        loss_type: a preset name in ``LOSS_TYPES`` (see ``docs/algorithms.md``).
        beta: KL coefficient; 0 (default) computes no KL and needs no ``ref_logp_NT``.
        ref_logp_NT: [N, T] reference-model log-probs (no grad); required when ``beta != 0``.
        epsilon, epsilon_high: clip range ``[1 - epsilon, 1 + epsilon_high]``; ``epsilon_high`` defaults to
            ``epsilon``. For ``cispo`` ``epsilon_high`` is the absolute cap ε_max on the ratio (TRL semantics;
            the recommended value is 5.0, and the default ``epsilon`` is almost certainly not what you want).
        delta: cap on the unclipped ratio (two-sided clipping, INTELLECT-2); ``None`` disables it.
        importance_sampling_level: "token" or "sequence" (GSPO); ``None`` = the preset's own level.
        max_completion_length: the generation limit; required by ``dr_grpo``.
        num_items_in_batch, gradient_accumulation_steps, steps_per_generation, num_processes: where this
            micro-batch sits; what each aggregation needs from the trainer:

            - ``grpo``, ``gspo``, ``sapo``, ``bnpo``, ``luspo``: only ``gradient_accumulation_steps`` (the loss
              is divided by it).
            - ``dr_grpo``: also ``max_completion_length`` (divides the token sum by micro-batch N x it).
            - ``dapo`` (default), ``cispo``: ``num_items_in_batch`` = active completion tokens of the *whole
              generation batch, summed over all processes* (count ``mask.sum()`` over the generation batch once,
              all-reduce it, pass the same number with every micro-batch of that generation), plus
              ``num_processes``, ``gradient_accumulation_steps`` and ``steps_per_generation``. The loss is the
              token sum over ``num_items_in_batch / num_processes x GA / steps_per_generation`` (TRL 1.16), the
              tokens one process handles in one optimizer step. ``None`` is accepted only with one process and
              ``steps_per_generation == 1`` (the micro-batch's own tokens are then the generation batch's).

            For evaluation (no accumulation) pass ``gradient_accumulation_steps = steps_per_generation = 1``.

    Keyword-only extras:
        kl_estimator: "k1", "k2" or "k3" (TRL: k3 only). kl_bias_correction: multiply the per-token KL by the
            (differentiable) importance ratio, making its gradient the unbiased reverse-KL gradient off-policy
            (DeepSeek-V3.2; TRL's ``use_bias_correction_kl``, default True). It changes the gradient even
            on-policy, where the ratio's value is 1.
        sapo_temperature_pos / _neg: SAPO gate temperatures for positive / non-positive advantages.
        entropy_NT, top_entropy_quantile, entropy_threshold: keep only the top-ρ highest-entropy active tokens
            in the policy term (ρ < 1); ``entropy_NT`` also gives the ``entropy`` metric. The quantile is local
            to this micro-batch; TRL gathers entropies over processes, so with several processes pass the
            gathered ``entropy_threshold``.
        sampler_is_weights_NT: [N, T] or [N, 1] weights from :func:`sampler_importance_weights`.
        off_policy_mask_threshold, sampler_logp_NT: drop negative-advantage sequences whose mean
            ``sampler_logp - logp`` exceeds the threshold (DeepSeek-V3.2); ``sampler_logp_NT`` defaults to
            ``old_logp_NT`` as in TRL.

    Metrics (means over this micro-batch's active tokens, or sequences at sequence level; TRL's names):
        ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean``, ``clip_ratio/low_min``,
        ``clip_ratio/high_max`` (clip objective); ``cispo_clip_ratio`` (cispo); ``kl`` (beta != 0);
        ``entropy`` (entropy given); ``ratio/mean``, ``ratio/min``, ``ratio/max`` (importance ratio π_θ/π_old).
    """
    settings = LossSettings(
        loss_type=loss_type,
        beta=beta,
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        delta=delta,
        importance_sampling_level=importance_sampling_level,
        kl_estimator=kl_estimator,
        kl_bias_correction=kl_bias_correction,
        sapo_temperature_pos=sapo_temperature_pos,
        sapo_temperature_neg=sapo_temperature_neg,
        top_entropy_quantile=top_entropy_quantile,
        off_policy_mask_threshold=off_policy_mask_threshold,
    )
    geometry = BatchGeometry(
        gradient_accumulation_steps=gradient_accumulation_steps,
        steps_per_generation=steps_per_generation,
        num_processes=num_processes,
        num_items_in_batch=num_items_in_batch,
        max_completion_length=max_completion_length,
    )
    return policy_loss_from(
        settings,
        geometry,
        logp_NT,
        old_logp_NT,
        adv_N,
        mask_NT,
        ref_logp_NT=ref_logp_NT,
        entropy_NT=entropy_NT,
        entropy_threshold=entropy_threshold,
        sampler_is_weights_NT=sampler_is_weights_NT,
        sampler_logp_NT=sampler_logp_NT,
    )


def policy_loss_from(
    settings: LossSettings,
    geometry: BatchGeometry,
    logp_NT: torch.Tensor,
    old_logp_NT: torch.Tensor | None,
    adv_N: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    ref_logp_NT: torch.Tensor | None = None,
    entropy_NT: torch.Tensor | None = None,
    entropy_threshold: torch.Tensor | float | None = None,
    sampler_is_weights_NT: torch.Tensor | None = None,
    sampler_logp_NT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``policy_loss`` with its settings grouped: build ``settings`` once per run and ``geometry`` once per
    generation batch, pass the micro-batch's tensors. Same value, gradient and metrics as ``policy_loss``."""
    s = settings
    loss_type, beta, epsilon, epsilon_high, delta = s.loss_type, s.beta, s.epsilon, s.epsilon_high, s.delta
    importance_sampling_level, kl_estimator, kl_bias_correction = (
        s.importance_sampling_level,
        s.kl_estimator,
        s.kl_bias_correction,
    )
    top_entropy_quantile, off_policy_mask_threshold = s.top_entropy_quantile, s.off_policy_mask_threshold
    preset = LOSS_TYPES.get(loss_type)
    level = preset.importance_sampling_level if importance_sampling_level is None else importance_sampling_level
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level={level!r} is not valid; use 'token' or 'sequence' (GSPO).")
    if logp_NT.dim() != 2 or mask_NT.shape != logp_NT.shape:
        raise ValueError(
            f"logp_NT {tuple(logp_NT.shape)} and mask_NT {tuple(mask_NT.shape)} must both be [N, T] "
            "(one row per completion, one column per completion token)."
        )
    for name, other in (
        ("old_logp_NT", old_logp_NT),
        ("ref_logp_NT", ref_logp_NT),
        ("sampler_logp_NT", sampler_logp_NT),
    ):
        if other is not None and other.shape != logp_NT.shape:
            raise ValueError(f"{name} has shape {tuple(other.shape)} but logp_NT has {tuple(logp_NT.shape)}.")
    if adv_N.shape[0] != logp_NT.shape[0]:
        raise ValueError(
            f"adv_N has {adv_N.shape[0]} rows but logp_NT has {logp_NT.shape[0]} completions; pass this "
            "micro-batch's slice of the advantages."
        )
    if beta != 0.0 and ref_logp_NT is None:
        raise ValueError("beta != 0 adds a KL penalty to the reference model, so ref_logp_NT is required.")

    objective = OBJECTIVES.get(preset.objective)
    aggregate = AGGREGATIONS.get(preset.aggregation)
    params = ObjectiveParams(
        epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high,
        delta=delta,
        sapo_temperature_pos=s.sapo_temperature_pos,
        sapo_temperature_neg=s.sapo_temperature_neg,
    )
    mask = mask_NT.to(logp_NT.dtype)
    adv = adv_N.unsqueeze(1) if adv_N.dim() == 1 else adv_N  # [N, 1] broadcasts over tokens
    adv = adv.to(logp_NT.dtype)
    if old_logp_NT is None:
        old_logp_NT = logp_NT.detach()  # on-policy: ratio exactly 1, gradient of logp kept

    log_ratio_NT = logp_NT - old_logp_NT
    if level == "token":
        log_w = log_ratio_NT
    else:  # GSPO (arXiv:2507.18071 eq. 7): geometric mean of the token ratios, differentiable, [N, 1]
        log_w = ((log_ratio_NT * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    ratio = torch.exp(log_w)

    per_token_loss, clip_indicators = objective(ratio, logp_NT, adv, params)
    if off_policy_mask_threshold is not None:
        reference = old_logp_NT if sampler_logp_NT is None else sampler_logp_NT
        per_token_loss = per_token_loss * off_policy_sequence_mask(
            adv, logp_NT, reference, mask_NT, off_policy_mask_threshold
        )
    if top_entropy_quantile < 1.0:
        if entropy_NT is None:
            raise ValueError("top_entropy_quantile < 1 masks tokens by entropy, so entropy_NT is required.")
        per_token_loss = per_token_loss * high_entropy_mask(
            entropy_NT, mask_NT, top_entropy_quantile, entropy_threshold
        )
    if sampler_is_weights_NT is not None:
        per_token_loss = per_token_loss * sampler_is_weights_NT.detach()

    kl_NT = None
    if beta != 0.0:
        kl_NT = KL_ESTIMATORS.get(kl_estimator)(logp_NT, ref_logp_NT)
        if kl_bias_correction:
            kl_NT = kl_NT * ratio  # differentiable ratio, before any delta cap (as TRL)
        per_token_loss = per_token_loss + beta * kl_NT

    loss = aggregate(per_token_loss, mask, geometry)

    with torch.no_grad():
        metrics: dict[str, torch.Tensor] = {name: _masked_mean(flag, mask) for name, flag in clip_indicators.items()}
        if "clip_ratio/low_mean" in clip_indicators:
            low_N = _per_sequence_mean(clip_indicators["clip_ratio/low_mean"], mask)
            high_N = _per_sequence_mean(clip_indicators["clip_ratio/high_mean"], mask)
            metrics["clip_ratio/low_min"] = _nan_reduce(low_N, torch.amin)
            metrics["clip_ratio/high_max"] = _nan_reduce(high_N, torch.amax)
        if kl_NT is not None:
            metrics["kl"] = _masked_mean(kl_NT.detach(), mask)
        if entropy_NT is not None:
            metrics["entropy"] = _masked_mean(entropy_NT.detach(), mask)
        ratio_d = ratio.detach()
        metrics["ratio/mean"] = _masked_mean(ratio_d, mask)
        active = mask.bool() if ratio_d.shape[-1] != 1 else torch.ones_like(ratio_d, dtype=torch.bool)
        ratio_active = ratio_d.expand_as(active)
        metrics["ratio/min"] = _nan_reduce(torch.where(active, ratio_active, math.nan), torch.amin)
        metrics["ratio/max"] = _nan_reduce(torch.where(active, ratio_active, math.nan), torch.amax)
    return loss, metrics


def _nan_reduce(x: torch.Tensor, reduce) -> torch.Tensor:
    """min/max ignoring NaN (TRL's nanmin/nanmax); NaN when every entry is NaN."""
    if x.numel() == 0:
        return torch.full((), math.nan, dtype=x.dtype, device=x.device)
    fill = math.inf if reduce is torch.amin else -math.inf
    out = reduce(torch.nan_to_num(x, nan=fill))
    return torch.where(torch.isnan(x).all(), torch.full_like(out, math.nan), out)
