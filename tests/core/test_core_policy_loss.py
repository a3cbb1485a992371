"""policy_loss: hand-derived values, properties over every preset, registry behaviour, input errors."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.core import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOSS_TYPES,
    OBJECTIVES,
    LossPreset,
    loss_type_names,
    policy_loss,
)
from rlvr.registry import UnknownNameError

LN2 = math.log(2.0)


def _log(p: list[list[float]]) -> torch.Tensor:
    return torch.tensor(p, dtype=torch.float64).log()


# --- hand-derived values -------------------------------------------------------------------------------


def test_clipped_surrogate_by_hand():
    """One completion, two tokens. π = (0.5, 0.25), π_old = (0.25, 0.25) => ratios r = (2, 1).

    A = +1, ε = 0.2: token 1: min(2·1, clip(2)=1.2·1) = 1.2; token 2: min(1, 1) = 1 => losses (-1.2, -1).
    dapo with N_items = 2: (-1.2 - 1) / 2 = -1.1. Token 1 was clipped from above: high clip ratio 1/2.
    A = -1: token 1: min(-2, -1.2) = -2 (PPO's pessimism: the unclipped branch) => losses (2, 1) -> 1.5.
    """
    logp, old = _log([[0.5, 0.25]]), _log([[0.25, 0.25]])
    mask = torch.ones(1, 2)
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), mask, loss_type="dapo", epsilon=0.2)
    assert loss.item() == pytest.approx(-1.1, abs=1e-12)
    assert m["clip_ratio/high_mean"].item() == pytest.approx(0.5)
    assert m["clip_ratio/low_mean"].item() == 0.0
    assert m["clip_ratio/region_mean"].item() == pytest.approx(0.5)
    assert m["ratio/mean"].item() == pytest.approx(1.5)  # (2 + 1) / 2
    assert m["ratio/max"].item() == pytest.approx(2.0) and m["ratio/min"].item() == pytest.approx(1.0)
    loss, m = policy_loss(logp, old, torch.tensor([-1.0]), mask, loss_type="dapo", epsilon=0.2)
    assert loss.item() == pytest.approx(1.5, abs=1e-12)
    assert m["clip_ratio/high_mean"].item() == 0.0  # r > 1+ε but A < 0: not clipped, gradient flows


def test_hand_derivation_fails_for_a_wrong_epsilon():
    """The value above pins epsilon: with ε = 0.3 token 1 becomes 1.3 and the loss -1.15."""
    logp, old = _log([[0.5, 0.25]]), _log([[0.25, 0.25]])
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2), loss_type="dapo", epsilon=0.3)
    assert loss.item() == pytest.approx(-1.15, abs=1e-12)
    with pytest.raises(AssertionError):
        assert loss.item() == pytest.approx(-1.1, abs=1e-12)


def test_delta_caps_the_unclipped_branch():
    """Ratio 2, A = -1: plain PPO picks -2·(-1)... i.e. loss 2; delta = 1.5 caps r first: loss 1.5 (INTELLECT-2)."""
    logp, old = _log([[0.5]]), _log([[0.25]])
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 1), loss_type="bnpo", delta=1.5)
    assert loss.item() == pytest.approx(1.5, abs=1e-12)


def test_aggregations_by_hand():
    """Two completions with per-token loss -A·r = -1 on every active token (on-policy, A = 1):
    lengths 1 and 3, T = 4, max_completion_length 8.

    grpo: mean(1/1·(-1), 3/3·(-1)) = -1.  bnpo: -4/4 = -1.  dr_grpo: -4 / (2·8) = -0.25.
    dapo with num_items 10 over 2 processes, GA 2, steps_per_generation 4: -4 / (10/2·2/4) = -1.6.
    luspo: mean(-1, -3) = -2.   GA divides all but dapo (whose normaliser carries GA already).
    sapo's gate at r = 1 is σ(0)·4/τ = 2 (τ = 1), so its per-token loss is -2 and its grpo-style mean -2.
    """
    logp = torch.zeros(2, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])
    adv = torch.tensor([1.0, 1.0])
    expected = {"grpo": -1.0, "bnpo": -1.0, "dr_grpo": -0.25, "luspo": -2.0, "gspo": -1.0, "sapo": -2.0}
    for name, value in expected.items():
        loss, _ = policy_loss(logp, None, adv, mask, loss_type=name, max_completion_length=8)
        assert loss.item() == pytest.approx(value, abs=1e-12), name
        loss, _ = policy_loss(
            logp, None, adv, mask, loss_type=name, max_completion_length=8, gradient_accumulation_steps=4
        )
        assert loss.item() == pytest.approx(value / 4, abs=1e-12), name
    loss, _ = policy_loss(
        logp,
        None,
        adv,
        mask,
        loss_type="dapo",
        num_items_in_batch=10,
        num_processes=2,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
    )
    assert loss.item() == pytest.approx(-1.6, abs=1e-12)


def test_kl_estimators_by_hand():
    """π = 0.5, π_ref = 0.25, so log π/π_ref = ln 2.
    k1 = ln 2; k2 = ½ ln²2; k3 = π_ref/π - ln(π_ref/π) - 1 = 0.5 + ln 2 - 1."""
    logp, ref = _log([[0.5]]), _log([[0.25]])
    expected = {"k1": LN2, "k2": 0.5 * LN2**2, "k3": 0.5 + LN2 - 1}
    for name, value in expected.items():
        assert KL_ESTIMATORS.get(name)(logp, ref).item() == pytest.approx(value, abs=1e-12)
        # On-policy with A = 0 the loss is beta·kl (ratio 1, bias correction multiplies by 1).
        loss, m = policy_loss(
            logp, None, torch.zeros(1), torch.ones(1, 1), loss_type="bnpo", beta=0.1, ref_logp_NT=ref, kl_estimator=name
        )
        assert loss.item() == pytest.approx(0.1 * value, abs=1e-12)
        assert m["kl"].item() == pytest.approx(value, abs=1e-12)


def test_cispo_weight_is_capped_and_stop_gradient():
    """CISPO loss -sg(min(r, ε_max))·A·logp: ratio 2 capped at 1.5, so d loss / d logp = -1.5·A (no ratio term)."""
    logp = _log([[0.5]]).requires_grad_()
    old = _log([[0.25]])
    loss, m = policy_loss(logp, old, torch.tensor([2.0]), torch.ones(1, 1), loss_type="cispo", epsilon_high=1.5)
    loss.backward()
    assert loss.item() == pytest.approx(-1.5 * 2.0 * math.log(0.5), abs=1e-12)
    assert logp.grad.item() == pytest.approx(-3.0, abs=1e-12)
    assert m["cispo_clip_ratio"].item() == 1.0


def test_sapo_gate_by_hand():
    """SAPO at r = 1: σ(0)·4/τ = 2/τ, so the loss is -2A/τ; gradient wrt logp is -A·4σ'(0) = -A."""
    logp = torch.zeros(1, 1, dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(logp, None, torch.tensor([1.0]), torch.ones(1, 1), loss_type="sapo", sapo_temperature_pos=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(-2 / 0.5, abs=1e-12)
    assert logp.grad.item() == pytest.approx(-1.0, abs=1e-12)


# --- properties over every preset ------------------------------------------------------------------------


def _random(seed: int, N: int = 5, T: int = 6):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
    ref = logp + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
    mask = (torch.arange(T)[None] < torch.tensor([6, 2, 4, 1, 3])[:, None]).long()
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    return logp, old, ref, mask, adv


GEOMETRY = dict(max_completion_length=8, num_items_in_batch=25, num_processes=1, steps_per_generation=1)


@pytest.mark.parametrize("loss_type", loss_type_names())
def test_zero_advantage_gives_zero_gradient(loss_type):
    logp, old, _, mask, _ = _random(0)
    logp.requires_grad_()
    loss, _ = policy_loss(
        logp,
        old,
        torch.zeros(5, dtype=torch.float64),
        mask,
        loss_type=loss_type,
        epsilon_high=5.0 if loss_type == "cispo" else None,
        **GEOMETRY,
    )
    loss.backward()
    assert torch.count_nonzero(logp.grad) == 0


@pytest.mark.parametrize("loss_type", loss_type_names())
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_masked_tokens_get_no_gradient(loss_type, beta):
    logp, old, ref, mask, adv = _random(1)
    logp.requires_grad_()
    loss, _ = policy_loss(logp, old, adv, mask, loss_type=loss_type, beta=beta, ref_logp_NT=ref, **GEOMETRY)
    loss.backward()
    assert torch.count_nonzero(logp.grad[mask == 0]) == 0
    assert torch.count_nonzero(logp.grad[mask == 1]) > 0  # (clipped active tokens may legitimately get none)


def _reinforce_weight(aggregation: str, mask: torch.Tensor, ga: int) -> torch.Tensor:
    """d loss / d logp_nt of REINFORCE -A_n·logp_nt under each aggregation, divided by -A_n (derived by hand)."""
    N = mask.shape[0]
    lengths = mask.sum(-1, keepdim=True).double()
    per_token = {
        "sequence_mean": 1.0 / (N * lengths) / ga,  # mean over n of (1/|o_n|) Σ_t
        "token_mean": torch.full_like(lengths, 1.0 / mask.sum().item()) / ga,
        "constant_norm": torch.full_like(lengths, 1.0 / (N * GEOMETRY["max_completion_length"])) / ga,
        "global_token_mean": torch.full_like(lengths, 1.0 / (GEOMETRY["num_items_in_batch"] * ga)),
        "sequence_sum": torch.full_like(lengths, 1.0 / N) / ga,
    }[aggregation]
    return per_token * mask


@pytest.mark.parametrize("loss_type", loss_type_names())
@pytest.mark.parametrize("ga", [1, 2])
def test_on_policy_gradient_is_reinforce(loss_type, ga):
    """Ratio exactly 1: clip, CISPO (ε_max >= 1) and the SAPO gate all reduce to -A·∇logp, and GSPO/LUSPO's
    sequence ratio spreads 1/|o| of it on each token, which their aggregation undoes."""
    logp, _, _, mask, adv = _random(2)
    logp.requires_grad_()
    loss, m = policy_loss(
        logp,
        None,
        adv,
        mask,
        loss_type=loss_type,
        gradient_accumulation_steps=ga,
        epsilon_high=5.0 if loss_type == "cispo" else None,
        **GEOMETRY,
    )
    loss.backward()
    expected = -adv[:, None] * _reinforce_weight(LOSS_TYPES.get(loss_type).aggregation, mask, ga)
    assert torch.allclose(logp.grad, expected, rtol=1e-12, atol=1e-15)
    assert m["ratio/mean"].item() == 1.0
    # The loss *value* on-policy is -mean-ish(A), which for centred advantages is ~0 while the gradient is not.


def test_on_policy_property_fails_with_a_stale_ratio():
    """The REINFORCE check can fail: off-policy (ratio != 1) the gradient differs."""
    logp, old, _, mask, adv = _random(2)
    logp.requires_grad_()
    loss, _ = policy_loss(logp, old, adv, mask, loss_type="bnpo")
    loss.backward()
    assert not torch.allclose(logp.grad, -adv[:, None] * _reinforce_weight("token_mean", mask, 1))


def test_kl_bias_correction_changes_gradient_on_policy_but_not_value():
    logp, _, ref, mask, adv = _random(3)
    grads, values = [], []
    for correction in (True, False):
        x = logp.clone().requires_grad_()
        loss, _ = policy_loss(
            x, None, adv, mask, loss_type="grpo", beta=0.1, ref_logp_NT=ref, kl_bias_correction=correction
        )
        loss.backward()
        grads.append(x.grad)
        values.append(loss.item())
    assert values[0] == pytest.approx(values[1], abs=1e-14)
    assert not torch.allclose(grads[0], grads[1])


def test_top_entropy_quantile_trains_only_high_entropy_tokens():
    logp, _, _, mask, adv = _random(4)
    entropy = torch.arange(30, dtype=torch.float64).view(5, 6)  # strictly increasing: a unique ordering
    logp.requires_grad_()
    loss, _ = policy_loss(logp, None, adv, mask, loss_type="bnpo", entropy_NT=entropy, top_entropy_quantile=0.25)
    loss.backward()
    active = entropy[mask.bool()]
    threshold = torch.quantile(active, 0.75)
    trained = logp.grad != 0
    assert torch.equal(trained, (entropy >= threshold) & mask.bool())
    assert 0 < trained.sum() < mask.sum()


# --- registry and errors -------------------------------------------------------------------------------


def test_presets_are_combinations_of_registered_leaves():
    assert set(loss_type_names()) == {"grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "luspo"}
    for name in loss_type_names():
        preset = LOSS_TYPES.get(name)
        assert preset.objective in OBJECTIVES and preset.aggregation in AGGREGATIONS
    assert LOSS_TYPES.get("gspo").importance_sampling_level == "sequence"


def test_unknown_loss_type_lists_valid_ones():
    logp, old, _, mask, adv = _random(5)
    with pytest.raises(UnknownNameError, match="valid choices: bnpo, cispo, dapo, dr_grpo, grpo, gspo, luspo, sapo"):
        policy_loss(logp, old, adv, mask, loss_type="ppo")


def test_a_new_preset_needs_no_code_change():
    LOSS_TYPES.add("test_cispo_seq", LossPreset("cispo", "sequence_mean", "sequence", "cispo", "test"))
    try:
        logp, old, _, mask, adv = _random(6)
        loss, m = policy_loss(logp, old, adv, mask, loss_type="test_cispo_seq", epsilon_high=5.0)
        assert torch.isfinite(loss) and "cispo_clip_ratio" in m
    finally:
        LOSS_TYPES._items.pop("test_cispo_seq")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(loss_type="dr_grpo"), "max_completion_length"),
        (dict(loss_type="dapo", num_processes=2), "num_items_in_batch"),
        (dict(loss_type="dapo", steps_per_generation=4), "num_items_in_batch"),
        (dict(beta=0.1), "ref_logp_NT is required"),
        (dict(importance_sampling_level="group"), "importance_sampling_level"),
        (dict(top_entropy_quantile=0.5), "entropy_NT is required"),
        (dict(kl_estimator="k4", beta=0.1, ref_logp_NT=torch.zeros(5, 6)), "k1, k2, k3"),
    ],
)
def test_bad_input_gets_a_clear_error(kwargs, match):
    logp, old, _, mask, adv = _random(7)
    with pytest.raises((ValueError, KeyError), match=match):
        policy_loss(logp, old, adv, mask, **kwargs)


def test_shape_mismatch_is_reported():
    logp, old, _, mask, adv = _random(8)
    with pytest.raises(ValueError, match="adv_N has 4 rows"):
        policy_loss(logp, old, adv[:4], mask)
    with pytest.raises(ValueError, match="mask_NT"):
        policy_loss(logp, old, adv, mask[:, :3])


def test_metrics_are_detached_zero_dim_tensors():
    logp, old, ref, mask, adv = _random(9)
    logp.requires_grad_()
    _, m = policy_loss(logp, old, adv, mask, loss_type="grpo", beta=0.1, ref_logp_NT=ref, entropy_NT=torch.rand(5, 6))
    assert {
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "kl",
        "entropy",
        "ratio/mean",
    } <= set(m)
    for value in m.values():
        assert isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad
