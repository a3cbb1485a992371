"""``native``: rlvr's batched sampler over the live policy model (docs/rollout.md).

What it does differently from ``transformers.generate`` with ``num_return_sequences=G`` (TRL's path):

- **Prompt prefilled once per group.** The B distinct prompts go through one forward; their KV is
  then broadcast into the G decode rows of each group (a memory copy, no recompute). TRL recomputes
  every prompt G times.
- **Preallocated KV cache** (fast path): one ``[N, H_kv, P + max_tokens, D]`` buffer per layer, written
  in place; no per-step ``torch.cat`` of a growing cache.
- **Finished rows leave the work.** When a quarter of the rows in the batch have finished (EOS or a
  stop string), the survivors are compacted (one gather of the cache); between compactions the
  finished rows ride along, costing at most 1/3 extra work while saving a copy per step.
- **Little per-token Python.** Sampling is specialised per request (the default T > 0 with no filters
  is log_softmax, an inverse-CDF draw and a gather); host syncs happen every ``sync_every`` steps
  (1 on CPU, where they are free; 8 on CUDA, where each one stalls the stream).

Three decoders behind the loop:

- ``kernels/decode_cpu.c`` (``cpu_kernel``) — on CPU, for float32 Llama / Qwen2 / Qwen3 built from
  plain modules and requests without top-k / top-p / min-p / repetition penalty: prefill and whole
  decode loops in C, one slice of rows per core, the G rows of a group reading one copy of its
  prompt's KV. The default there (``cpu_kernel=None``); built on first use (about a second). Tested
  for logits equality with the Hugging Face forward at every step. With ``compute_dtype="bfloat16"``
  on a CPU with AVX512-BF16 it reads bfloat16 copies of the projections and the LM head (bf16 inputs,
  float32 sums); tested against the float32 forward of the same rounding.

- ``LlamaFamilyDecoder`` — Llama, Qwen2, Qwen3 (and their PEFT-wrapped forms): runs the model's own
  live parameters (``F.linear`` on plain layers, the module itself for LoRA or other wrapped
  layers, the model's rotary module for the RoPE table) around a preallocated cache. On CPU the
  plain q/k/v and gate/up weights are concatenated once per ``generate`` call (the policy cannot
  change during one) so each is one matmul; decode attention is baddbmm / softmax / bmm over a
  bucketed key prefix. Tested for logits equality with the Hugging Face forward.
- ``HFCacheDecoder`` — any causal LM, through the model's own forward and Cache API
  (``batch_repeat_interleave`` to share the prompt, ``batch_select_indices`` to drop rows).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F

from rlvr.rollout import cpu_kernel
from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.common import (
    FasterOf,
    TokenSampler,
    batch_decode,
    left_pad,
    make_completion,
    make_generator,
    one_thread_suits,
    policy_eval,
    resolve_eos_ids,
    resolve_pad_id,
    stop_prefix_length,
    torch_threads,
    validate_request,
)


FAST_PATH_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# Decode attention's key length is rounded up to a multiple of this (see decode).
KEY_BUCKET = 32


def _unwrap(model):
    """The transformers CausalLM inside a PEFT wrapper (LoRA layers stay in place inside it)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def kernel_unsupported(model) -> str | None:
    """Why the C decode kernel cannot run this policy whatever the request, or None."""
    ok, why = fast_path_supported(model)
    return cpu_kernel.unsupported(_unwrap(model)) if ok else why


def fast_path_supported(model) -> tuple[bool, str]:
    """Whether ``LlamaFamilyDecoder`` implements this model exactly, and if not, why."""
    lm = _unwrap(model)
    cfg = getattr(lm, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in FAST_PATH_MODEL_TYPES:
        return False, f"model_type {model_type!r} is not one of {FAST_PATH_MODEL_TYPES}"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(cfg, "use_sliding_window", False):
        return (
            False,
            "sliding-window attention layers are not implemented by the fast path",
        )
    base = getattr(lm, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if base is None or not all(hasattr(base, a) for a in needed) or not hasattr(lm, "lm_head"):
        return (
            False,
            "unexpected module layout (expected model.{embed_tokens,layers,norm,rotary_emb} and lm_head)",
        )
    return True, ""


def _plain(module) -> bool:
    return type(module) is torch.nn.Linear


def _cast(t, dtype):
    """A request-long copy of a live parameter in the compute dtype (the tensor itself when it already is)."""
    return t if t is None or dtype is None or t.dtype == dtype else t.detach().to(dtype)


def _linear(module, dtype=None):
    """``F.linear`` on a plain ``nn.Linear``'s live parameters (skips ``Module.__call__``); anything
    else (a LoRA / quantised wrapper) is called as the module it is. ``dtype``: compute in that dtype
    (weights cast once per request)."""
    if _plain(module):
        weight, bias = _cast(module.weight, dtype), _cast(module.bias, dtype)
        return lambda x: F.linear(x, weight, bias)
    return _in_dtype(module, dtype)


def _in_dtype(module, dtype):
    """A wrapped module (LoRA, an unusual MLP) on activations of ``dtype``: called under autocast to that
    dtype, so its own float32 weights meet bf16 inputs the way the trainer's autocast runs them."""
    param = next(module.parameters(), None)
    if dtype is None or param is None or param.dtype == dtype:
        return module

    def call(*args):
        with torch.autocast(param.device.type, dtype):
            return module(*args).to(dtype)

    return call


def _fused_linear(modules, dtype=None):
    """One ``F.linear`` computing ``cat([m(x) for m in modules], -1)`` when every module is a plain
    ``nn.Linear``: their live weights (and biases, zeros where a module has none) concatenated once.
    The copy is made per ``generate`` call, during which the policy does not change, and costs a
    weight read (~0.1 ms for the 25M model's layer); it turns 3 kernels per step into 1, which is
    what counts at a tiny model's size. ``None`` when any module is wrapped (LoRA): those are called
    one by one so the adapter is honoured, and off CPU: there the copy would hold a second set of
    these weights (two thirds of a Llama layer) in accelerator memory for a gain measured only for
    CPU dispatch overhead."""
    if not all(_plain(m) and m.weight.device.type == "cpu" for m in modules):
        return None
    weight = _cast(torch.cat([m.weight for m in modules], dim=0), dtype)
    if all(m.bias is None for m in modules):
        return lambda x: F.linear(x, weight)
    bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules])
    bias = _cast(bias, dtype)
    return lambda x: F.linear(x, weight, bias)


def _residual_linear(module, dtype=None):
    """``(x, h) -> x + module(h)`` for 2-D activations; one ``addmm`` (matmul and residual add in
    one kernel) when the module is a plain bias-free ``nn.Linear``."""
    if _plain(module) and module.bias is None:
        weight_t = _cast(module.weight, dtype).t()
        return lambda x, h: torch.addmm(x, h, weight_t)
    linear = _linear(module, dtype)
    return lambda x, h: x + linear(h)


def _rms_norm(module, dtype: torch.dtype):
    """transformers' RMSNorm, ``weight · x · rsqrt(mean(x²) + eps)``, in five kernels where that is
    what the module computes (float32 activations, a plain Llama/Qwen norm); the module itself
    otherwise (bf16 casts, Gemma's 1 + w, ...).

    Why not ``F.rms_norm``: on CPU it is a composite of ~8 kernels (dtype round trips, pow, mean,
    add, rsqrt, two muls), and a decode step runs 2·layers + 1 of them. Here mean(x²) comes from
    one ``vector_norm`` (‖x‖²/E), then ``addcmul`` + ``rsqrt_`` and two muls; measured 14 µs vs
    25 µs for the tiny model's [64, 96]. The result differs from transformers' by float rounding
    (≤ 5e-7 absolute measured there), inside the tests' logits tolerance."""
    weight, eps = (
        getattr(module, "weight", None),
        getattr(module, "variance_epsilon", None),
    )
    if dtype == torch.float32 and type(module).__name__ in _PLAIN_RMS_NORMS and weight is not None and eps is not None:
        inv_dim = 1.0 / weight.shape[-1]
        eps_t = torch.tensor(eps, dtype=weight.dtype, device=weight.device)

        def rms_norm(x):
            norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
            return x * torch.addcmul(eps_t, norm, norm, value=inv_dim).rsqrt_() * weight

        return rms_norm
    if weight is not None and eps is not None and type(module).__name__ in _PLAIN_RMS_NORMS and weight.dtype != dtype:
        # Reduced-precision compute over float32 weights: transformers' own order for a model stored in
        # that dtype (statistics in float32, the normalised activations cast down, then the weight).
        low_weight = weight.detach().to(dtype)

        def rms_norm_low(x):
            x32 = x.float()
            return (x32 * x32.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()).to(dtype) * low_weight

        return rms_norm_low
    return module


_PLAIN_RMS_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


class _LayerOps:
    """One decoder layer's callables on 2-D activations ``[rows, E]``, resolved once per request
    from the live parameters (fused copies of plain projections; wrapped ones called as modules).

    ``qkv(h)`` is ``[rows, (H + 2·Hkv)·D]``: queries, keys, values side by side, so RoPE can rotate
    the contiguous q|k block in one pass. ``attn_out(x, o)`` and ``mlp_out(x, h)`` return the
    residual stream after the block.
    """

    def __init__(self, layer, dtype: torch.dtype):
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1 = _rms_norm(layer.input_layernorm, dtype)
        self.norm2 = _rms_norm(layer.post_attention_layernorm, dtype)
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        fused = _fused_linear(projections, dtype)
        if fused is None:
            q, k, v = (_linear(m, dtype) for m in projections)
            fused = lambda h: torch.cat((q(h), k(h), v(h)), dim=-1)
        self.qkv = fused
        self.attn_out = _residual_linear(attn.o_proj, dtype)
        self.q_norm = _rms_norm(attn.q_norm, dtype) if hasattr(attn, "q_norm") else None
        self.k_norm = _rms_norm(attn.k_norm, dtype) if hasattr(attn, "k_norm") else None
        act = getattr(mlp, "act_fn", None)
        plain_silu = all(_plain(getattr(mlp, n, None)) for n in ("gate_proj", "up_proj", "down_proj")) and type(
            act
        ).__name__ in ("SiLUActivation", "SiLU")
        if not plain_silu:
            mlp_in_dtype = _in_dtype(mlp, dtype)
            self.mlp_out = lambda x, h: x + mlp_in_dtype(h)
            return
        down = _residual_linear(mlp.down_proj, dtype)
        gate_up = _fused_linear((mlp.gate_proj, mlp.up_proj), dtype)
        if gate_up is None:
            gate, up = _linear(mlp.gate_proj, dtype), _linear(mlp.up_proj, dtype)
            self.mlp_out = lambda x, h: down(x, F.silu(gate(h)) * up(h))
            return
        inter = mlp.gate_proj.out_features

        def mlp_out(x, h):
            gu = gate_up(h)
            return down(x, F.silu(gu[:, :inter]) * gu[:, inter:])

        self.mlp_out = mlp_out


class LlamaFamilyDecoder:
    """Prefill + one-token decode for Llama / Qwen2 / Qwen3 with a preallocated KV cache.

    Shapes: B prompts, n completions each, N = B·n rows, M rows still in the work (M ≤ N),
    P padded prompt length, S = P + max_new cache length, H query heads, Hkv key/value heads,
    Gq = H / Hkv query heads per KV head, D head dim.
    """

    def __init__(self, model, compute_dtype: torch.dtype | None = None):
        lm = _unwrap(model)
        base = lm.model
        # bfloat16 activations, KV cache and matmuls over request-long bf16 copies of the float32 weights
        # (mixed precision); the logits return in float32 for the sampler. None: the weights' dtype.
        self.compute_dtype = compute_dtype
        self.embed, self.layers, self.norm, self.rotary, self.lm_head = (
            base.embed_tokens,
            list(base.layers),
            base.norm,
            base.rotary_emb,
            lm.lm_head,
        )
        attn0 = self.layers[0].self_attn
        cfg = lm.config
        self.H = cfg.num_attention_heads
        self.Hkv = getattr(cfg, "num_key_value_heads", None) or self.H
        self.D = attn0.head_dim
        self.Gq = self.H // self.Hkv
        self.scale = attn0.scaling

    def _rope_qk(self, qkv, rows: int, cos, sin, qk_norms):
        """RoPE on the q|k block of ``qkv`` (after Qwen3's per-head norms): ``[rows, H + Hkv, D]``.
        ``q·cos + roll(q, D/2)·sin±`` with a sign-folded sine is exactly transformers'
        ``rotate_half``; q and k share the pass."""
        H, Hkv, D = self.H, self.Hkv, self.D
        qk = qkv[:, : (H + Hkv) * D].view(rows, H + Hkv, D)
        if qk_norms is not None:
            q_norm, k_norm = qk_norms
            qk = torch.cat((q_norm(qk[:, :H]), k_norm(qk[:, H:])), dim=1)
        return torch.addcmul(qk * cos, qk.roll(D // 2, -1), sin)

    def prefill(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, n: int, max_new: int) -> torch.Tensor:
        """Run the B prompts once, broadcast their KV into the n rows of each group; returns logits_BV
        of each prompt's last position."""
        B, P = ids_BP.shape
        N, S = B * n, P + max_new
        H, Hkv, D = self.H, self.Hkv, self.D
        device = ids_BP.device
        valid_BP = mask_BP.bool()
        pos_BP = (mask_BP.cumsum(-1) - 1).clamp(min=0)
        x = self.embed(ids_BP).flatten(0, 1)  # [B·P, E]
        x = x if self.compute_dtype is None else x.to(self.compute_dtype)
        self.layer_ops = [_LayerOps(layer, x.dtype) for layer in self.layers]
        # RoPE table for every position this request can reach, from the model's own rotary module
        # (so scaled / NTK variants are honoured); the sine's first half is negated so that
        # rotate_half(q)·sin == roll(q, D/2)·sin_signed.
        cos_1SD, sin_1SD = self.rotary(x, torch.arange(S, device=device)[None])
        cos_SD = cos_1SD[0]
        sin_signed_SD = torch.cat((-sin_1SD[0, :, : D // 2], sin_1SD[0, :, D // 2 :]), dim=-1)
        self.rope_SR = torch.cat((cos_SD, sin_signed_SD), dim=-1)  # R = 2D
        self.final_norm, self.head = (
            _rms_norm(self.norm, x.dtype),
            _linear(self.lm_head, x.dtype),
        )
        self.embed_weight = self.embed.weight if type(self.embed) is torch.nn.Embedding else None
        cos_Q1D = cos_SD[pos_BP].flatten(0, 1)[:, None]  # Q = B·P
        sin_Q1D = sin_signed_SD[pos_BP].flatten(0, 1)[:, None]
        # Causal and padding mask; each position also sees itself so left-pad rows are never all -inf
        # (their outputs are never read, and their keys are masked for every real query).
        causal_PP = torch.ones(P, P, dtype=torch.bool, device=device).tril()
        eye_PP = torch.eye(P, dtype=torch.bool, device=device)
        attn_mask = ((causal_PP[None] & valid_BP[:, None, :]) | eye_PP[None])[:, None]  # [B, 1, P, P]
        # Zero-filled, not empty: decode attends over a bucketed key length that can include
        # not-yet-written slots (masked with -inf), and 0·garbage could be NaN.
        self.k_cache = [torch.zeros(N, Hkv, S, D, dtype=x.dtype, device=device) for _ in self.layers]
        self.v_cache = [torch.zeros(N, Hkv, S, D, dtype=x.dtype, device=device) for _ in self.layers]
        self.qk_norms = [None if ops.q_norm is None else (ops.q_norm, ops.k_norm) for ops in self.layer_ops]
        for ops, qk_norms, kc, vc in zip(self.layer_ops, self.qk_norms, self.k_cache, self.v_cache):
            qkv = ops.qkv(ops.norm1(x))
            qk = self._rope_qk(qkv, B * P, cos_Q1D, sin_Q1D, qk_norms)
            qk = qk.view(B, P, H + Hkv, D)
            q = qk[:, :, :H].transpose(1, 2)  # [B, H, P, D]
            k = qk[:, :, H:].transpose(1, 2)  # [B, Hkv, P, D]
            v = qkv[:, (H + Hkv) * D :].view(B, P, Hkv, D).transpose(1, 2)
            # Prompt KV shared by the group: one broadcast copy into the n rows, no recompute.
            kc.view(B, n, Hkv, S, D)[:, :, :, :P].copy_(k[:, None])
            vc.view(B, n, Hkv, S, D)[:, :, :, :P].copy_(v[:, None])
            if self.Gq > 1:
                k, v = (
                    k.repeat_interleave(self.Gq, dim=1),
                    v.repeat_interleave(self.Gq, dim=1),
                )
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
            x = ops.attn_out(x, o.transpose(1, 2).reshape(B * P, H * D))
            x = ops.mlp_out(x, ops.norm2(x))
        # Additive key mask for decode, one row per (sequence, KV head) as the batched matmuls
        # see them: 0 for real keys, -inf for left padding and for slots not yet written (each
        # decode step opens its own slot).
        key_bias_NS = torch.full((N, S), float("-inf"), dtype=x.dtype, device=device)
        key_bias_NS[:, :P].masked_fill_(valid_BP.repeat_interleave(n, dim=0), 0.0)
        self.key_bias_XS = key_bias_NS.repeat_interleave(Hkv, dim=0)  # X = N·Hkv
        self.pos_N = mask_BP.sum(-1).repeat_interleave(n, dim=0)  # next position = prompt length
        self.cur = P
        last_BE = x.view(B, P, -1)[:, -1]
        if self.compute_dtype is None:
            return self.lm_head(self.norm(last_BE))
        return self.head(self.final_norm(last_BE)).float()

    def decode(self, token_M: torch.Tensor) -> torch.Tensor:
        """Append one token per row; returns logits_MV.

        Written for few kernels per layer, because at the default task's size (a sub-million-
        parameter model, 64 rows) dispatch, not FLOPs, is the cost (per layer: RMSNorm, one fused
        q|k|v matmul, a 3-kernel RoPE, two cache writes, attention as baddbmm / softmax / bmm over
        the valid cache prefix, the output projection fused with its residual add, RMSNorm, one fused
        gate|up matmul, SiLU·up, down projection fused with its residual add). Attention is plain
        batched matmuls rather than SDPA: for one query per row SDPA's CPU kernel measured ~360 µs a
        call on the tiny model, the three matmuls a fraction of that.
        """
        M, s = token_M.shape[0], self.cur
        H, Hkv, Gq, D = self.H, self.Hkv, self.Gq, self.D
        x = F.embedding(token_M, self.embed_weight) if self.embed_weight is not None else self.embed(token_M)  # [M, E]
        x = x if self.compute_dtype is None else x.to(self.compute_dtype)
        rope_M1R = self.rope_SR.index_select(0, self.pos_N)[:, None]  # one gather for cos and sin
        cos_M1D, sin_M1D = rope_M1R[..., :D], rope_M1R[..., D:]
        # Grouped-query attention without expanding K/V: the Gq query heads that share a KV head are
        # the rows of one small matmul against that head's cache, [Gq, D] x [D, K].
        # K is s + 1 rounded up to a multiple of KEY_BUCKET (the extra slots are zero and masked):
        # ATen's CPU bmm runs matmuls with fewer than 400 multiply-adds per output matrix through a
        # scalar loop that measured ~5x slower than its BLAS path here (the tiny model's [1, 13] x
        # [13, 24] took 130 µs for 256 heads, [1, 17] x [17, 24] 26 µs); the padding lifts short
        # contexts onto the BLAS path for a few wasted multiply-adds.
        K = min(self.key_bias_XS.shape[-1], -(-(s + 1) // KEY_BUCKET) * KEY_BUCKET)
        self.key_bias_XS[:, s] = 0.0
        bias_X1K = self.key_bias_XS[:, None, :K]
        for ops, qk_norms, kc, vc in zip(self.layer_ops, self.qk_norms, self.k_cache, self.v_cache):
            qkv = ops.qkv(ops.norm1(x))
            qk = self._rope_qk(qkv, M, cos_M1D, sin_M1D, qk_norms)
            kc[:, :, s] = qk[:, H:]
            vc[:, :, s] = qkv[:, (H + Hkv) * D :].view(M, Hkv, D)
            q_XGD = qk[:, :H].reshape(M * Hkv, Gq, D)
            k_XKD = kc[:, :, :K].flatten(0, 1)
            v_XKD = vc[:, :, :K].flatten(0, 1)
            scores_XGK = torch.baddbmm(bias_X1K, q_XGD, k_XKD.transpose(1, 2), alpha=self.scale)
            # Softmax in float32 for a reduced-precision cache (transformers' eager attention does the same).
            probs_XGK = scores_XGK.softmax(dim=-1) if x.dtype == torch.float32 else (
                scores_XGK.softmax(dim=-1, dtype=torch.float32).to(x.dtype))
            o_XGD = torch.bmm(probs_XGK, v_XKD)
            x = ops.attn_out(x, o_XGD.view(M, H * D))
            x = ops.mlp_out(x, ops.norm2(x))
        self.cur += 1
        self.pos_N = self.pos_N + 1
        return self.head(self.final_norm(x)).float()

    def select(self, rows_M: torch.Tensor) -> None:
        """Keep only ``rows_M`` (one gather per cache tensor)."""
        self.k_cache = [k.index_select(0, rows_M) for k in self.k_cache]
        self.v_cache = [v.index_select(0, rows_M) for v in self.v_cache]
        Hkv, S = self.Hkv, self.key_bias_XS.shape[-1]
        self.key_bias_XS = self.key_bias_XS.view(-1, Hkv, S).index_select(0, rows_M).view(-1, S)
        self.pos_N = self.pos_N.index_select(0, rows_M)

    def release(self) -> None:
        self.k_cache = self.v_cache = self.layer_ops = self.qk_norms = []


class HFCacheDecoder:
    """Any causal LM through its own forward and Cache API. Slower than the fast path (the cache grows
    by concatenation and every layer goes through the generic attention dispatch) but exact for
    every architecture transformers implements."""

    def __init__(self, model):
        self.model = model
        params = inspect.signature(_unwrap(model).forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers 5 renamed it
        self.keep_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def _cache_of(self, out):
        cache = getattr(out, "cache", None)
        return cache if cache is not None else out.past_key_values

    def prefill(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, n: int, max_new: int) -> torch.Tensor:
        B, P = ids_BP.shape
        pos_BP = (mask_BP.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids_BP,
            attention_mask=mask_BP,
            position_ids=pos_BP,
            use_cache=True,
            **self.keep_kw,
        )
        self.cache = self._cache_of(out)
        self.cache.batch_repeat_interleave(n)  # prompt KV shared by the group: copied, not recomputed
        self.mask_NS = torch.ones(B * n, P + max_new, dtype=mask_BP.dtype, device=mask_BP.device)
        self.mask_NS[:, :P] = mask_BP.repeat_interleave(n, dim=0)
        self.pos_N = mask_BP.sum(-1).repeat_interleave(n, dim=0)
        self.cur = P
        return out.logits[:, -1]

    def decode(self, token_M: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=token_M[:, None],
            attention_mask=self.mask_NS[:, : self.cur + 1],
            position_ids=self.pos_N[:, None],
            use_cache=True,
            **{self.cache_kw: self.cache},
            **self.keep_kw,
        )
        self.cache = self._cache_of(out)
        self.cur += 1
        self.pos_N = self.pos_N + 1
        return out.logits[:, -1]

    def select(self, rows_M: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows_M)
        self.mask_NS = self.mask_NS.index_select(0, rows_M)
        self.pos_N = self.pos_N.index_select(0, rows_M)

    def release(self) -> None:
        self.cache = None


class NativeEngine:
    """Fast batched sampling from the live policy. ``samples_live_policy = True``.

    Options:
      fast_path: None (auto: the Llama-family decoder when ``fast_path_supported``), True (require it;
        error if unsupported), False (always the generic HF-cache decoder).
      compact_fraction: compact the batch when this fraction of its rows has finished (default 0.25).
      sync_every: host syncs (finish checks) every k decode steps; default 1 on CPU, 8 on CUDA.
      cpu_kernel: None (auto: the C decode loop whenever it implements the model and request
        exactly, see ``cpu_kernel.unsupported``), True (require it: an error naming why not), False
        (never: the PyTorch decoders). Which one the last call used: ``last_decoder``.
      cpu_threads: the C kernel's row slices (default: ``torch.get_num_threads()`` at each call, one
        per core). For the PyTorch decoders, intra-op threads while sampling on CPU. "auto"
        (default): 1 for models with hidden_size < 512, else torch's current setting. A decode step
        of a small model is hundreds of ops of a few microseconds each; OpenMP's fork/join per op costs as much as the op, and on a
        shared machine a descheduled sibling thread stalls every op (measured on the 2-core dev box
        under load: a 64x96x96 matmul took 0.7 ms on 1 thread, 12 ms on 2). The previous setting is
        restored after each call, so the trainer's forward/backward keep their threads.
      eos_token_ids: override the model's EOS ids.
      compute_dtype: None (the weights' dtype) or "bfloat16": the fast PyTorch decoder runs activations,
        KV cache and matmuls in bf16 over copies of the float32 weights made once per request (the
        trainer's ``train.mixed_precision=bf16`` sets it); logits return to float32 for sampling. The C
        kernel then multiplies bfloat16 copies of the projections and the LM head, where the CPU has
        AVX512-BF16 (``cpu_kernel.bf16_fast``; elsewhere the request goes to the bf16 PyTorch decoder).
        Models without the fast path are not affected by it: they run in float32 and ``describe`` says so.
    """

    samples_live_policy = True
    receives_weights = True  # trivially: it *is* the policy
    reports_logprobs = True
    policy_lag = 0

    def __init__(
        self,
        model,
        tokenizer,
        eos_token_ids: int | Sequence[int] | None = None,
        fast_path: bool | None = None,
        compact_fraction: float = 0.25,
        sync_every: int | None = None,
        cpu_threads: int | str = "auto",
        cpu_kernel: bool | None = None,
        compute_dtype: str | None = None,
    ):
        self.model = model
        if compute_dtype not in (None, "float32", "bfloat16"):
            raise ValueError(f"compute_dtype must be None, 'float32' or 'bfloat16', got {compute_dtype!r}.")
        self.compute_dtype = None if compute_dtype in (None, "float32") else torch.bfloat16
        self.tokenizer = tokenizer
        self.eos_ids = resolve_eos_ids(model, tokenizer, eos_token_ids)
        self.pad_id = resolve_pad_id(tokenizer, self.eos_ids)
        supported, why = fast_path_supported(model)
        if fast_path and not supported:
            raise ValueError(
                f"native engine: fast_path=True but the fast decoder cannot run this model ({why}). "
                "Leave fast_path unset to fall back to the generic Hugging Face cache decoder."
            )
        self.fast_path = supported if fast_path is None else bool(fast_path)
        if not 0.0 < compact_fraction <= 1.0:
            raise ValueError(f"compact_fraction must be in (0, 1], got {compact_fraction}.")
        self.compact_fraction = compact_fraction
        self.sync_every = sync_every
        # The C kernel runs one row slice per thread: an explicit cpu_threads, else every thread
        # torch may use (read at each call, so torch.set_num_threads still governs it). Taken
        # before "auto" is resolved: that rule is for the PyTorch decoder's per-op threading.
        self.kernel_threads = cpu_threads if isinstance(cpu_threads, int) else None
        # With few rows per core: the cores decoding all rows together or a slice each, by measured time per
        # generated token (cpu_kernel.generate; cooperating won 1.2-1.35x quiet, lost 0.6x with the cores
        # oversubscribed).
        self.kernel_coop = FasterOf([True, False])
        if cpu_threads == "auto":
            cpu_threads = 1 if one_thread_suits(_unwrap(model)) else None
        elif not (isinstance(cpu_threads, int) and cpu_threads >= 1):
            raise ValueError(f"cpu_threads must be 'auto' or an int >= 1, got {cpu_threads!r}.")
        self.cpu_threads = cpu_threads
        if cpu_kernel not in (None, True, False):
            raise ValueError(f"cpu_kernel must be None (auto), True or False, got {cpu_kernel!r}.")
        self.cpu_kernel = cpu_kernel
        # "kernel" or "torch": which decoder the last call used.
        self.last_decoder: str | None = None

    def _decoder(self):
        if self.fast_path:
            return LlamaFamilyDecoder(self.model, self._low_precision())
        return HFCacheDecoder(self.model)

    def _low_precision(self) -> torch.dtype | None:
        """The bf16 compute dtype when it applies: asked for, and the weights are wider."""
        weights = _unwrap(self.model).lm_head.weight.dtype
        return self.compute_dtype if self.compute_dtype is not None and weights == torch.float32 else None

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams) -> list[Completion]:
        validate_request(prompt_ids, n, sampling)
        # Greedy rows of one group are identical: decode one per prompt and repeat it.
        n_decode = 1 if sampling.temperature == 0.0 else n
        workers = self.kernel_threads or torch.get_num_threads()
        on_cpu = next(self.model.parameters()).device.type == "cpu"
        with policy_eval(self.model), torch_threads(self.cpu_threads if on_cpu else None):
            tokens_NC, logp_NC = self._sample(prompt_ids, n_decode, sampling, workers)
        if n_decode != n:
            tokens_NC, logp_NC = (
                tokens_NC.repeat_interleave(n, dim=0),
                logp_NC.repeat_interleave(n, dim=0),
            )
        tokens, logps = tokens_NC.tolist(), logp_NC.tolist()
        eos = set(self.eos_ids)
        lengths = [toks.index(-1) if -1 in toks else len(toks) for toks in tokens]  # -1: row had finished
        ids = [toks[:length] for toks, length in zip(tokens, lengths)]
        texts = batch_decode(self.tokenizer, ids)
        return [
            make_completion(
                row // n,
                row_ids,
                lps[: len(row_ids)],
                bool(row_ids) and row_ids[-1] in eos,
                self.tokenizer,
                sampling.stop,
                text=text,
            )
            for row, (row_ids, lps, text) in enumerate(zip(ids, logps, texts))
        ]

    def _sample(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams, workers: int):
        """Which decoder runs this request (the C kernel where it can, else PyTorch), and run it. Returns
        ``tokens_NC`` (-1 after a row finished) and ``logp_NC``."""
        device = next(self.model.parameters()).device
        ids_BP, mask_BP = left_pad(prompt_ids, self.pad_id, device)
        sampler = TokenSampler(sampling, _unwrap(self.model).config.vocab_size, make_generator(sampling.seed, device))
        why_not = self._kernel_unavailable(sampler, device)
        self.last_decoder = "torch" if why_not else "kernel"
        if why_not is None:
            return self._sample_kernel(ids_BP, mask_BP, n, sampling, sampler.generator, workers)
        return self._sample_torch(prompt_ids, ids_BP, mask_BP, n, sampling, sampler)

    def _sample_torch(self, prompt_ids, ids_BP, mask_BP, n: int, sampling: SamplingParams, sampler: TokenSampler):
        """The PyTorch decode loop: prefill once per prompt, then one decode step per token; every
        ``sync_every`` steps a host check of which rows finished (EOS or a stop string), and the batch is
        compacted once enough of it has."""
        device = ids_BP.device
        B, C = len(prompt_ids), sampling.max_tokens
        N = B * n
        sync_every = self.sync_every or (8 if device.type == "cuda" else 1)
        eos_E = torch.tensor(self.eos_ids, device=device)
        tokens_NC = torch.full((N, C), -1, dtype=torch.long, device=device)
        logp_NC = torch.zeros((N, C), dtype=torch.float32, device=device)
        seen_MV = self._seen_tokens(prompt_ids, n, sampler, device)
        decoder = self._decoder()
        logits_BV = decoder.prefill(ids_BP, mask_BP, n, C)
        # The first token of every row comes from its prompt's last position; no decode step needed.
        logits_MV = logits_BV.repeat_interleave(n, dim=0)
        rows_M = torch.arange(N, device=device)  # which original row each live batch row is
        alive_M = torch.ones(N, dtype=torch.bool, device=device)
        compacted = False
        try:
            for t in range(C):
                token_M, logp_M = sampler(logits_MV, seen_MV)
                if compacted:
                    tokens_NC[rows_M, t] = torch.where(alive_M, token_M, -1)
                    logp_NC[rows_M, t] = logp_M
                else:  # every row still in the batch: a strided copy, cheaper than index_put
                    tokens_NC[:, t] = torch.where(alive_M, token_M, -1)
                    logp_NC[:, t] = logp_M
                is_eos_M = token_M == self.eos_ids[0] if len(self.eos_ids) == 1 else torch.isin(token_M, eos_E)
                alive_M = alive_M & ~is_eos_M
                if seen_MV is not None:
                    seen_MV[torch.arange(token_M.shape[0], device=device), token_M] = True
                if t == C - 1:
                    break
                if (t + 1) % sync_every == 0:
                    alive_cpu = alive_M.tolist()  # host sync
                    if sampling.stop:
                        alive_cpu = self._apply_stops(tokens_NC, rows_M, alive_cpu, t, sampling.stop)
                        alive_M = torch.tensor(alive_cpu, device=device)
                    n_alive = sum(alive_cpu)
                    if n_alive == 0:
                        break
                    if len(alive_cpu) - n_alive >= self.compact_fraction * len(alive_cpu):
                        keep_M = alive_M.nonzero().squeeze(1)  # finished rows leave the batch
                        decoder.select(keep_M)
                        rows_M, token_M, alive_M = rows_M[keep_M], token_M[keep_M], alive_M[keep_M]
                        compacted = True
                        seen_MV = None if seen_MV is None else seen_MV[keep_M]
                logits_MV = decoder.decode(token_M)
        finally:
            decoder.release()
        return tokens_NC, logp_NC

    @staticmethod
    def _seen_tokens(prompt_ids, n: int, sampler: TokenSampler, device) -> torch.Tensor | None:
        """[N, V] bool of the tokens each row has seen (prompt included, as in HF), which the repetition
        penalty needs; None without a penalty."""
        if not sampler.use_penalty:
            return None
        seen_BV = torch.zeros(len(prompt_ids), sampler.vocab_size, dtype=torch.bool, device=device)
        for b, p in enumerate(prompt_ids):  # real tokens only: the pad id may also be a real token
            seen_BV[b, torch.tensor(p, device=device)] = True
        return seen_BV.repeat_interleave(n, dim=0)

    def _kernel_unavailable(self, sampler, device) -> str | None:
        """None when ``kernels/decode_cpu.c`` will run this request, else why not (an error when
        ``cpu_kernel=True``; otherwise ``describe`` says it, which the trainer prints once)."""
        if self.cpu_kernel is False:
            return "cpu_kernel=False"
        if device.type != "cpu":
            why = f"the model is on {device.type}"
        elif not self.fast_path:
            why = "the model has no fast path (generic Hugging Face cache decoder)"
        elif sampler.filtered or sampler.use_penalty:
            why = "top-k / top-p / min-p / repetition penalty are sampled by the PyTorch decoder"
        elif self._low_precision() is not None and not cpu_kernel.bf16_fast():
            why = "bfloat16 compute (compute_dtype) on a CPU without AVX512-BF16 runs in the PyTorch decoder"
        else:
            why = cpu_kernel.unsupported(_unwrap(self.model)) or cpu_kernel.load()[1] or None
            float32 = self._low_precision() is None  # the bf16 product is the kernel's own, never BLAS
            if why is None and float32 and self.cpu_kernel is None and cpu_kernel.sgemm_pointers()[0] is None:
                # Without BLAS the kernel's matmuls are a portable scalar loop, slower than PyTorch at any
                # model size: auto mode picks the kernel only where it is fast (cpu_kernel=True still forces it).
                why = f"no usable BLAS sgemm_ ({cpu_kernel.sgemm_pointers()[2]})"
        if why and self.cpu_kernel:
            raise ValueError(
                f"native engine: cpu_kernel=True but the C decode kernel cannot run this request: "
                f"{why}. Leave cpu_kernel unset to fall back to the PyTorch decoder."
            )
        return why

    def describe(self, sampling: SamplingParams) -> str:
        """Which decoder samples ``sampling`` and why: the C kernel and the PyTorch decoders draw different
        random streams, so a run's samples (not its statistics) depend on it."""
        device = next(self.model.parameters()).device
        sampler = TokenSampler(sampling, _unwrap(self.model).config.vocab_size, make_generator(sampling.seed, device))
        why_not = self._kernel_unavailable(sampler, device)
        if why_not is None:
            if self._low_precision() is not None:
                return "native engine: C decode kernel (bfloat16 weights, AVX512-BF16)"
            matmul = "BLAS sgemm_" if cpu_kernel.sgemm_pointers()[0] is not None else "portable matmul loop (slow)"
            return f"native engine: C decode kernel ({matmul})"
        decoder = "PyTorch fast decoder" if self.fast_path else "PyTorch generic (Hugging Face cache) decoder"
        if self.fast_path and self._low_precision() is not None:
            decoder += " in bfloat16"
        return f"native engine: {decoder}, not the C kernel: {why_not}"

    def _sample_kernel(self, ids_BP, mask_BP, n, sampling, generator, workers):
        """Prefill and decode in C (``cpu_kernel``): one slice of rows per core, every step in one
        call when there are no stop strings (which need a host check after each step)."""
        lib, _ = cpu_kernel.load()
        if workers > 1:
            lib.rlvr_wake(workers - 1)  # the cores spin while the request is set up
        run = cpu_kernel.KernelDecode(
            _unwrap(self.model),
            ids_BP,
            (1 - mask_BP).sum(-1),
            n,
            sampling,
            self.eos_ids,
            generator,
            weight_dtype=self._low_precision() or torch.float32,
        )
        stop_check = None
        if sampling.stop:
            rows_N = torch.arange(run.N)

            def stop_check(t: int) -> bool:
                alive = run.alive_N.tolist()
                stopped = self._apply_stops(run.tokens_NC, rows_N, alive, t, sampling.stop)
                for r, (was, now) in enumerate(zip(alive, stopped)):
                    if was and not now:
                        run.alive_N[r] = 0
                return any(stopped)

        if not cpu_kernel.coop_suits(run, workers):
            cpu_kernel.generate(run, workers, stop_check, coop=False)
            return run.tokens_NC, run.logp_NC
        start = time.perf_counter()
        cpu_kernel.generate(run, workers, stop_check, coop=self.kernel_coop.current())
        generated = int((run.tokens_NC >= 0).sum())
        self.kernel_coop.record((time.perf_counter() - start) / max(generated, 1))
        return run.tokens_NC, run.logp_NC

    def _apply_stops(self, tokens_NC, rows_M, alive_cpu, t, stops) -> list[bool]:
        """Mark rows whose completion now contains a stop string as finished (decodes each live row)."""
        rows = rows_M.tolist()
        out = list(alive_cpu)
        for i, (row, alive) in enumerate(zip(rows, alive_cpu)):
            if not alive:
                continue
            toks = tokens_NC[row, : t + 1].tolist()
            if stop_prefix_length(toks, self.tokenizer, stops) is not None:
                out[i] = False
        return out

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """No-op: the engine samples from the live policy object, so it is always current."""

    def close(self) -> None:
        pass
