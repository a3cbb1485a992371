import math

import pytest
import torch

from rlvr.rollout import check_mismatch, logprob_mismatch_metrics


def test_hand_derived_values():
    ln2 = math.log(2.0)
    # Row 0: two real tokens with log w = trainer - sampler = [0, ln 2], so w = [1, 2]; the third
    # position is padding holding NaN, which must not leak. Row 1 is all padding (no sequence stats).
    sampler = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -0.5, -0.5]])
    trainer = torch.tensor([[-1.0, -2.0 + ln2, 0.0], [-9.0, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    m = {k.removeprefix("mismatch/"): float(v) for k, v in logprob_mismatch_metrics(sampler, trainer, mask).items()}
    assert m["tokens"] == 2
    assert m["abs_logp_diff_mean"] == pytest.approx(ln2 / 2)
    assert m["abs_logp_diff_max"] == pytest.approx(ln2)
    # k3 = w - log w - 1: 0 for w = 1, 2 - ln 2 - 1 for w = 2; mean over 2 tokens.
    assert m["kl"] == pytest.approx((1 - ln2) / 2)
    assert m["is_weight_mean"] == pytest.approx(1.5)
    assert m["is_weight_std"] == pytest.approx(0.5)  # population std of {1, 2}
    assert (m["is_weight_min"], m["is_weight_max"]) == pytest.approx((1.0, 2.0))
    assert m["is_weight_frac_outside_2x"] == 0.0  # w = 2 is on the boundary, not outside
    # One sequence with tokens: geometric-mean weight exp((0 + ln 2) / 2) = sqrt 2.
    assert m["seq_is_weight_mean"] == pytest.approx(math.sqrt(2))
    assert m["seq_is_weight_min"] == pytest.approx(math.sqrt(2))
    assert m["seq_is_weight_max"] == pytest.approx(math.sqrt(2))


def test_no_tokens_is_finite_and_neutral():
    z = torch.zeros(2, 3)
    m = logprob_mismatch_metrics(z, z + 5, torch.zeros(2, 3, dtype=torch.bool))
    assert all(torch.isfinite(v) for v in m.values())
    assert float(m["mismatch/is_weight_mean"]) == 1.0 and float(m["mismatch/tokens"]) == 0.0


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="same \\[N, T\\] shape"):
        logprob_mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


def test_warning_only_when_large():
    logp = torch.log(torch.full((4, 5), 0.3))
    mask = torch.ones(4, 5)
    assert check_mismatch(logprob_mismatch_metrics(logp, logp + 1e-6, mask)) is None
    # A 3x disagreement on every token: w = 3 (outside [0.5, 2]), k3 = 3 - ln 3 - 1 ≈ 0.90 > 0.01.
    msg = check_mismatch(logprob_mismatch_metrics(logp, logp + math.log(3.0), mask))
    assert msg is not None and "KL" in msg and "temperature" in msg and "100.00%" in msg


def test_check_mismatch_has_nothing_to_judge_without_compared_tokens():
    assert check_mismatch({"reward": 1.0}) is None  # the engine reported no log-probs at all
    logp = torch.zeros(2, 3)
    assert check_mismatch(logprob_mismatch_metrics(logp, logp + 5.0, torch.zeros(2, 3))) is None
