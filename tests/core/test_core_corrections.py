"""sampler_importance_weights, high_entropy_mask, off_policy_sequence_mask: hand-derived values."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.core import high_entropy_mask, off_policy_sequence_mask, sampler_importance_weights


def _case():
    """One completion, three tokens, the last one padding. Trainer π_old = (0.5, 0.5, ·), sampler = (0.25, 0.5, ·):
    token ratios π_old/π_sampler = (2, 1); the padded token has a wild difference that must not count.
    Sequence ratio = product of active token ratios = 2."""
    old = torch.tensor([[0.5, 0.5, 0.9]], dtype=torch.float64).log()
    sampler = torch.tensor([[0.25, 0.5, 1e-6]], dtype=torch.float64).log()
    mask = torch.tensor([[1, 1, 0]])
    return old, sampler, mask


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token_truncate", [[1.5, 1.0, 1.0]]),  # 2 clamped to C_max; padding ratio exp(0) = 1 (masked later)
        ("token_mask", [[0.0, 1.0, 1.0]]),  # 2 > C_max => that token dropped
        ("sequence_truncate", [[1.5]]),
        ("sequence_mask", [[0.0]]),  # the whole sequence dropped
    ],
)
def test_modes_by_hand(mode, expected):
    old, sampler, mask = _case()
    weights, metrics = sampler_importance_weights(old, sampler, mask, mode=mode, clip_max=1.5)
    assert torch.allclose(weights, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    # |old - sampler| over active tokens: (ln 2, 0) => mean ln2 / 2, max ln 2.
    assert metrics["sampling/sampling_logp_difference/mean"].item() == pytest.approx(math.log(2) / 2)
    assert metrics["sampling/sampling_logp_difference/max"].item() == pytest.approx(math.log(2))


def test_clip_min_masks_small_ratios():
    old, sampler, mask = _case()
    weights, _ = sampler_importance_weights(sampler, old, mask, mode="token_mask", clip_min=0.6, clip_max=None)
    assert torch.allclose(weights[:, :2], torch.tensor([[0.0, 1.0]], dtype=torch.float64))  # ratio 0.5 < 0.6


def test_nan_sampler_logprob_means_no_correction():
    old, sampler, mask = _case()
    sampler[0, 0] = math.nan
    weights, metrics = sampler_importance_weights(old, sampler, mask, mode="token_truncate", clip_max=1.5)
    assert weights[0, 0].item() == 1.0
    assert metrics["sampling/sampling_logp_difference/max"].item() == 0.0


def test_wrong_clip_max_fails_the_hand_value():
    old, sampler, mask = _case()
    weights, _ = sampler_importance_weights(old, sampler, mask, mode="sequence_truncate", clip_max=3.0)
    assert weights.item() == pytest.approx(2.0)
    with pytest.raises(AssertionError):
        assert weights.item() == pytest.approx(1.5)


def test_bad_arguments():
    old, sampler, mask = _case()
    with pytest.raises(ValueError, match="valid: token_truncate"):
        sampler_importance_weights(old, sampler, mask, mode="tis")
    with pytest.raises(ValueError, match="needs clip_max"):
        sampler_importance_weights(old, sampler, mask, mode="token_truncate", clip_max=None)
    with pytest.raises(ValueError, match="must be less than"):
        sampler_importance_weights(old, sampler, mask, clip_min=2.0, clip_max=1.0)
    with pytest.raises(ValueError, match="same"):
        sampler_importance_weights(old, sampler[:, :2], mask)


def test_high_entropy_mask_by_hand():
    """Active entropies (1, 2, 3, 4) (the fifth token is padding with a huge entropy that must be ignored).
    ρ = 0.5 => threshold = quantile 0.5 = 2.5 (linear interpolation) => tokens 3 and 4 kept."""
    entropy = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    kept = high_entropy_mask(entropy, mask, 0.5)
    assert kept.tolist() == [[False, False, True, True, False]]
    assert high_entropy_mask(entropy, mask, 1.0).tolist() == [[True, True, True, True, False]]
    assert high_entropy_mask(entropy, mask, 0.5, threshold=1.5).tolist() == [[False, True, True, True, False]]
    assert not high_entropy_mask(entropy, torch.zeros_like(mask), 0.5).any()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        high_entropy_mask(entropy, mask, 1.5)


def test_off_policy_sequence_mask_by_hand():
    """Mean (sampler - logp) per sequence: row 0 = 0.5, row 1 = 0.5, row 2 = 0.0. Threshold 0.1:
    row 0 has A < 0 and drifted => dropped; row 1 drifted but A >= 0 => kept; row 2 did not drift => kept."""
    logp = torch.zeros(3, 2, dtype=torch.float64)
    sampler = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    keep = off_policy_sequence_mask(torch.tensor([-1.0, 1.0, -1.0]), logp, sampler, torch.ones(3, 2), 0.1)
    assert keep.squeeze(1).tolist() == [0.0, 1.0, 1.0]
