"""Optional per-token weights and masks applied to the objective before aggregation (as TRL 1.16 does).

- :func:`sampler_importance_weights`: the rollout engine (vLLM, llama.cpp, a stale server) samples from a
  policy that is numerically or actually different from the trainer's; weight each token (or sequence) by
  ``π_old / π_sampler``, truncated or masked (Yao et al., "Your efficient RL framework secretly brings you
  off-policy RL training", 2025; TRL's ``vllm_importance_sampling_*``).
- :func:`high_entropy_mask`: train only on the top-ρ highest-entropy tokens ("Beyond the 80/20 rule",
  arXiv:2506.01939; TRL's ``top_entropy_quantile``).
- :func:`off_policy_sequence_mask`: drop negative-advantage sequences that drifted too far from the sampler
  (DeepSeek-V3.2, arXiv:2512.02556 eq. 9; TRL's ``off_policy_mask_threshold``).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "SAMPLER_IS_MODES",
    "high_entropy_mask",
    "off_policy_sequence_mask",
    "sampler_importance_weights",
]

SAMPLER_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@torch.no_grad()
def sampler_importance_weights(
    old_logp_NT: torch.Tensor,
    sampler_logp_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    mode: str = "sequence_mask",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights ``π_old / π_sampler`` correcting for sampling with another engine, and their metrics.

    ``old_logp_NT`` are the trainer's log-probs of the sampled tokens under the sampling-time weights (an
    extra no-grad forward pass the trainer must run whenever this correction is on); ``sampler_logp_NT`` are
    what the engine reported (NaN where it could not score a token: that token then gets no correction).

    Modes (TRL 1.16 ``vllm_importance_sampling_mode``, default "sequence_mask", ``clip_max`` default 3.0):
    ``token_*`` use one ratio per token; ``sequence_*`` use ``exp(Σ_t (old - sampler))`` per sequence, the
    product of the token ratios. ``*_truncate`` clamps the ratio to [clip_min, clip_max]; ``*_mask`` sets
    ratios outside it to 0 (the token or whole sequence is dropped from the loss).

    Returns ``is_weights_NT`` ([N, T] for token modes, [N, 1] for sequence modes; pass it to
    ``policy_loss(sampler_is_weights_NT=...)``) and 0-dim metrics named as TRL logs them:
    ``sampling/sampling_logp_difference/{mean,max}`` (|old - sampler| over scored active tokens) and
    ``sampling/importance_sampling_ratio/{min,mean,max}`` (over active tokens, or over sequences). Metric
    values are local to this process; reduce mean / min / max across processes to match TRL's logs.
    """
    if mode not in SAMPLER_IS_MODES:
        raise ValueError(f"unknown sampler importance-sampling mode {mode!r}; valid: {', '.join(SAMPLER_IS_MODES)}.")
    if mode.endswith("_truncate") and clip_min is None and clip_max is None:
        raise ValueError(f"mode={mode!r} truncates the ratio, so it needs clip_max and/or clip_min (both are None).")
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise ValueError(f"clip_min ({clip_min}) must be less than clip_max ({clip_max}).")
    if old_logp_NT.shape != sampler_logp_NT.shape or old_logp_NT.shape != mask_NT.shape:
        raise ValueError(
            f"old_logp_NT {tuple(old_logp_NT.shape)}, sampler_logp_NT {tuple(sampler_logp_NT.shape)} and mask_NT "
            f"{tuple(mask_NT.shape)} must have the same [N, T] shape (pad the sampler's log-probs like the "
            "completions)."
        )
    old_logp_NT = old_logp_NT.detach()
    mask = mask_NT.to(old_logp_NT.dtype)
    # Unscorable tokens (NaN from the engine) get difference 0, so ratio exactly 1: no correction, no NaN.
    log_diff_NT = torch.nan_to_num((old_logp_NT - sampler_logp_NT) * mask, nan=0.0)
    sequence_level = mode.startswith("sequence")
    log_diff = log_diff_NT.sum(dim=-1, keepdim=True) if sequence_level else log_diff_NT
    ratio = torch.exp(log_diff)
    if mode.endswith("_truncate"):
        weights = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        lo = -math.inf if clip_min is None else clip_min
        hi = math.inf if clip_max is None else clip_max
        weights = ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)

    active = mask_NT.bool()
    abs_diff_NT = (old_logp_NT - sampler_logp_NT).abs()
    scored = active & ~torch.isnan(abs_diff_NT)
    n_scored = scored.sum().clamp(min=1)
    zero = torch.zeros((), dtype=old_logp_NT.dtype, device=old_logp_NT.device)
    diff_mean = torch.where(scored, abs_diff_NT, zero).sum() / n_scored
    diff_max = torch.where(scored, abs_diff_NT, zero).amax() if abs_diff_NT.numel() else zero
    if sequence_level:
        flat = weights.reshape(-1)
        w_min, w_max, w_mean = flat.amin(), flat.amax(), flat.mean()
    else:
        n_active = active.sum().clamp(min=1)
        w_mean = torch.where(active, weights, zero).sum() / n_active
        w_min = torch.where(active, weights, torch.full_like(weights, math.inf)).amin()
        w_max = torch.where(active, weights, torch.full_like(weights, -math.inf)).amax()
        any_active = active.any()
        w_min, w_max = torch.where(any_active, w_min, zero), torch.where(any_active, w_max, zero)
    metrics = {
        "sampling/sampling_logp_difference/mean": diff_mean,
        "sampling/sampling_logp_difference/max": diff_max,
        "sampling/importance_sampling_ratio/min": w_min,
        "sampling/importance_sampling_ratio/mean": w_mean,
        "sampling/importance_sampling_ratio/max": w_max,
    }
    return weights, metrics


@torch.no_grad()
def high_entropy_mask(
    entropy_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    top_entropy_quantile: float,
    threshold: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Boolean [N, T]: active tokens whose entropy is at or above the (1 - ρ) quantile of active-token entropies.

    TRL takes the quantile over the active tokens of *all processes* (a gather). This function is local: with
    several processes, compute the threshold from the gathered entropies yourself and pass ``threshold=``.
    """
    if not 0.0 <= top_entropy_quantile <= 1.0:
        raise ValueError(
            f"top_entropy_quantile must be in [0, 1] (0.2 is the paper's value); got {top_entropy_quantile}."
        )
    active = mask_NT.bool()
    if threshold is None:
        # NaN-out padding and take nanquantile: same value as TRL's quantile of entropy[mask] (in float32),
        # without the host sync that boolean indexing costs. No active token => NaN => nothing kept.
        values = entropy_NT.float().masked_fill(~active, float("nan")).reshape(-1)
        threshold = torch.nanquantile(values, 1.0 - top_entropy_quantile)
    return ((entropy_NT * mask_NT) >= threshold) & active


@torch.no_grad()
def off_policy_sequence_mask(
    adv: torch.Tensor,
    logp_NT: torch.Tensor,
    sampler_logp_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """[N, 1] of 1.0 (keep) / 0.0 (drop): drop a sequence when its advantage is negative *and* its mean
    ``log π_sampler - log π_θ`` over active tokens exceeds ``threshold`` (DeepSeek-V3.2 off-policy masking)."""
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    mask = mask_NT.to(logp_NT.dtype)
    kl_NT = torch.nan_to_num(sampler_logp_NT - logp_NT.detach(), nan=0.0)
    seq_kl_N1 = (kl_NT * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((adv >= 0) | (seq_kl_N1 <= threshold)).to(mask.dtype)
