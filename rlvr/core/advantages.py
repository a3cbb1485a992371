"""Rewards -> advantages, group-relative (GRPO) or leave-one-out (RLOO).

Shapes: ``rewards_NK`` holds one row per completion (N = B·G, groups of G consecutive rows share a prompt)
and one column per reward function (K). A reward function that could not score a completion returns
``None``; it is stored as NaN here and ignored for that completion. A completion that *no* function
could score is unscorable: it is left out of its group's baseline and its advantage is 0.

Numerics follow TRL 1.16 ``GRPOTrainer._generate_and_score_completions`` exactly (same config name,
same number): Bessel-corrected (ddof=1) std, and the 1e-4 epsilon *added* to the std, not under the root.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from rlvr.registry import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "STD_EPSILON",
    "SCALE_REWARDS",
    "ZERO_SPREAD",
    "compute_advantages",
    "nanstd",
    "normalize_scale_rewards",
    "rewards_from_lists",
    "total_reward",
    "zero_spread",
]

STD_EPSILON = 1e-4  # added to the std (TRL 1.16), so a zero-std group gives A = 0 / 1e-4 = 0, never NaN
SCALE_REWARDS = ("group", "batch", "none")
#: A group whose scorable total rewards differ by no more than this has zero spread: every advantage in it
#: is 0 (up to the 1e-4 std epsilon), so it carries no gradient. One threshold for DAPO's filter and the metrics.
ZERO_SPREAD = 1e-6

AdvantageEstimator = Callable[[torch.Tensor, int, str], torch.Tensor]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


def rewards_from_lists(
    rewards_per_func: Sequence[Sequence[float | None]], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Stack what K reward functions returned (K lists of N values, ``None`` = not scorable) into ``rewards_NK``.

    ``None`` becomes NaN, which :func:`compute_advantages` ignores. A NaN or infinite *float* is rejected:
    it is almost always a bug in the reward function, and silently treating it as "not scorable" would hide it.
    """
    if len(rewards_per_func) == 0:
        raise ValueError("rewards_from_lists got no reward functions; pass one list of rewards per reward function.")
    lengths = {len(values) for values in rewards_per_func}
    if len(lengths) != 1:
        raise ValueError(
            f"reward functions returned lists of different lengths {sorted(lengths)}; every reward function must "
            "return exactly one value (or None) per completion, in the order the completions were given."
        )
    rows: list[list[float]] = []
    for k, values in enumerate(rewards_per_func):
        row = []
        for n, value in enumerate(values):
            if value is None:
                row.append(math.nan)
                continue
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(
                    f"reward function #{k} returned {value} for completion #{n}; rewards must be finite numbers. "
                    "Return None when a completion cannot be scored (it is then ignored for that function)."
                )
            row.append(value)
        rows.append(row)
    return torch.tensor(rows, dtype=dtype).T.contiguous()  # [K, N] -> [N, K]


def total_reward(rewards_NK: torch.Tensor, weights_K: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """[N] weighted sum over the reward functions that could score each completion; NaN for a completion
    that no function could score (an unscorable row is left out of every mean, never counted as 0)."""
    weights_K = torch.as_tensor(weights_K, dtype=rewards_NK.dtype, device=rewards_NK.device)
    unscorable_N = torch.isnan(rewards_NK).all(dim=1)
    return (rewards_NK * weights_K).nansum(dim=1).masked_fill(unscorable_N, math.nan)


def zero_spread(total_N: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] bool: the group's scorable total rewards differ by at most ``ZERO_SPREAD`` (a group with fewer
    than two scorable completions has no spread either)."""
    total_BG = total_N.view(-1, group_size)
    scorable_BG = ~torch.isnan(total_BG)
    spread_B = torch.where(scorable_BG, total_BG, -math.inf).amax(dim=1) - torch.where(
        scorable_BG, total_BG, math.inf
    ).amin(dim=1)
    return (scorable_BG.sum(dim=1) < 2) | (spread_B <= ZERO_SPREAD)


def normalize_scale_rewards(scale_rewards: str | bool) -> str:
    """TRL accepts ``True`` for "group" and ``False`` for "none"; return the string form or raise."""
    if scale_rewards is True:
        return "group"
    if scale_rewards is False:
        return "none"
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(
            f"scale_rewards={scale_rewards!r} is not valid; use one of {', '.join(SCALE_REWARDS)} "
            "(or True for 'group', False for 'none', as in TRL)."
        )
    return scale_rewards


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Bessel-corrected (ddof=1) std ignoring NaNs; NaN where fewer than two values are present."""
    dims = tuple(range(x.dim())) if dim is None else (dim,)
    mean = torch.nanmean(x, dim=dims, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dims, keepdim=True)
    # Correction factor computed first and in x's dtype: in float32 this is bit-for-bit TRL's nanstd.
    var = torch.nanmean((x - mean) ** 2, dim=dims, keepdim=True) * (count.to(x.dtype) / (count - 1).to(x.dtype))
    var = torch.where(count > 1, var, torch.full_like(var, math.nan))
    std = var.sqrt()
    if keepdim:
        return std
    return std.squeeze(dim) if dim is not None else std.reshape(())


def _std_for_scaling(rewards_BG: torch.Tensor, scale_rewards: str) -> torch.Tensor:
    """Std each completion's advantage is divided by, shape [B, G] (NaN for groups with < 2 scorable rewards)."""
    if scale_rewards == "batch":
        if rewards_BG.numel() > 1:
            return nanstd(rewards_BG).expand_as(rewards_BG)
        return torch.zeros_like(rewards_BG)
    if rewards_BG.shape[1] > 1:  # "group"
        return nanstd(rewards_BG, dim=1, keepdim=True).expand_as(rewards_BG)
    return torch.zeros_like(rewards_BG)  # G == 1 happens only in evaluation; TRL then divides by 0 + 1e-4


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards_BG: torch.Tensor, group_size: int, scale_rewards: str) -> torch.Tensor:
    """GRPO (Shao et al. 2024, arXiv:2402.03300 §4.1.2): reward minus the group mean, optionally over a std.

    ``scale_rewards="batch"`` keeps the group mean but uses the std of the whole generation batch
    (PPO-Lite, arXiv:2508.08221); ``"none"`` is Dr. GRPO's choice (arXiv:2503.20783 §3.1), which removes the
    bias toward too-easy and too-hard questions that a per-group std introduces.
    """
    adv_BG = rewards_BG - torch.nanmean(rewards_BG, dim=1, keepdim=True)
    if scale_rewards != "none":
        adv_BG = adv_BG / (_std_for_scaling(rewards_BG, scale_rewards) + STD_EPSILON)
    return adv_BG


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(rewards_BG: torch.Tensor, group_size: int, scale_rewards: str) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): reward minus the mean of the *other* scorable completions.

    Matches TRL 1.16 ``RLOOTrainer``: ``scale_rewards="none"`` is its default, ``"batch"`` is its
    ``normalize_advantages=True`` (centre and scale over the whole batch). ``"group"`` divides by the group std
    (+1e-4) like GRPO; since the leave-one-out advantage is G/(G-1) times the group-centred one, that is GRPO's
    advantage scaled by G/(G-1).
    """
    scorable_B1 = (~torch.isnan(rewards_BG)).sum(dim=1, keepdim=True)
    if group_size > 1:
        # (sum of the group - own reward) / (scorable siblings); 0/0 = NaN for a lone scorable completion -> 0 later.
        baseline_BG = (torch.nansum(rewards_BG, dim=1, keepdim=True) - rewards_BG) / (scorable_B1 - 1)
        adv_BG = rewards_BG - baseline_BG
    else:
        adv_BG = torch.zeros_like(rewards_BG)
    if scale_rewards == "batch":
        adv_BG = (adv_BG - torch.nanmean(adv_BG)) / (nanstd(adv_BG) + STD_EPSILON)
    elif scale_rewards == "group":
        adv_BG = adv_BG / (_std_for_scaling(rewards_BG, "group") + STD_EPSILON)
    return adv_BG


def compute_advantages(
    rewards_NK: torch.Tensor,
    group_size: int,
    weights_K: torch.Tensor | Sequence[float] | None = None,
    scale_rewards: str | bool = "group",
    estimator: str = "grpo",
    multi_objective_aggregation: str = "sum_then_normalize",
) -> torch.Tensor:
    """One advantage per completion, ``adv_N``, from the rewards of N = B·G completions.

    Args:
        rewards_NK: [N, K] (or [N] for one reward function) rewards; NaN = that function returned ``None``.
            Rows are grouped by prompt: rows ``g*G .. g*G+G-1`` are the G completions of prompt ``g``. For the
            group and batch statistics to be right, pass the *whole* generation batch (all processes), then
            slice out this process's rows, exactly as TRL does.
        group_size: G, completions per prompt (TRL's ``num_generations``).
        weights_K: per-function weights (TRL's ``reward_weights``); default all 1.
        scale_rewards: "group" (TRL default) | "batch" | "none", or True/False as in TRL.
        estimator: a name in ``ADVANTAGE_ESTIMATORS`` ("grpo", "rloo").
        multi_objective_aggregation: "sum_then_normalize" (TRL default: weighted sum, then the estimator) or
            "normalize_then_sum" (GDPO, arXiv:2601.05242: normalise each function within its group, weighted
            sum, then normalise over the batch; grpo estimator only, ``scale_rewards`` ignored, as in TRL).

    Unscorable completions (every function NaN) are excluded from every mean and std, and get advantage 0;
    so does any completion whose advantage is undefined (e.g. the only scorable one in its group with std
    scaling). Pure function: no host sync, works on any device, keeps the input's floating dtype.
    """
    if rewards_NK.dim() == 1:
        rewards_NK = rewards_NK.unsqueeze(1)
    if rewards_NK.dim() != 2:
        raise ValueError(f"rewards_NK must have shape [N, K] (or [N]); got {tuple(rewards_NK.shape)}.")
    if not rewards_NK.is_floating_point():
        rewards_NK = rewards_NK.float()
    N, K = rewards_NK.shape
    if group_size < 1 or N % group_size != 0:
        raise ValueError(
            f"{N} completions cannot be split into groups of group_size={group_size}; the generation batch must "
            "hold whole groups (N = prompts x num_generations), with each prompt's completions in consecutive rows."
        )
    if weights_K is None:
        weights_K = torch.ones(K, dtype=rewards_NK.dtype, device=rewards_NK.device)
    weights_K = torch.as_tensor(weights_K, dtype=rewards_NK.dtype, device=rewards_NK.device)
    if weights_K.shape != (K,):
        raise ValueError(
            f"weights_K has shape {tuple(weights_K.shape)} but there are {K} reward functions; pass one weight per "
            "reward function (TRL's reward_weights), in the same order."
        )
    scale_rewards = normalize_scale_rewards(scale_rewards)
    estimate = ADVANTAGE_ESTIMATORS.get(estimator)
    unscorable_N = torch.isnan(rewards_NK).all(dim=1)

    if multi_objective_aggregation == "sum_then_normalize":
        rewards_N = total_reward(rewards_NK, weights_K)  # unscorable rows NaN: they do not drag the group mean
        adv_N = estimate(rewards_N.view(-1, group_size), group_size, scale_rewards).reshape(N)
    elif multi_objective_aggregation == "normalize_then_sum":
        if estimator != "grpo":
            raise ValueError("multi_objective_aggregation='normalize_then_sum' is defined for the grpo estimator only.")
        rewards_BGK = rewards_NK.view(-1, group_size, K)
        if group_size > 1:
            std_B1K = nanstd(rewards_BGK, dim=1, keepdim=True)
        else:
            std_B1K = torch.zeros_like(rewards_BGK[:, :1])
        normed_NK = ((rewards_BGK - torch.nanmean(rewards_BGK, dim=1, keepdim=True)) / (std_B1K + STD_EPSILON)).view(
            N, K
        )
        rewards_N = (normed_NK * weights_K).nansum(dim=1).masked_fill(unscorable_N, math.nan)
        std = nanstd(rewards_N) if N > 1 else torch.zeros((), dtype=rewards_N.dtype, device=rewards_N.device)
        adv_N = (rewards_N - torch.nanmean(rewards_N)) / (std + STD_EPSILON)
    else:
        raise ValueError(
            f"multi_objective_aggregation={multi_objective_aggregation!r} is not valid; use 'sum_then_normalize' "
            "(default) or 'normalize_then_sum'."
        )
    # Unscorable completions carry no signal: advantage 0 rather than NaN, so they move nothing.
    return torch.nan_to_num(adv_N, nan=0.0)
