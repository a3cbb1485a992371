"""Sampler / trainer log-prob mismatch (docs/algorithms.md).

The trainer recomputes ``trainer_logp_NT = log_softmax(logits / T)`` at the sampled tokens; the
engine reported ``sampler_logp_NT`` for the same tokens. On a live-policy engine in the same dtype
they agree to float noise. They drift apart when the sampler runs another precision or kernel
(vLLM in bf16), when it holds stale weights (an OpenAI-compatible server), or when the two disagree
on the distribution (a temperature applied on one side only; a top-p the trainer does not model).
The importance weight ``w = exp(trainer_logp - sampler_logp) = π_train / π_sampler`` is what
truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training") multiplies into the loss, so its distribution is what to watch.

Pure functions over tensors: no ``.item()``, no host sync, except in ``check_mismatch``, which is
the logging-side helper and reads a few scalars.
"""

from __future__ import annotations

import torch

PREFIX = "mismatch/"


def logprob_mismatch_metrics(
    sampler_logp_NT: torch.Tensor, trainer_logp_NT: torch.Tensor, mask_NT: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-batch mismatch statistics over the tokens where ``mask_NT`` is true (0-d float tensors).

    Keys (all under ``mismatch/``; healthy values are for a live-policy engine in the trainer's dtype):

    - ``abs_logp_diff_mean`` / ``abs_logp_diff_max``: |trainer − sampler| log-prob per token.
      Healthy: ~1e-6 (same dtype), ≲ 0.05 mean for a bf16 sampler; large max alone = a few outlier tokens.
    - ``kl``: k3 estimate of KL(sampler ‖ trainer) on the sampled tokens, ``w − log w − 1`` averaged
      (unbiased because tokens come from the sampler). Healthy: < 1e-3.
    - ``is_weight_mean`` / ``_std`` / ``_min`` / ``_max``: token importance weights w. Healthy: mean ≈ 1, std ≪ 1.
    - ``is_weight_frac_outside_2x``: fraction of tokens with w < 0.5 or w > 2. Healthy: ≈ 0.
    - ``seq_is_weight_mean`` / ``_min`` / ``_max``: per-sequence geometric-mean weight exp(mean_t log w)
      (the GSPO sequence ratio). Healthy: all ≈ 1.
    - ``tokens``: how many tokens were compared.
    """
    if sampler_logp_NT.shape != trainer_logp_NT.shape or sampler_logp_NT.shape != mask_NT.shape:
        raise ValueError(
            "sampler_logp_NT, trainer_logp_NT and mask_NT must have the same [N, T] shape; got "
            f"{tuple(sampler_logp_NT.shape)}, {tuple(trainer_logp_NT.shape)}, {tuple(mask_NT.shape)}. "
            "Pad the sampler's per-completion log-prob lists to the trainer's completion length."
        )
    mask_NT = mask_NT.bool()
    mask_f_NT = mask_NT.float()
    # Padding positions may hold anything (even NaN for "no log-prob"); zero them before arithmetic.
    log_w_NT = torch.where(
        mask_NT,
        trainer_logp_NT.detach().float() - sampler_logp_NT.detach().float(),
        0.0,
    )
    n_tokens = mask_f_NT.sum()
    denom = n_tokens.clamp(min=1.0)
    w_NT = log_w_NT.exp()
    abs_NT = log_w_NT.abs()
    k3_NT = w_NT - log_w_NT - 1.0

    w_mean = (w_NT * mask_f_NT).sum() / denom
    w_var = (((w_NT - w_mean) ** 2) * mask_f_NT).sum() / denom
    inf = torch.tensor(float("inf"), device=w_NT.device)
    any_tokens = n_tokens > 0

    def masked_max(x_NT: torch.Tensor) -> torch.Tensor:
        return torch.where(any_tokens, torch.where(mask_NT, x_NT, -inf).max(), 0.0)

    def masked_min(x_NT: torch.Tensor) -> torch.Tensor:
        return torch.where(any_tokens, torch.where(mask_NT, x_NT, inf).min(), 0.0)

    lens_N = mask_f_NT.sum(dim=1)
    has_tokens_N = lens_N > 0
    seq_w_N = (log_w_NT.sum(dim=1) / lens_N.clamp(min=1.0)).exp()
    n_seqs = has_tokens_N.float().sum()
    any_seqs = n_seqs > 0
    seq_max = torch.where(any_seqs, torch.where(has_tokens_N, seq_w_N, -inf).max(), 0.0)
    seq_min = torch.where(any_seqs, torch.where(has_tokens_N, seq_w_N, inf).min(), 0.0)

    outside_NT = ((w_NT < 0.5) | (w_NT > 2.0)) & mask_NT
    return {
        PREFIX + "abs_logp_diff_mean": (abs_NT * mask_f_NT).sum() / denom,
        PREFIX + "abs_logp_diff_max": masked_max(abs_NT),
        PREFIX + "kl": (k3_NT * mask_f_NT).sum() / denom,
        PREFIX + "is_weight_mean": torch.where(any_tokens, w_mean, 1.0),
        PREFIX + "is_weight_std": w_var.sqrt(),
        PREFIX + "is_weight_min": masked_min(w_NT),
        PREFIX + "is_weight_max": masked_max(w_NT),
        PREFIX + "is_weight_frac_outside_2x": outside_NT.float().sum() / denom,
        PREFIX + "seq_is_weight_mean": torch.where(
            any_seqs,
            (seq_w_N * has_tokens_N.float()).sum() / n_seqs.clamp(min=1.0),
            1.0,
        ),
        PREFIX + "seq_is_weight_min": seq_min,
        PREFIX + "seq_is_weight_max": seq_max,
        PREFIX + "tokens": n_tokens,
    }


#: Defaults chosen so a healthy bf16 vLLM sampler (mean |Δ| ~ 0.01–0.03, KL ~ 1e-4–1e-3) stays quiet
#: and a wrong temperature on one side (KL ≳ 0.05 for T = 0.7 vs 1.0 on a peaked policy) does not.
DEFAULT_MAX_KL = 0.01
DEFAULT_MAX_ABS_DIFF_MEAN = 0.1
DEFAULT_MAX_FRAC_OUTSIDE_2X = 0.01


def check_mismatch(
    metrics: dict[str, torch.Tensor],
    *,
    max_kl: float = DEFAULT_MAX_KL,
    max_abs_diff_mean: float = DEFAULT_MAX_ABS_DIFF_MEAN,
    max_frac_outside_2x: float = DEFAULT_MAX_FRAC_OUTSIDE_2X,
) -> str | None:
    """A one-paragraph warning when the mismatch is large, else None. Host sync (reads 3 scalars).

    Call it with the output of ``logprob_mismatch_metrics`` (or a metrics line holding it); the trainer
    prints the message. Thresholds are keyword arguments so a config can expose them. No mismatch keys,
    or no compared token (the engine reported no log-probs for this batch), means nothing to judge: None.
    """
    if PREFIX + "kl" not in metrics or float(metrics.get(PREFIX + "tokens", 1.0)) == 0:
        return None
    kl = float(metrics[PREFIX + "kl"])
    abs_mean = float(metrics[PREFIX + "abs_logp_diff_mean"])
    outside = float(metrics[PREFIX + "is_weight_frac_outside_2x"])
    problems = []
    if kl > max_kl:
        problems.append(f"KL(sampler‖trainer) = {kl:.4g} > {max_kl:g}")
    if abs_mean > max_abs_diff_mean:
        problems.append(f"mean |Δlogp| = {abs_mean:.4g} > {max_abs_diff_mean:g}")
    if outside > max_frac_outside_2x:
        problems.append(
            f"{outside:.2%} of tokens have an importance weight outside [0.5, 2] (limit {max_frac_outside_2x:.2%})"
        )
    if not problems:
        return None
    return (
        "sampler/trainer log-prob mismatch is large: " + "; ".join(problems) + ". The rollouts are "
        "off-policy for the trainer. Usual causes: the sampler and trainer use different temperatures; "
        "top-p / top-k / min-p or a repetition penalty shape the sampling distribution (the trainer "
        "scores the unfiltered one); the sampler holds stale weights (an OpenAI-compatible server "
        "without reloads, or a missed weight sync); or a low-precision sampler. Fix the first two in "
        "the config; for the others enable truncated importance sampling or reload the sampler more often."
    )
