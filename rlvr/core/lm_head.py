"""Completion-token log-probs straight from final hidden states and the LM-head weight, in chunks of tokens.

Why: the logits are the largest tensor of a GRPO step. One micro-batch of 32 completions x 257 scored
positions over a 151,936-token vocabulary is 2.5 GB in bfloat16, and the plain path keeps them for
backward, adds a gradient of the same size and a float32 work chunk on top. Here the head's matmul is
done ``chunk_rows`` tokens at a time: forward keeps only [N, T] outputs and what it was given (hidden
states, weight); backward recomputes each chunk's logits and softmax, so neither pass holds [N, T, V].
Peak extra memory is about two [chunk_rows, V] float32 buffers (plus, when a float32 head weight itself
trains, its [V, H] gradient). Cost: the head's matmul runs twice (forward and backward recompute), about
1/3 more head FLOPs; the head is ~10% of a 1.7B model's FLOPs per token.

A 16-bit head weight that trains would need a float32 [V, H] accumulator for its gradient over token chunks:
twice the weight's own bytes (1.16 GiB for a 152k x 2048 head, beside the 16-bit result). Where that buffer
would outgrow one chunk's logits (H > chunk_rows), the weight gradient is made per block of the vocabulary
instead, over every token at once: one matmul per block, float32 inside and rounded once, as the plain
path's single bf16 matmul is (the token-chunk sum rounds each chunk's product to 16 bits before adding). It
costs computing the logits once more, block by block: a fourth head matmul in backward.

Where the probabilities of a whole call are small (``keep_probs``: a small vocabulary or few tokens, the
caller's choice against ``HEAD_KEEP_ELEMENTS``), forward keeps them for backward instead: backward then skips the
recompute (a quarter of the head's matmuls, ~5% of SmolLM2-135M's update) and the values are the same, since
backward would rebuild them with the same chunks and the same operations.

Numerics are those of the plain path ``token_logprobs(F.linear(h, W, b), ids, T)``: logits in the
weight's dtype, cast to float32 (float64 for float64) and divided by the sampling temperature; the
logits gradient is cast back to the weight's dtype before the two matmuls of the linear backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlvr.core.logprobs import _compute_dtype

__all__ = ["HEAD_CHUNK_ELEMENTS", "HEAD_KEEP_ELEMENTS", "head_logprobs"]

# 16M logits per chunk: 64 MiB per float32 buffer, about two alive at once (110 tokens of a 152k vocabulary,
# enough rows that the weight is read ~20 times per micro-batch of 2,000 tokens, not once per token).
HEAD_CHUNK_ELEMENTS = 1 << 24
# Probabilities kept for backward when a micro-batch's completion tokens x vocabulary is at most this: 64M
# float32 values, 256 MiB (SmolLM2-135M's 8 x 128 tokens x 49,152 = 50M; a 152k vocabulary keeps ~440 tokens).
HEAD_KEEP_ELEMENTS = 1 << 26


def _chunks(num_rows: int, chunk_rows: int):
    for start in range(0, num_rows, chunk_rows):
        yield slice(start, min(start + chunk_rows, num_rows))


class _HeadLogProb(torch.autograd.Function):
    """``log softmax((h W^T + b) / τ)[ids]`` and (no-grad) entropy, chunked in forward and backward.

    With s = logits / τ and p = softmax(s) = exp(s - lse): d logp_id / d logits = (onehot(id) - p) / τ; then
    d h = g_logits W and d W = g_logits^T h, d b = sum g_logits, accumulated chunk by chunk. The per-row
    log-sum-exp is kept from forward ([N*T] floats), so backward rebuilds p in place in one float32 buffer.
    """

    @staticmethod
    def forward(ctx, hidden_RH, weight_VH, bias_V, ids_R, temperature, chunk_rows, with_entropy, keep_probs):
        compute = _compute_dtype(hidden_RH.dtype)
        R = hidden_RH.shape[0]
        logp_R = torch.empty(R, dtype=compute, device=hidden_RH.device)
        lse_R = torch.empty(R, dtype=compute, device=hidden_RH.device)
        ent_R = torch.empty(R if with_entropy else 0, dtype=compute, device=hidden_RH.device)
        kept = []  # each chunk's probabilities, for backward, when keep_probs
        for c in _chunks(R, chunk_rows):
            s = _scaled_logits(hidden_RH[c], weight_VH, bias_V, temperature, compute)
            lse_R[c] = torch.logsumexp(s, dim=-1)
            logp_R[c] = s.gather(-1, ids_R[c].unsqueeze(-1)).squeeze(-1) - lse_R[c]
            if with_entropy or keep_probs:  # log p = s - lse, in place
                logp_all = s.sub_(lse_R[c].unsqueeze(-1))
                p = logp_all.exp()
                if keep_probs:
                    kept.append(p)
                if with_entropy:  # H = -sum p log p; a -inf logit (a banned token) has p = 0 and adds 0, not NaN
                    logp_all.nan_to_num_(neginf=0.0)
                    ent_R[c] = -(p * logp_all if keep_probs else p.mul_(logp_all)).sum(-1)
            del s
        ctx.save_for_backward(hidden_RH, weight_VH, bias_V, ids_R, lse_R, *kept)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        ctx.mark_non_differentiable(ent_R)  # entropy feeds metrics and token masks, never the gradient
        return logp_R, ent_R

    @staticmethod
    def backward(ctx, grad_logp_R, _grad_ent_R):
        hidden_RH, weight_VH, bias_V, ids_R, lse_R, *kept = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        compute = _compute_dtype(hidden_RH.dtype)
        grad_h = torch.empty_like(hidden_RH) if need_h else None
        # The weight gradient is a sum over every token: accumulate it in float32 (a plain bf16 matmul
        # also accumulates in float32 internally), round once at the end.
        acc = torch.float64 if weight_VH.dtype == torch.float64 else torch.float32
        # Kept probabilities or not, a 16-bit weight's gradient goes by vocabulary block (the module docstring).
        by_vocab = need_w and weight_VH.element_size() == 2 and weight_VH.shape[1] > ctx.chunk_rows
        grad_w = torch.zeros(weight_VH.shape, dtype=acc, device=weight_VH.device) if need_w and not by_vocab else None
        grad_b = torch.zeros(bias_V.shape, dtype=acc, device=bias_V.device) if need_b else None
        for i, c in enumerate(_chunks(hidden_RH.shape[0], ctx.chunk_rows)):
            h = hidden_RH[c]
            if kept:  # forward's own probabilities (consumed: this is the graph's only backward)
                probs = kept[i]
            else:
                probs = _scaled_logits(h, weight_VH, bias_V, ctx.temperature, compute)
                probs.sub_(lse_R[c].unsqueeze(-1)).exp_()
            probs.scatter_add_(-1, ids_R[c].unsqueeze(-1), -torch.ones_like(probs[:, :1]))  # p - onehot
            g_logits = probs.mul_(-grad_logp_R[c].to(compute).unsqueeze(-1) / ctx.temperature).to(hidden_RH.dtype)
            del probs
            if need_h:
                grad_h[c] = g_logits @ weight_VH
            if grad_w is not None:
                grad_w += (g_logits.t() @ h).to(acc)
            if need_b:
                grad_b += g_logits.sum(0).to(acc)
        if by_vocab:
            grad_w = _weight_grad_by_vocab(
                hidden_RH, weight_VH, bias_V, ids_R, lse_R, grad_logp_R, ctx.temperature,
                ctx.chunk_rows * weight_VH.shape[0], compute,
            )  # fmt: skip
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight_VH.dtype),
            None if grad_b is None else grad_b.to(bias_V.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def _weight_grad_by_vocab(hidden_RH, weight_VH, bias_V, ids_R, lse_R, grad_logp_R, temperature, elements, compute):
    """d W of the head, one block of vocabulary rows at a time over every token (see the module docstring):
    the same logits gradient, element by element, as the token-chunk loop, without a float32 [V, H] buffer."""
    R, V = hidden_RH.shape[0], weight_VH.shape[0]
    cols = max(1, elements // max(R, 1))
    grad_w = torch.empty_like(weight_VH)
    scale_R1 = -grad_logp_R.to(compute).unsqueeze(-1) / temperature
    for v0 in range(0, V, cols):
        v1 = min(V, v0 + cols)
        probs = _scaled_logits(hidden_RH, weight_VH[v0:v1], None if bias_V is None else bias_V[v0:v1], temperature,
                               compute)  # fmt: skip
        probs.sub_(lse_R.unsqueeze(-1)).exp_()
        # p - onehot in this block's columns; tokens outside it add -0.0 (no change). A scatter, not a nonzero():
        # no host sync per block on an accelerator.
        inside_R1 = ((ids_R >= v0) & (ids_R < v1)).unsqueeze(1)
        probs.scatter_add_(1, (ids_R - v0).clamp(0, v1 - v0 - 1).unsqueeze(1), -inside_R1.to(probs.dtype))
        grad_w[v0:v1] = probs.mul_(scale_R1).to(hidden_RH.dtype).t() @ hidden_RH
    return grad_w


def _scaled_logits(h_RH, weight_VH, bias_V, temperature, compute):
    """[R, V] logits / temperature in the compute dtype: the head's matmul in the weight's dtype, as the model's
    own head would compute it, then one float32 copy divided in place."""
    s = F.linear(h_RH, weight_VH, bias_V).to(compute)
    return s if temperature == 1.0 else s.div_(temperature)


def head_logprobs(
    hidden_NTH: torch.Tensor,
    weight_VH: torch.Tensor,
    ids_NT: torch.Tensor,
    temperature: float = 1.0,
    bias_V: torch.Tensor | None = None,
    with_entropy: bool = False,
    chunk_elements: int = HEAD_CHUNK_ELEMENTS,
    keep_probs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([N, T] log-prob of each id, [N, T] entropy or None) under ``softmax((h W^T + b) / temperature)``.

    ``hidden_NTH[:, t]`` must be the final (normed) hidden state that *predicted* ``ids_NT[:, t]``. The
    log-probs are differentiable in hidden states, weight and bias; the entropy is not (detached, as the
    loss uses it). ``chunk_elements`` bounds one chunk's logits: ``chunk_elements // V`` tokens at a time.
    ``keep_probs``: keep the [N * T, V] float32 probabilities for backward instead of recomputing them there
    (memory for time; same values). Ignored where no gradient will be taken.
    """
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 (the sampling temperature the completions were drawn at); got {temperature}."
        )
    if hidden_NTH.shape[:-1] != ids_NT.shape:
        raise ValueError(
            f"hidden states {tuple(hidden_NTH.shape)} and ids {tuple(ids_NT.shape)} disagree: hidden states must "
            "be [N, T, H] for ids [N, T] (the positions that predict each completion token)."
        )
    if weight_VH.shape[1] != hidden_NTH.shape[-1]:
        raise ValueError(f"LM-head weight {tuple(weight_VH.shape)} does not take hidden size {hidden_NTH.shape[-1]}.")
    H, V = hidden_NTH.shape[-1], weight_VH.shape[0]
    chunk_rows = max(1, chunk_elements // max(V, 1))
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden_NTH, weight_VH, bias_V))
    logp_R, ent_R = _HeadLogProb.apply(
        hidden_NTH.reshape(-1, H), weight_VH, bias_V, ids_NT.reshape(-1), float(temperature), chunk_rows,
        with_entropy, keep_probs and grads,
    )  # fmt: skip
    return logp_R.view(ids_NT.shape), ent_R.view(ids_NT.shape) if with_entropy else None
