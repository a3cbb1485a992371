"""head_logprobs: the chunked LM head equals F.linear + token_logprobs + entropy_from_logits (values, gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlvr.core import entropy_from_logits, head_logprobs, token_logprobs


def _inputs(seed=0, N=3, T=5, H=7, V=13, bias=False, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, T, H, generator=g, dtype=torch.float64)
    w = torch.randn(V, H, generator=g, dtype=torch.float64)
    b = torch.randn(V, generator=g, dtype=torch.float64) if bias else None
    ids = torch.randint(0, V, (N, T), generator=g)
    return h.to(dtype), w.to(dtype), None if b is None else b.to(dtype), ids


def _plain(h, w, b, ids, temperature):
    logits = F.linear(h, w, b)
    return token_logprobs(logits, ids, temperature), entropy_from_logits(logits.detach(), temperature)


@pytest.mark.parametrize("keep_probs", [False, True])
@pytest.mark.parametrize("chunk_elements", [1, 13 * 4, 1 << 25])  # one token per chunk, 4 tokens (ragged), all
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_match_the_plain_path_float64(chunk_elements, temperature, bias, keep_probs):
    h, w, b, ids = _inputs(bias=bias)
    leaves_a = [t.clone().requires_grad_() for t in (h, w) + ((b,) if bias else ())]
    leaves_b = [t.clone().requires_grad_() for t in (h, w) + ((b,) if bias else ())]
    ba = leaves_a[2] if bias else None
    bb = leaves_b[2] if bias else None
    ours, ent = head_logprobs(
        leaves_a[0], leaves_a[1], ids, temperature, ba, with_entropy=True, chunk_elements=chunk_elements,
        keep_probs=keep_probs,
    )  # fmt: skip
    ref, ref_ent = _plain(leaves_b[0], leaves_b[1], bb, ids, temperature)
    assert torch.allclose(ours, ref, rtol=0, atol=1e-12)
    assert torch.allclose(ent, ref_ent, rtol=0, atol=1e-12)
    assert not ent.requires_grad
    weights = torch.randn(ids.shape, dtype=torch.float64)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    for a, r in zip(leaves_a, leaves_b):
        assert torch.allclose(a.grad, r.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_probabilities_give_the_recomputed_gradients_exactly(with_entropy, dtype):
    """Keeping the probabilities for backward skips a recompute that would rebuild the same values with the same
    chunks and operations: values, entropy and every gradient are bitwise those of the recomputing path."""
    h, w, b, ids = _inputs(N=4, T=6, H=8, V=29, bias=True, dtype=dtype)
    runs = []
    for keep in (False, True):
        leaves = [t.clone().requires_grad_() for t in (h, w, b)]
        logp, ent = head_logprobs(
            leaves[0], leaves[1], ids, 0.7, leaves[2], with_entropy=with_entropy, chunk_elements=29 * 5,
            keep_probs=keep,
        )  # fmt: skip
        (logp * torch.linspace(-1, 2, ids.numel()).view(ids.shape).to(dtype)).sum().backward()
        runs.append((logp.detach(), ent, *(t.grad for t in leaves)))
    for a, b_ in zip(*runs):
        assert (a is None and b_ is None) or torch.equal(a, b_)


def test_kept_probabilities_are_not_reused_by_a_second_backward():
    """Backward consumes the kept probabilities in place: a second backward through the same graph must fail
    loudly (autograd's in-place check), not return a wrong gradient."""
    h, w, _, ids = _inputs(dtype=torch.float32)
    h.requires_grad_()
    logp, _ = head_logprobs(h, w, ids, keep_probs=True)
    logp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        logp.sum().backward()


def test_gradcheck_through_hidden_weight_and_bias():
    h, w, b, ids = _inputs(N=2, T=2, H=3, V=5, bias=True)
    fn = lambda h_, w_, b_: head_logprobs(h_, w_, ids, 0.8, b_, chunk_elements=10)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (h.requires_grad_(), w.requires_grad_(), b.requires_grad_()))


def test_frozen_head_gets_no_gradient_but_hidden_does():
    """LoRA leaves the head frozen: only the hidden states (and what made them) get a gradient."""
    h, w, _, ids = _inputs()
    h.requires_grad_()
    logp, _ = head_logprobs(h, w, ids, chunk_elements=26)
    logp.sum().backward()
    assert w.grad is None and h.grad is not None and h.grad.abs().sum() > 0


def test_tied_weight_gradient_adds_both_uses():
    """With tied embeddings the head weight is also the embedding: autograd must add the two gradients."""
    h, w, _, ids = _inputs()
    w_a, w_b = w.clone().requires_grad_(), w.clone().requires_grad_()
    emb_ids = torch.tensor([0, 3, 3, 12])

    def run(weight, chunked):
        hidden = h + F.embedding(emb_ids, weight).sum(0)  # the embedding feeds the body
        if chunked:
            return head_logprobs(hidden, weight, ids, 0.9, chunk_elements=13 * 2)[0]
        return token_logprobs(F.linear(hidden, weight), ids, 0.9)

    run(w_a, True).sum().backward()
    run(w_b, False).sum().backward()
    assert torch.allclose(w_a.grad, w_b.grad, rtol=0, atol=1e-12)


def test_bfloat16_close_to_the_plain_bfloat16_path():
    """Same dtype flow as the plain path: bf16 logits, float32 softmax. Differences come only from the
    order of the float32 accumulations, far below one bf16 ulp of the logits (2^-8 relative)."""
    h, w, _, ids = _inputs(H=64, V=300, dtype=torch.bfloat16)
    ours, _ = head_logprobs(h, w, ids, chunk_elements=300 * 4)
    ref, _ = _plain(h, w, None, ids, 1.0)
    assert ours.dtype == torch.float32
    logit_ulp = F.linear(h, w).abs().max().float() * 2**-8
    assert (ours - ref).abs().max() <= 2 * logit_ulp


def test_the_weight_gradient_by_vocabulary_block_is_exact_in_float64():
    from rlvr.core.lm_head import _weight_grad_by_vocab

    h, w, b, ids = _inputs(bias=True)  # 15 rows, V = 13: blocks of 45 // 15 = 3 vocabulary rows, the last ragged
    leaf_w = w.clone().requires_grad_()
    scale_NT = torch.randn(ids.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (token_logprobs(F.linear(h, leaf_w, b), ids, 0.7) * scale_NT).sum().backward()
    lse_R = torch.logsumexp(F.linear(h, w, b).reshape(-1, 13) / 0.7, dim=-1)
    ours = _weight_grad_by_vocab(h.reshape(-1, 7), w, b, ids.reshape(-1), lse_R, scale_NT.reshape(-1), 0.7, 45,
                                 torch.float64)  # fmt: skip
    assert torch.allclose(ours, leaf_w.grad, rtol=0, atol=1e-12)
    assert leaf_w.grad.abs().max() > 0.1


def test_a_16_bit_head_weight_gradient_goes_by_vocabulary_block_as_close_as_the_plain_path(monkeypatch):
    """bf16 weight with H > rows per chunk: d W is made per block of the vocabulary over every token (no float32
    [V, H] accumulator), and is as close to the float64 gradient of the same bf16 inputs as the plain path's."""
    from rlvr.core import lm_head

    blocks = []
    real = lm_head._weight_grad_by_vocab
    monkeypatch.setattr(lm_head, "_weight_grad_by_vocab", lambda *a: blocks.append(a[-2]) or real(*a))
    h, w, _, ids = _inputs(N=4, T=8, H=64, V=300, dtype=torch.bfloat16)  # 32 rows; 5 per chunk below
    scale_NT = torch.linspace(-1, 2, ids.numel(), dtype=torch.float64).view(ids.shape)

    def weight_grad(dtype, chunk_elements=None):
        leaf_h, leaf_w = h.to(dtype).clone().requires_grad_(), w.to(dtype).clone().requires_grad_()
        if chunk_elements:
            logp = head_logprobs(leaf_h, leaf_w, ids, 0.7, chunk_elements=chunk_elements)[0]
        else:
            logp = token_logprobs(F.linear(leaf_h, leaf_w), ids, 0.7)
        (logp * scale_NT.to(logp.dtype)).sum().backward()
        return leaf_w.grad.double()

    exact = weight_grad(torch.float64)
    by_vocab = weight_grad(torch.bfloat16, chunk_elements=300 * 5)  # blocks of 1500 // 32 = 46 rows: 7, ragged
    assert blocks == [1500]
    by_tokens = weight_grad(torch.bfloat16, chunk_elements=300 * 64)  # H <= rows per chunk: the float32 buffer
    assert blocks == [1500]
    plain = weight_grad(torch.bfloat16)
    for reduce in (torch.amax, torch.mean):  # the worst element and the typical one
        err = {
            k: reduce((g - exact).abs()).item()
            for k, g in (("vocab", by_vocab), ("tokens", by_tokens), ("plain", plain))
        }
        assert 0 < err["vocab"] <= 1.5 * min(err["plain"], err["tokens"]), err


def test_bad_shapes_and_temperature_are_named():
    h, w, _, ids = _inputs()
    with pytest.raises(ValueError, match="temperature"):
        head_logprobs(h, w, ids, 0.0)
    with pytest.raises(ValueError, match="disagree"):
        head_logprobs(h[:, :-1], w, ids)
    with pytest.raises(ValueError, match="hidden size"):
        head_logprobs(h, w[:, :-1], ids)
