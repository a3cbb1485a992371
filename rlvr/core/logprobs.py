"""Per-token log-probs, entropies and completion masks from logits.

Log-probs and entropies come from *temperature-scaled* logits (``logits / T_sample``), the distribution the
completions were actually sampled from; TRL 1.16 does the same. Scoring with unscaled logits makes even a
perfectly on-policy ratio differ from 1.

Memory: the logits of a [N, T, V] batch are the largest tensor of the step (N=64, T=1024, V=152k in
bf16 is 20 GB). ``log_softmax(logits.float())`` would add a float32 copy *twice* that size and autograd
would keep it alive until backward. :func:`token_logprobs` instead works on row chunks, keeps only
[N, T] outputs plus the logits autograd already holds, and recomputes the softmax chunk by chunk in
backward: peak extra memory is one float32 chunk (``chunk_elements``), not the full tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["completion_mask", "entropy_from_logits", "token_logprobs"]

DEFAULT_CHUNK_ELEMENTS = 1 << 25  # 32M logits per chunk: 128 MiB of float32 work space


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_chunks(num_rows: int, vocab: int, chunk_elements: int):
    rows = max(1, chunk_elements // max(vocab, 1))
    for start in range(0, num_rows, rows):
        yield slice(start, min(start + rows, num_rows))


class _TokenLogProb(torch.autograd.Function):
    """``log softmax(logits / τ)[ids]`` with a chunked forward and a recomputing backward.

    d logp / d logits = (onehot(id) - softmax(logits / τ)) / τ, rebuilt per chunk in backward.
    """

    @staticmethod
    def forward(ctx, logits_RV: torch.Tensor, ids_R: torch.Tensor, temperature: float, chunk_elements: int):
        compute = _compute_dtype(logits_RV.dtype)
        out_R = torch.empty(ids_R.shape, dtype=compute, device=logits_RV.device)
        for rows in _row_chunks(logits_RV.shape[0], logits_RV.shape[1], chunk_elements):
            scaled = logits_RV[rows].to(compute) / temperature
            picked = scaled.gather(-1, ids_R[rows].unsqueeze(-1)).squeeze(-1)
            out_R[rows] = picked - torch.logsumexp(scaled, dim=-1)
        ctx.save_for_backward(logits_RV, ids_R)
        ctx.temperature, ctx.chunk_elements = temperature, chunk_elements
        return out_R

    @staticmethod
    def backward(ctx, grad_R: torch.Tensor):
        logits_RV, ids_R = ctx.saved_tensors
        compute = _compute_dtype(logits_RV.dtype)
        grad_logits_RV = torch.empty_like(logits_RV)
        for rows in _row_chunks(logits_RV.shape[0], logits_RV.shape[1], ctx.chunk_elements):
            probs = torch.softmax(logits_RV[rows].to(compute) / ctx.temperature, dim=-1)
            probs.scatter_add_(-1, ids_R[rows].unsqueeze(-1), -torch.ones_like(probs[:, :1]))  # p - onehot
            g = grad_R[rows].to(compute).unsqueeze(-1)
            grad_logits_RV[rows] = (probs * (-g / ctx.temperature)).to(logits_RV.dtype)
        return grad_logits_RV, None, None, None


def token_logprobs(
    logits_NTV: torch.Tensor,
    ids_NT: torch.Tensor,
    temperature: float = 1.0,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """[N, T] log-probability of each token under ``softmax(logits / temperature)``, differentiable.

    ``logits_NTV[:, t]`` must be the logits that *predicted* ``ids_NT[:, t]`` (i.e. already shifted by one
    relative to the model's input). Float32 result for half/bfloat16/float32 logits, float64 for float64.
    """
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 (the sampling temperature the completions were drawn at); got {temperature}."
        )
    if logits_NTV.shape[:-1] != ids_NT.shape:
        raise ValueError(
            f"logits {tuple(logits_NTV.shape)} and ids {tuple(ids_NT.shape)} disagree: logits must be [N, T, V] "
            "for ids [N, T] (slice the model's logits to the completion positions, shifted by one)."
        )
    V = logits_NTV.shape[-1]
    logp_R = _TokenLogProb.apply(logits_NTV.reshape(-1, V), ids_NT.reshape(-1), float(temperature), chunk_elements)
    return logp_R.view(ids_NT.shape)


def entropy_from_logits(
    logits_NTV: torch.Tensor, temperature: float = 1.0, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
) -> torch.Tensor:
    """[N, T] entropy of ``softmax(logits / temperature)``, computed chunk by chunk.

    Meant for metrics and the top-entropy token mask (call it under ``torch.no_grad()``: then only one chunk
    of float32 work space is alive). It stays differentiable, at the cost of autograd keeping every chunk.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}.")
    V = logits_NTV.shape[-1]
    flat_RV = logits_NTV.reshape(-1, V)
    compute = _compute_dtype(logits_NTV.dtype)
    pieces = []
    for rows in _row_chunks(flat_RV.shape[0], V, chunk_elements):
        logp = torch.log_softmax(flat_RV[rows].to(compute) / temperature, dim=-1)
        # A -inf logit (a banned token) has p = 0 and contributes 0, not 0 · -inf = NaN.
        pieces.append(-(logp.exp() * torch.nan_to_num(logp, neginf=0.0)).sum(-1))
    if not pieces:
        return torch.zeros(logits_NTV.shape[:-1], dtype=compute, device=logits_NTV.device)
    return torch.cat(pieces).view(logits_NTV.shape[:-1])


def completion_mask(ids_NT: torch.Tensor, eos_token_id: int | Sequence[int]) -> torch.Tensor:
    """[N, T] int64 mask: 1 for every token up to *and including* the first EOS, 0 after it.

    A completion with no EOS (truncated at the length limit) is all ones. ``eos_token_id`` may be a list
    (chat models often stop on several ids). Tokens after the first EOS are padding or garbage; including
    the EOS itself is what teaches the model to stop.
    """
    eos = torch.as_tensor(eos_token_id, device=ids_NT.device).reshape(-1)
    is_eos_NT = torch.isin(ids_NT, eos).long()
    # EOS seen strictly before position t <=> (inclusive cumsum - self) > 0.
    return ((is_eos_NT.cumsum(dim=1) - is_eos_NT) == 0).long()
