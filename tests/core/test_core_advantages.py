"""compute_advantages and rewards_from_lists: hand-derived values, properties, errors."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.core import ADVANTAGE_ESTIMATORS, compute_advantages, rewards_from_lists
from rlvr.registry import UnknownNameError

NAN = math.nan


def _t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_group_scaling_by_hand():
    """Group (1, 0, 1, 0): mean 0.5, deviations ±0.5, Bessel variance (4 · 0.25) / 3 = 1/3.
    A = ±0.5 / (sqrt(1/3) + 1e-4) = ±0.86588 (the epsilon is added to the std, not to the variance)."""
    adv = compute_advantages(_t([1, 0, 1, 0]), group_size=4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert torch.allclose(adv, _t([a, -a, a, -a]), rtol=0, atol=1e-12)


def test_population_std_would_fail_the_hand_value():
    """With ddof=0 the std is 0.5 and A would be 0.5/0.5001 = 0.9998: the check above tells them apart."""
    adv = compute_advantages(_t([1, 0, 1, 0]), group_size=4)
    with pytest.raises(AssertionError):
        assert adv[0].item() == pytest.approx(0.5 / (0.5 + 1e-4), abs=1e-6)


def test_none_is_ignored_and_unscorable_gets_zero():
    """Group (1, None, 0): the None row is excluded; scorable (1, 0) has mean 0.5, std sqrt(0.5).
    Group (None, None, None): all-None => every advantage 0, never NaN."""
    adv = compute_advantages(_t([[1], [NAN], [0], [NAN], [NAN], [NAN]]), group_size=3)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert torch.allclose(adv, _t([a, 0, -a, 0, 0, 0]), rtol=0, atol=1e-12)


def test_one_none_among_several_functions_counts_as_zero_for_that_function():
    """TRL sums the *weighted* rewards with nansum: a None from one function contributes 0 to that completion,
    while the completion stays scorable. Rows (1, None) and (0, 1) both total 1 => zero-std group => A = 0."""
    adv = compute_advantages(_t([[1, NAN], [0, 1]]), group_size=2)
    assert torch.equal(adv, _t([0, 0]))


def test_weights_and_no_scaling_by_hand():
    """Weights (1, 2): totals (1 + 2·0, 0 + 2·1) = (1, 2), mean 1.5, "none" => A = (-0.5, 0.5)."""
    adv = compute_advantages(_t([[1, 0], [0, 1]]), group_size=2, weights_K=[1.0, 2.0], scale_rewards="none")
    assert torch.allclose(adv, _t([-0.5, 0.5]), rtol=0, atol=1e-15)
    assert torch.equal(adv, compute_advantages(_t([[1, 0], [0, 1]]), 2, weights_K=[1.0, 2.0], scale_rewards=False))


def test_batch_scaling_by_hand():
    """Groups (1, 0) and (1, 1): group means 0.5 and 1. Batch std of (1, 0, 1, 1): mean 0.75,
    squared deviations 3·0.0625 + 0.5625 = 0.75, Bessel 0.75/3 = 0.25, std 0.5 => A = ±0.5/0.5001, 0, 0."""
    adv = compute_advantages(_t([1, 0, 1, 1]), group_size=2, scale_rewards="batch")
    a = 0.5 / 0.5001
    assert torch.allclose(adv, _t([a, -a, 0, 0]), rtol=0, atol=1e-12)


def test_rloo_by_hand():
    """Leave-one-out, group (1, 0, 0, 1): for a 1 the others average 1/3 => A = 2/3; for a 0, 2/3 => -2/3.
    With a None, group (1, None, 0): each scorable one's only sibling is the baseline => A = ±1, None => 0."""
    adv = compute_advantages(_t([1, 0, 0, 1]), group_size=4, estimator="rloo", scale_rewards="none")
    assert torch.allclose(adv, _t([2 / 3, -2 / 3, -2 / 3, 2 / 3]), rtol=0, atol=1e-15)
    adv = compute_advantages(_t([1, NAN, 0]), group_size=3, estimator="rloo", scale_rewards="none")
    assert torch.allclose(adv, _t([1, 0, -1]), rtol=0, atol=1e-15)


def test_rloo_is_grpo_times_g_over_g_minus_1():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=g, dtype=torch.float64)
    rloo = compute_advantages(rewards, 6, estimator="rloo", scale_rewards="none")
    grpo = compute_advantages(rewards, 6, estimator="grpo", scale_rewards="none")
    assert torch.allclose(rloo, grpo * 6 / 5, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("scale_rewards", ["group", "none"])
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_centred_advantages_sum_to_zero_per_group(scale_rewards, estimator):
    g = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 4, (40, 2), generator=g).double()
    rewards[torch.rand(40, 2, generator=g) < 0.3] = NAN
    adv_BG = compute_advantages(rewards, 8, scale_rewards=scale_rewards, estimator=estimator).view(5, 8)
    assert torch.allclose(adv_BG.sum(1), torch.zeros(5, dtype=torch.float64), atol=1e-12)
    assert adv_BG.abs().sum() > 1


def test_zero_std_group_gives_zero_advantage_not_nan():
    adv = compute_advantages(_t([1, 1, 1, 1]), 4)
    assert torch.equal(adv, torch.zeros(4, dtype=torch.float64))


def test_keeps_dtype_and_accepts_integer_rewards():
    assert compute_advantages(torch.tensor([1.0, 0.0]), 2).dtype == torch.float32
    assert compute_advantages(torch.tensor([1, 0]), 2).dtype == torch.float32


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: compute_advantages(_t([1, 0, 1]), 2), "groups of group_size=2"),
        (lambda: compute_advantages(_t([[1, 0], [0, 1]]), 2, weights_K=[1.0]), "one weight per"),
        (lambda: compute_advantages(_t([1, 0]), 2, scale_rewards="std"), "scale_rewards='std'"),
        (lambda: compute_advantages(_t([1, 0]), 2, multi_objective_aggregation="max"), "normalize_then_sum"),
        (lambda: compute_advantages(torch.zeros(2, 2, 2), 2), r"\[N, K\]"),
    ],
)
def test_bad_input_gets_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_unknown_estimator_lists_valid_ones():
    assert ADVANTAGE_ESTIMATORS.names() == ["grpo", "rloo"]
    with pytest.raises(UnknownNameError, match="grpo, rloo"):
        compute_advantages(_t([1, 0]), 2, estimator="ppo")


def test_rewards_from_lists():
    """Two functions, three completions; None -> NaN; result is [N, K] (completions are rows)."""
    rewards = rewards_from_lists([[1.0, None, 0.5], [0, 1, None]])
    assert rewards.shape == (3, 2)
    assert rewards[0].tolist() == [1.0, 0.0] and rewards[2, 0].item() == 0.5
    assert torch.isnan(rewards[1, 0]) and torch.isnan(rewards[2, 1])


@pytest.mark.parametrize(
    "lists,match",
    [
        ([[1.0, 0.0], [1.0]], "different lengths"),
        ([[1.0, float("nan")]], "Return None"),
        ([[float("inf")]], "finite"),
        ([], "no reward functions"),
    ],
)
def test_rewards_from_lists_rejects_bad_rewards(lists, match):
    with pytest.raises(ValueError, match=match):
        rewards_from_lists(lists)


def test_total_reward_and_zero_spread_one_definition_each():
    """Hand-derived: weights (1, 0.5); a function's None is left out of the sum, a row no function scored
    is NaN (not 0); zero spread compares scorable totals only, at the one ZERO_SPREAD threshold."""
    import math

    from rlvr.core import ZERO_SPREAD, total_reward, zero_spread

    nan = math.nan
    rewards_NK = torch.tensor(
        [[1.0, 1.0], [nan, 2.0], [nan, nan], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [nan, nan], [1.0, 2 * ZERO_SPREAD]],
        dtype=torch.float64,
    )
    total_N = total_reward(rewards_NK, [1.0, 0.5])
    assert total_N[:2].tolist() == [1.5, 1.0] and math.isnan(total_N[2]) and total_N[3] == 0.0
    # groups of 2: [1.5, 1.0] spread; [NaN, 0] one scorable -> zero; [1, 1] zero; [NaN, 1+eps] one scorable -> zero
    assert zero_spread(total_N, 2).tolist() == [False, True, True, True]
    # at the threshold: a spread of exactly ZERO_SPREAD is zero spread, twice it is not
    edge_N = torch.tensor([0.0, ZERO_SPREAD, 0.0, 2 * ZERO_SPREAD], dtype=torch.float64)
    assert zero_spread(edge_N, 2).tolist() == [True, False]
