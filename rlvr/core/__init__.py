"""Pure tensor math of GRPO-family training: advantages, per-token objectives, aggregations, KL, log-probs.

Imports torch only. No config objects, no ``.item()``, no collectives: the trainer passes numbers in and
reduces metrics across processes itself. Suffixes: B prompts, G group size, N = B·G completions,
T completion tokens, V vocabulary, K reward functions.

    from rlvr.core import compute_advantages, policy_loss
    adv_N = compute_advantages(rewards_NK, group_size=G)
    loss, metrics = policy_loss(logp_NT, old_logp_NT, adv_N, mask_NT, loss_type="dapo")
"""

from rlvr.core.advantages import (
    ADVANTAGE_ESTIMATORS,
    SCALE_REWARDS,
    ZERO_SPREAD,
    compute_advantages,
    nanstd,
    normalize_scale_rewards,
    rewards_from_lists,
    total_reward,
    zero_spread,
)
from rlvr.core.corrections import (
    SAMPLER_IS_MODES,
    high_entropy_mask,
    off_policy_sequence_mask,
    sampler_importance_weights,
)
from rlvr.core.lm_head import HEAD_KEEP_ELEMENTS, head_logprobs
from rlvr.core.logprobs import completion_mask, entropy_from_logits, token_logprobs
from rlvr.core.loss import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    LossPreset,
    LossSettings,
    loss_type_names,
    policy_loss,
    policy_loss_from,
)
from rlvr.core.objectives import AGGREGATIONS, KL_ESTIMATORS, OBJECTIVES, BatchGeometry, ObjectiveParams

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_TYPES",
    "OBJECTIVES",
    "SAMPLER_IS_MODES",
    "SCALE_REWARDS",
    "ZERO_SPREAD",
    "BatchGeometry",
    "LossPreset",
    "LossSettings",
    "ObjectiveParams",
    "completion_mask",
    "compute_advantages",
    "entropy_from_logits",
    "HEAD_KEEP_ELEMENTS",
    "head_logprobs",
    "high_entropy_mask",
    "loss_type_names",
    "nanstd",
    "normalize_scale_rewards",
    "off_policy_sequence_mask",
    "policy_loss",
    "policy_loss_from",
    "rewards_from_lists",
    "sampler_importance_weights",
    "token_logprobs",
    "total_reward",
    "zero_spread",
]
