"""token_logprobs, entropy_from_logits, completion_mask."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.core import completion_mask, entropy_from_logits, token_logprobs


def _logits(seed=0, N=3, T=4, V=11, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, T, V, generator=g, dtype=torch.float64) * 3
    ids = torch.randint(0, V, (N, T), generator=g)
    return logits.to(dtype), ids


def test_token_logprobs_by_hand():
    """Logits (0, ln 3) at temperature 1: softmax = (1/4, 3/4). At temperature 0.5 the logits double:
    (0, ln 9) => (1/10, 9/10)."""
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)
    ids = torch.tensor([[1]])
    assert token_logprobs(logits, ids).item() == pytest.approx(math.log(0.75), abs=1e-14)
    assert token_logprobs(logits, ids, temperature=0.5).item() == pytest.approx(math.log(0.9), abs=1e-14)


def test_wrong_temperature_fails_the_hand_value():
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)
    with pytest.raises(AssertionError):
        assert token_logprobs(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.9), abs=1e-6)


@pytest.mark.parametrize("chunk_elements", [1, 22, 1 << 25])  # 1 row per chunk, 2 rows, everything at once
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_matches_log_softmax_value_and_gradient(chunk_elements, temperature):
    logits, ids = _logits()
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = token_logprobs(ours_in, ids, temperature, chunk_elements=chunk_elements)
    ref = torch.log_softmax(ref_in / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(ours, ref, rtol=0, atol=1e-13)
    weights = torch.randn(ids.shape, dtype=torch.float64)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    assert torch.allclose(ours_in.grad, ref_in.grad, rtol=0, atol=1e-13)


def test_token_logprobs_gradcheck():
    logits, ids = _logits(N=2, T=2, V=5)
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, ids, 0.8, chunk_elements=5), (logits.requires_grad_(),))


def test_bfloat16_logits_give_float32_logprobs_and_bf16_grad():
    logits, ids = _logits(dtype=torch.bfloat16)
    x = logits.clone().requires_grad_()
    logp = token_logprobs(x, ids)
    ref = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert logp.dtype == torch.float32 and torch.allclose(logp, ref, atol=1e-5)
    logp.sum().backward()
    assert x.grad.dtype == torch.bfloat16


def test_autograd_keeps_no_float32_copy_of_the_logits():
    """Everything saved for backward: the logits themselves (bf16) and the ids; no [N, T, V] float32 tensor.
    A plain ``log_softmax(logits.float())`` saves its float32 output, 2x the bf16 logits' bytes."""
    logits, ids = _logits(N=4, T=8, V=1000, dtype=torch.bfloat16)
    x = logits.clone().requires_grad_()
    saved_bytes = []

    def pack(t):
        saved_bytes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs(x, ids, 0.7)
    assert sum(saved_bytes) <= x.numel() * x.element_size() + ids.numel() * ids.element_size()
    saved_bytes.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.log_softmax(x.float() / 0.7, -1).gather(-1, ids.unsqueeze(-1))
    assert sum(saved_bytes) >= x.numel() * 4  # the naive way does keep one (the check can fail)


def test_entropy_by_hand_and_against_reference():
    """Two equal logits: entropy ln 2; uniform over V: ln V."""
    logits = torch.zeros(1, 2, 4, dtype=torch.float64)
    logits[0, 0, 2:] = -math.inf  # only two live entries
    ent = entropy_from_logits(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(2), abs=1e-14)
    assert ent[0, 1].item() == pytest.approx(math.log(4), abs=1e-14)
    logits, _ = _logits()
    p = torch.softmax(logits / 0.7, -1)
    ref = -(p * p.log()).sum(-1)
    assert torch.allclose(entropy_from_logits(logits, 0.7, chunk_elements=11), ref, atol=1e-12)


def test_completion_mask_includes_first_eos_only():
    ids = torch.tensor([[5, 6, 2, 7, 2], [2, 5, 5, 5, 5], [5, 5, 5, 5, 5], [5, 9, 5, 2, 5]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    assert torch.equal(completion_mask(ids, [2, 9]), expected)
    assert torch.equal(completion_mask(ids[:3], 2), expected[:3])
    with pytest.raises(AssertionError):  # excluding the EOS itself would be a different (wrong) mask
        assert torch.equal(completion_mask(ids[:1], 2), torch.tensor([[1, 1, 0, 0, 0]]))


def test_bad_input_gets_a_clear_error():
    logits, ids = _logits()
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(logits, ids, temperature=0.0)
    with pytest.raises(ValueError, match=r"shifted by one"):
        token_logprobs(logits[:, :-1], ids)
