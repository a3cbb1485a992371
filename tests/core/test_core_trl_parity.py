"""rlvr.core vs TRL 1.16's own GRPOTrainer code: same settings => same loss, gradient, metrics, advantages.

TRL is a test-only dependency; its methods are called on a trainer built without ``__init__``
(see trl_reference.py), in float64, so a 1e-10 tolerance leaves room for summation order only.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

pytest.importorskip("trl")

from trl_reference import trl_advantages, trl_compute_loss, trl_generate_and_score  # noqa: E402

from rlvr.core import (  # noqa: E402
    LOSS_TYPES,
    compute_advantages,
    loss_type_names,
    policy_loss,
    sampler_importance_weights,
)

TOL = 1e-10
N, T, MAX_LEN = 6, 7, 9


def _batch(seed: int, off_policy: bool):
    """Fixed random micro-batch: ragged masks (one empty row), ratios spread enough to hit every clip branch."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.4 * torch.randn(N, T, generator=g, dtype=torch.float64) if off_policy else None
    ref = logp + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
    lengths = torch.tensor([7, 3, 5, 1, 0, 6])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    adv[2] = 0.0  # a zero-advantage row exercises the A > 0 / A < 0 branches' boundary
    entropy = torch.rand(N, T, generator=g, dtype=torch.float64) * 2
    return logp, old, ref, mask, adv, entropy


def _compare(ours_kwargs: dict, trl_kwargs: dict, seed: int, off_policy: bool, check_metrics: bool = True):
    logp, old, ref, mask, adv, entropy = _batch(seed, off_policy)
    common = dict(ref_logp_NT=ref if ours_kwargs.get("beta", 0.0) else None)
    logp_ours = logp.clone().requires_grad_()
    loss_ours, metrics = policy_loss(logp_ours, old, adv, mask, entropy_NT=entropy, **common, **ours_kwargs)
    loss_ours.backward()

    logp_trl = logp.clone().requires_grad_()
    loss_trl, trl_metrics = trl_compute_loss(
        logp_trl, old, adv, mask, entropy_NT=entropy, ref_logp_NT=ref, **trl_kwargs
    )
    loss_trl.backward()

    assert torch.allclose(loss_ours, loss_trl, rtol=0, atol=TOL), (loss_ours.item(), loss_trl.item())
    assert torch.allclose(logp_ours.grad, logp_trl.grad, rtol=0, atol=TOL)
    assert logp_ours.grad.abs().sum() > 0  # the comparison is not vacuous
    if check_metrics:
        shared = set(metrics) & set(trl_metrics)
        assert {"entropy"} <= shared
        for name in shared:
            theirs = trl_metrics[name][-1]
            # TRL turns clip indicators into float32 before averaging: agreement to float32 precision.
            assert math.isclose(metrics[name].item(), theirs, rel_tol=1e-6, abs_tol=1e-9) or (
                math.isnan(theirs) and math.isnan(metrics[name].item())
            ), name
    return loss_ours, logp_ours.grad


VARIANTS = {
    "symmetric": dict(epsilon=0.2),
    "clip_higher": dict(epsilon=0.2, epsilon_high=0.28),
    "two_sided": dict(epsilon=0.2, epsilon_high=0.28, delta=1.25),
}
GRID = list(
    itertools.product(loss_type_names(), (0.0, 0.04), ("token", "sequence"), (1, 3), (False, True), sorted(VARIANTS))
)


@pytest.mark.parametrize("loss_type,beta,level,ga,off_policy,variant", GRID)
def test_policy_loss_matches_trl(loss_type, beta, level, ga, off_policy, variant):
    preset = LOSS_TYPES.get(loss_type)
    steps_per_generation = 2 if ga > 1 else 1  # != GA on purpose: the dapo normaliser has both factors
    _, _, _, mask, _, _ = _batch(0, off_policy)
    num_items = mask.sum() * steps_per_generation + 5  # the generation batch holds more tokens than this micro-batch
    shared = dict(
        beta=beta,
        importance_sampling_level=level,
        max_completion_length=MAX_LEN,
        num_items_in_batch=num_items,
        gradient_accumulation_steps=ga,
        steps_per_generation=steps_per_generation,
        **VARIANTS[variant],
    )
    _compare(
        dict(loss_type=loss_type, **shared),
        dict(loss_type=preset.trl_loss_type, **shared),
        seed=GRID.index((loss_type, beta, level, ga, off_policy, variant)),
        off_policy=off_policy,
    )


EXTRAS = {
    "no_kl_bias_correction": (dict(beta=0.1, kl_bias_correction=False), dict(beta=0.1, use_bias_correction_kl=False)),
    "sapo_temperatures": (
        dict(sapo_temperature_pos=0.7, sapo_temperature_neg=2.0),
        dict(sapo_temperature_pos=0.7, sapo_temperature_neg=2.0),
    ),
    "cispo_eps_max": (dict(epsilon_high=1.3), dict(epsilon_high=1.3)),
    "top_entropy": (dict(top_entropy_quantile=0.3), dict(top_entropy_quantile=0.3)),
    "off_policy_mask": (dict(off_policy_mask_threshold=0.05), dict(off_policy_mask_threshold=0.05)),
}


@pytest.mark.parametrize("loss_type", loss_type_names())
@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_optional_terms_match_trl(loss_type, extra):
    ours, theirs = EXTRAS[extra]
    preset = LOSS_TYPES.get(loss_type)
    geometry = dict(max_completion_length=MAX_LEN, num_items_in_batch=torch.tensor(40), gradient_accumulation_steps=2)
    _compare(
        dict(loss_type=loss_type, **geometry, **ours),
        dict(
            loss_type=preset.trl_loss_type,
            importance_sampling_level=preset.importance_sampling_level,
            **geometry,
            **theirs,
        ),
        seed=7,
        off_policy=True,
    )


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min", [None, 0.5])
def test_sampler_importance_weights_match_trl(mode, clip_min):
    """Weights and metrics vs TRL's vLLM correction, including a token the engine could not score (NaN)."""
    g = torch.Generator().manual_seed(3)
    lengths = [4, 2, 3, 1]
    Tn = max(lengths)
    old = -torch.rand(4, Tn, generator=g, dtype=torch.float64) * 2
    noise = 0.8 * torch.randn(4, Tn, generator=g, dtype=torch.float64)
    rows = [[(old[n, t] + noise[n, t]).item() for t in range(L)] for n, L in enumerate(lengths)]
    rows[0][1] = None  # unscorable token: TRL maps it to NaN and gives it ratio 1
    out, trl_metrics = trl_generate_and_score(
        torch.zeros(4, 1, dtype=torch.float64),
        group_size=2,
        completion_lengths=lengths,
        old_logp_NT=old,
        sampler_logp_rows=rows,
        is_mode=mode,
        is_clip_min=clip_min,
        is_clip_max=1.8,
    )
    sampler = out["sampling_per_token_logps"]
    weights, metrics = sampler_importance_weights(
        old, sampler, out["completion_mask"], mode=mode, clip_min=clip_min, clip_max=1.8
    )
    trl_weights = out["importance_sampling_ratio"]
    assert weights.shape == trl_weights.shape
    assert torch.allclose(weights, trl_weights, rtol=0, atol=TOL)
    assert (weights != 1).any()  # something was actually reweighted
    for name, value in metrics.items():
        assert math.isclose(value.item(), trl_metrics[name][-1], rel_tol=1e-9, abs_tol=1e-12), name


@pytest.mark.parametrize("loss_type", ["dapo", "gspo"])
def test_sampler_weights_in_loss_match_trl(loss_type):
    """``policy_loss(sampler_is_weights_NT=...)`` multiplies them in where TRL does (before the KL term)."""
    g = torch.Generator().manual_seed(11)
    weights = torch.rand(N, T, generator=g, dtype=torch.float64) * 2
    preset = LOSS_TYPES.get(loss_type)
    geometry = dict(num_items_in_batch=torch.tensor(30), beta=0.05)
    _compare(
        dict(loss_type=loss_type, sampler_is_weights_NT=weights, **geometry),
        dict(
            loss_type=preset.trl_loss_type,
            importance_sampling_level=preset.importance_sampling_level,
            importance_sampling_ratio=weights,
            **geometry,
        ),
        seed=5,
        off_policy=True,
    )


def _rewards_with_none(seed: int, B: int, G: int, K: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (B * G, K), generator=g).to(torch.float64) / 2
    none = torch.rand(B * G, K, generator=g) < 0.25
    rewards[none] = math.nan
    rewards[0] = math.nan  # an unscorable completion
    rewards[G : 2 * G] = math.nan  # an all-None group
    rewards[2 * G : 3 * G, :] = 0.5  # a zero-std group
    return rewards


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_advantages_match_trl(scale_rewards, aggregation):
    """Float32 (what reward tensors are in practice): bit-for-bit TRL, None rewards included."""
    rewards = _rewards_with_none(seed=1, B=5, G=4, K=3).float()
    weights = torch.tensor([1.0, 0.5, -0.25])
    kwargs = dict(weights_K=weights, scale_rewards=scale_rewards, multi_objective_aggregation=aggregation)
    ours = compute_advantages(rewards, 4, **kwargs)
    theirs = trl_advantages(rewards, 4, **kwargs)
    assert torch.equal(ours, theirs)
    assert ours[0] == 0 and (ours[4:8] == 0).all()  # unscorable and all-None get exactly 0
    assert ours.abs().sum() > 1  # not trivially all zeros


def test_advantages_float64_match_trl_to_its_float32_bessel_factor():
    """In float64 TRL's ``count / (count - 1)`` is an int64 division, so float32 (4/3 -> 1.3333333731);
    rlvr keeps it in float64. The advantages then agree to float32 precision, not to 1e-10."""
    rewards = _rewards_with_none(seed=1, B=5, G=4, K=3)
    ours = compute_advantages(rewards, 4)
    theirs = trl_advantages(rewards, 4)
    assert torch.allclose(ours, theirs, rtol=1e-7, atol=0)
    assert not torch.equal(ours, theirs)  # documents the difference; if TRL fixes it, tighten the test above


@pytest.mark.parametrize("flag,name", [(True, "group"), (False, "none")])
def test_boolean_scale_rewards_matches_trl(flag, name):
    rewards = _rewards_with_none(seed=2, B=4, G=3, K=1).float()
    assert torch.equal(
        compute_advantages(rewards, 3, scale_rewards=flag), trl_advantages(rewards, 3, scale_rewards=name)
    )


def test_parity_harness_detects_a_wrong_setting():
    """The harness can fail: epsilon_high 0.28 vs TRL at 0.2 differs on this batch."""
    with pytest.raises(AssertionError):
        _compare(
            dict(loss_type="dapo", epsilon_high=0.28, num_items_in_batch=torch.tensor(30)),
            dict(loss_type="dapo", epsilon_high=0.2, num_items_in_batch=torch.tensor(30)),
            seed=0,
            off_policy=True,
        )
    with pytest.raises(AssertionError):  # wrong num_items_in_batch
        _compare(
            dict(loss_type="dapo", num_items_in_batch=torch.tensor(31)),
            dict(loss_type="dapo", num_items_in_batch=torch.tensor(30)),
            seed=0,
            off_policy=False,
        )
    rewards = _rewards_with_none(seed=1, B=5, G=4, K=1).float()
    assert not torch.allclose(compute_advantages(rewards, 4, scale_rewards="batch"), trl_advantages(rewards, 4))


@pytest.mark.parametrize("scale_rewards,normalize", [("none", False), ("batch", True)])
def test_rloo_advantages_match_trl_rloo_trainer(scale_rewards, normalize):
    """estimator="rloo" is TRL's RLOOTrainer: "none" = its default, "batch" = normalize_advantages=True."""
    from trl_reference import trl_rloo_advantages

    rewards = _rewards_with_none(seed=4, B=5, G=4, K=2).float()
    ours = compute_advantages(rewards, 4, estimator="rloo", scale_rewards=scale_rewards)
    theirs = trl_rloo_advantages(rewards, 4, normalize_advantages=normalize)
    assert torch.equal(ours, theirs)
    assert ours.abs().sum() > 1
