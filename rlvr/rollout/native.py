"""``native``: rlvr's batched sampler over the live policy model (issue 8; DESIGN.md §5).

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

Two decoders behind the loop:

- ``LlamaFamilyDecoder`` — Llama, Qwen2, Qwen3 (and their PEFT-wrapped forms): runs the model's own
  live parameters (``F.linear`` / ``F.rms_norm`` on plain layers, the module itself for LoRA or other
  wrapped layers, the model's rotary module for the RoPE table; nothing copied) around a
  preallocated cache, with grouped-query attention as one SDPA call per layer. Tested for logits
  equality with the Hugging Face forward.
- ``HFCacheDecoder`` — any causal LM, through the model's own forward and Cache API
  (``batch_repeat_interleave`` to share the prompt, ``batch_select_indices`` to drop rows).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F

from rlvr.rollout.base import Completion, SamplingParams
from rlvr.rollout.common import (
    TokenSampler,
    batch_decode,
    left_pad,
    make_completion,
    make_generator,
    policy_eval,
    resolve_eos_ids,
    resolve_pad_id,
    stop_prefix_length,
    validate_request,
)

FAST_PATH_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def _unwrap(model):
    """The transformers CausalLM inside a PEFT wrapper (LoRA layers stay in place inside it)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def fast_path_supported(model) -> tuple[bool, str]:
    """Whether ``LlamaFamilyDecoder`` implements this model exactly, and if not, why."""
    lm = _unwrap(model)
    cfg = getattr(lm, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in FAST_PATH_MODEL_TYPES:
        return False, f"model_type {model_type!r} is not one of {FAST_PATH_MODEL_TYPES}"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(
        cfg, "use_sliding_window", False
    ):
        return (
            False,
            "sliding-window attention layers are not implemented by the fast path",
        )
    base = getattr(lm, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if (
        base is None
        or not all(hasattr(base, a) for a in needed)
        or not hasattr(lm, "lm_head")
    ):
        return (
            False,
            "unexpected module layout (expected model.{embed_tokens,layers,norm,rotary_emb} and lm_head)",
        )
    return True, ""


def _linear(module):
    """``F.linear`` on a plain ``nn.Linear``'s live parameters (skips ``Module.__call__``); anything
    else (a LoRA / quantised wrapper) is called as the module it is."""
    if type(module) is torch.nn.Linear:
        weight, bias = module.weight, module.bias
        return lambda x: F.linear(x, weight, bias)
    return module


def _rms_norm(module, dtype: torch.dtype):
    """Fused ``F.rms_norm`` where it is bit-identical to transformers' RMSNorm (float32 activations,
    plain ``weight * x / rms``); the module itself otherwise (bf16 casts, Gemma's 1 + w, ...)."""
    weight, eps = (
        getattr(module, "weight", None),
        getattr(module, "variance_epsilon", None),
    )
    if (
        dtype == torch.float32
        and type(module).__name__ in _PLAIN_RMS_NORMS
        and weight is not None
        and eps is not None
    ):
        shape = (weight.shape[-1],)
        return lambda x: F.rms_norm(x, shape, weight, eps)
    return module


_PLAIN_RMS_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


class _LayerOps:
    """One decoder layer's callables, resolved once per request (live parameters, no copies)."""

    def __init__(self, layer, dtype: torch.dtype):
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1 = _rms_norm(layer.input_layernorm, dtype)
        self.norm2 = _rms_norm(layer.post_attention_layernorm, dtype)
        self.q, self.k, self.v, self.o = (
            _linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        )
        self.q_norm = _rms_norm(attn.q_norm, dtype) if hasattr(attn, "q_norm") else None
        self.k_norm = _rms_norm(attn.k_norm, dtype) if hasattr(attn, "k_norm") else None
        act = getattr(mlp, "act_fn", None)
        plain = all(
            type(getattr(mlp, n, None)) is torch.nn.Linear
            for n in ("gate_proj", "up_proj", "down_proj")
        )
        if plain and type(act).__name__ in ("SiLUActivation", "SiLU"):
            gate, up, down = (
                _linear(getattr(mlp, n)) for n in ("gate_proj", "up_proj", "down_proj")
            )
            self.mlp = lambda x: down(F.silu(gate(x)) * up(x))
        else:
            self.mlp = mlp


class LlamaFamilyDecoder:
    """Prefill + one-token decode for Llama / Qwen2 / Qwen3 with a preallocated KV cache.

    Shapes: B prompts, n completions each, N = B·n rows, M rows still in the work (M ≤ N),
    P padded prompt length, S = P + max_new cache length, H query heads, Hkv key/value heads,
    Gq = H / Hkv query heads per KV head, D head dim.
    """

    def __init__(self, model):
        lm = _unwrap(model)
        base = lm.model
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

    def prefill(
        self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, n: int, max_new: int
    ) -> torch.Tensor:
        """Run the B prompts once, broadcast their KV into the n rows of each group; returns logits_BV
        of each prompt's last position."""
        B, P = ids_BP.shape
        N, S = B * n, P + max_new
        device = ids_BP.device
        valid_BP = mask_BP.bool()
        pos_BP = (mask_BP.cumsum(-1) - 1).clamp(min=0)
        x = self.embed(ids_BP)  # [B, P, E]
        self.layer_ops = [_LayerOps(layer, x.dtype) for layer in self.layers]
        # RoPE table for every position this request can reach, from the model's own rotary module
        # (so scaled / NTK variants are honoured); the sine's first half is negated so that
        # rotate_half(q)·sin == roll(q, D/2)·sin_signed.
        cos_1SD, sin_1SD = self.rotary(x, torch.arange(S, device=device)[None])
        self.cos_SD = cos_1SD[0]
        self.sin_signed_SD = torch.cat(
            (-sin_1SD[0, :, : self.D // 2], sin_1SD[0, :, self.D // 2 :]), dim=-1
        )
        self.rope_SR = torch.cat((self.cos_SD, self.sin_signed_SD), dim=-1)  # R = 2D
        self.final_norm, self.head = (
            _rms_norm(self.norm, x.dtype),
            _linear(self.lm_head),
        )
        cos_BP1D = self.cos_SD[pos_BP][:, :, None]
        sin_BP1D = self.sin_signed_SD[pos_BP][:, :, None]
        half = self.D // 2
        # Causal and padding mask; each position also sees itself so left-pad rows are never all -inf
        # (their outputs are never read, and their keys are masked for every real query).
        causal_PP = torch.ones(P, P, dtype=torch.bool, device=device).tril()
        eye_PP = torch.eye(P, dtype=torch.bool, device=device)
        attn_mask = ((causal_PP[None] & valid_BP[:, None, :]) | eye_PP[None])[
            :, None
        ]  # [B, 1, P, P]
        self.k_cache = [
            torch.empty(N, self.Hkv, S, self.D, dtype=x.dtype, device=device)
            for _ in self.layers
        ]
        self.v_cache = [
            torch.empty(N, self.Hkv, S, self.D, dtype=x.dtype, device=device)
            for _ in self.layers
        ]
        for ops, kc, vc in zip(self.layer_ops, self.k_cache, self.v_cache):
            h = ops.norm1(x)
            q = ops.q(h).view(B, P, self.H, self.D)
            k = ops.k(h).view(B, P, self.Hkv, self.D)
            if ops.q_norm is not None:
                q, k = ops.q_norm(q), ops.k_norm(k)
            q = (q * cos_BP1D + q.roll(half, -1) * sin_BP1D).transpose(
                1, 2
            )  # [B, H, P, D]
            k = (k * cos_BP1D + k.roll(half, -1) * sin_BP1D).transpose(
                1, 2
            )  # [B, Hkv, P, D]
            v = ops.v(h).view(B, P, self.Hkv, self.D).transpose(1, 2)
            # Prompt KV shared by the group: one broadcast copy into the n rows, no recompute.
            kc.view(B, n, self.Hkv, S, self.D)[:, :, :, :P].copy_(k[:, None])
            vc.view(B, n, self.Hkv, S, self.D)[:, :, :, :P].copy_(v[:, None])
            if self.Gq > 1:
                k, v = (
                    k.repeat_interleave(self.Gq, dim=1),
                    v.repeat_interleave(self.Gq, dim=1),
                )
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, scale=self.scale
            )
            x = x + ops.o(o.transpose(1, 2).reshape(B, P, self.H * self.D))
            x = x + ops.mlp(ops.norm2(x))
        self.key_valid_NS = torch.ones(N, S, dtype=torch.bool, device=device)
        self.key_valid_NS[:, :P] = valid_BP.repeat_interleave(n, dim=0)
        self.pos_N = mask_BP.sum(-1).repeat_interleave(
            n, dim=0
        )  # next position = prompt length
        self.cur = P
        return self.lm_head(self.norm(x[:, -1]))

    def decode(self, token_M: torch.Tensor) -> torch.Tensor:
        """Append one token per row; returns logits_MV.

        Written for few kernels per layer, because at the default task's size (a sub-million-
        parameter model, 64 rows) dispatch, not FLOPs, is the cost: 2-D activations (no
        transposes), RoPE from a per-request table as ``q·cos + roll(q)·sin±`` (``roll`` by D/2 with a
        sign-folded sine is exactly transformers' ``rotate_half``), fused RMSNorm, and plain
        ``F.linear`` where a projection is a plain ``nn.Linear`` (LoRA-wrapped ones are called as
        modules).
        """
        M, s = token_M.shape[0], self.cur
        x = self.embed(token_M)  # [M, E]
        rope_M1R = self.rope_SR.index_select(0, self.pos_N)[
            :, None
        ]  # one gather for cos and sin
        cos_M1D, sin_M1D = rope_M1R[..., : self.D], rope_M1R[..., self.D :]
        half, H = self.D // 2, self.H
        # Grouped-query attention without expanding K/V: the Gq query heads that share a KV head play
        # the role of SDPA's query-length axis, so one call serves every head on the unexpanded cache.
        attn_mask = self.key_valid_NS[:, None, None, : s + 1]  # [M, 1, 1, s+1]
        for ops, kc, vc in zip(self.layer_ops, self.k_cache, self.v_cache):
            h = ops.norm1(x)
            q = ops.q(h).view(M, self.H, self.D)
            k = ops.k(h).view(M, self.Hkv, self.D)
            if ops.q_norm is not None:
                q, k = ops.q_norm(q), ops.k_norm(k)
            qk = torch.cat((q, k), dim=1)  # [M, H + Hkv, D]: RoPE on both in one pass
            qk = qk * cos_M1D + qk.roll(half, -1) * sin_M1D
            q = qk[:, :H]
            kc[:, :, s] = qk[:, H:]
            vc[:, :, s] = ops.v(h).view(M, self.Hkv, self.D)
            o = F.scaled_dot_product_attention(
                q.view(M, self.Hkv, self.Gq, self.D),
                kc[:, :, : s + 1],
                vc[:, :, : s + 1],
                attn_mask=attn_mask,
                scale=self.scale,
            )  # [M, Hkv, Gq, D]
            x = x + ops.o(o.reshape(M, self.H * self.D))
            x = x + ops.mlp(ops.norm2(x))
        self.cur += 1
        self.pos_N = self.pos_N + 1
        return self.head(self.final_norm(x))

    def select(self, rows_M: torch.Tensor) -> None:
        """Keep only ``rows_M`` (one gather per cache tensor)."""
        self.k_cache = [k.index_select(0, rows_M) for k in self.k_cache]
        self.v_cache = [v.index_select(0, rows_M) for v in self.v_cache]
        self.key_valid_NS = self.key_valid_NS.index_select(0, rows_M)
        self.pos_N = self.pos_N.index_select(0, rows_M)

    def release(self) -> None:
        self.k_cache = self.v_cache = self.layer_ops = []


class HFCacheDecoder:
    """Any causal LM through its own forward and Cache API. Slower than the fast path (the cache grows
    by concatenation and every layer goes through the generic attention dispatch) but exact for
    every architecture transformers implements."""

    def __init__(self, model):
        self.model = model
        params = inspect.signature(_unwrap(model).forward).parameters
        self.cache_kw = (
            "cache" if "cache" in params else "past_key_values"
        )  # transformers 5 renamed it
        self.keep_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def _cache_of(self, out):
        cache = getattr(out, "cache", None)
        return cache if cache is not None else out.past_key_values

    def prefill(
        self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, n: int, max_new: int
    ) -> torch.Tensor:
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
        self.cache.batch_repeat_interleave(
            n
        )  # prompt KV shared by the group: copied, not recomputed
        self.mask_NS = torch.ones(
            B * n, P + max_new, dtype=mask_BP.dtype, device=mask_BP.device
        )
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


@contextlib.contextmanager
def _cpu_threads(threads: int | None, model) -> Iterator[None]:
    previous = torch.get_num_threads()
    switch = (
        threads is not None
        and threads != previous
        and next(model.parameters()).device.type == "cpu"
    )
    if switch:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if switch:
            torch.set_num_threads(previous)


class NativeEngine:
    """Fast batched sampling from the live policy. ``samples_live_policy = True``.

    Options:
      fast_path: None (auto: the Llama-family decoder when ``fast_path_supported``), True (require it;
        error if unsupported), False (always the generic HF-cache decoder).
      compact_fraction: compact the batch when this fraction of its rows has finished (default 0.25).
      sync_every: host syncs (finish checks) every k decode steps; default 1 on CPU, 8 on CUDA.
      cpu_threads: intra-op threads while sampling on CPU. "auto" (default): 1 for models with
        hidden_size < 512, else torch's current setting. A decode step of a small model is hundreds of
        ops of a few microseconds each; OpenMP's fork/join per op costs as much as the op, and on a
        shared machine a descheduled sibling thread stalls every op (measured on the 2-core dev box
        under load: a 64x96x96 matmul took 0.7 ms on 1 thread, 12 ms on 2). The previous setting is
        restored after each call, so the trainer's forward/backward keep their threads.
      eos_token_ids: override the model's EOS ids.
    """

    samples_live_policy = True
    receives_weights = True  # trivially: it *is* the policy

    def __init__(
        self,
        model,
        tokenizer,
        eos_token_ids: int | Sequence[int] | None = None,
        fast_path: bool | None = None,
        compact_fraction: float = 0.25,
        sync_every: int | None = None,
        cpu_threads: int | str = "auto",
    ):
        self.model = model
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
            raise ValueError(
                f"compact_fraction must be in (0, 1], got {compact_fraction}."
            )
        self.compact_fraction = compact_fraction
        self.sync_every = sync_every
        if cpu_threads == "auto":
            hidden = getattr(_unwrap(model).config, "hidden_size", None)
            cpu_threads = 1 if hidden is not None and hidden < 512 else None
        elif not (isinstance(cpu_threads, int) and cpu_threads >= 1):
            raise ValueError(
                f"cpu_threads must be 'auto' or an int >= 1, got {cpu_threads!r}."
            )
        self.cpu_threads = cpu_threads

    def _decoder(self):
        return (
            LlamaFamilyDecoder(self.model)
            if self.fast_path
            else HFCacheDecoder(self.model)
        )

    def generate(
        self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams
    ) -> list[Completion]:
        validate_request(prompt_ids, n, sampling)
        # Greedy rows of one group are identical: decode one per prompt and repeat it.
        n_decode = 1 if sampling.temperature == 0.0 else n
        with policy_eval(self.model), _cpu_threads(self.cpu_threads, self.model):
            tokens_NC, logp_NC = self._sample(prompt_ids, n_decode, sampling)
        if n_decode != n:
            tokens_NC, logp_NC = (
                tokens_NC.repeat_interleave(n, dim=0),
                logp_NC.repeat_interleave(n, dim=0),
            )
        tokens, logps = tokens_NC.tolist(), logp_NC.tolist()
        eos = set(self.eos_ids)
        lengths = [
            toks.index(-1) if -1 in toks else len(toks) for toks in tokens
        ]  # -1: row had finished
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

    def _sample(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams):
        """Decode loop. Returns ``tokens_NC`` (-1 after a row finished) and ``logp_NC``."""
        device = next(self.model.parameters()).device
        ids_BP, mask_BP = left_pad(prompt_ids, self.pad_id, device)
        B, C = len(prompt_ids), sampling.max_tokens
        N = B * n
        sync_every = self.sync_every or (8 if device.type == "cuda" else 1)
        eos_E = torch.tensor(self.eos_ids, device=device)
        vocab_size = _unwrap(self.model).config.vocab_size
        sampler = TokenSampler(
            sampling, vocab_size, make_generator(sampling.seed, device)
        )

        tokens_NC = torch.full((N, C), -1, dtype=torch.long, device=device)
        logp_NC = torch.zeros((N, C), dtype=torch.float32, device=device)
        # Repetition penalty needs the set of tokens each row has seen (prompt included, as in HF).
        seen_MV = None
        if sampler.use_penalty:
            seen_BV = torch.zeros(B, vocab_size, dtype=torch.bool, device=device)
            for b, p in enumerate(
                prompt_ids
            ):  # real tokens only: the pad id may also be a real token
                seen_BV[b, torch.tensor(p, device=device)] = True
            seen_MV = seen_BV.repeat_interleave(n, dim=0)

        decoder = self._decoder()
        logits_BV = decoder.prefill(ids_BP, mask_BP, n, C)
        # The first token of every row comes from its prompt's last position; no decode step needed.
        logits_MV = logits_BV.repeat_interleave(n, dim=0)
        rows_M = torch.arange(
            N, device=device
        )  # which original row each live batch row is
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
                is_eos_M = (
                    token_M == self.eos_ids[0]
                    if len(self.eos_ids) == 1
                    else torch.isin(token_M, eos_E)
                )
                alive_M = alive_M & ~is_eos_M
                if seen_MV is not None:
                    seen_MV[torch.arange(token_M.shape[0], device=device), token_M] = (
                        True
                    )
                if t == C - 1:
                    break
                if (t + 1) % sync_every == 0:
                    alive_cpu = alive_M.tolist()  # host sync
                    if sampling.stop:
                        alive_cpu = self._apply_stops(
                            tokens_NC, rows_M, alive_cpu, t, sampling.stop
                        )
                        alive_M = torch.tensor(alive_cpu, device=device)
                    n_alive = sum(alive_cpu)
                    if n_alive == 0:
                        break
                    if len(alive_cpu) - n_alive >= self.compact_fraction * len(
                        alive_cpu
                    ):
                        keep_M = alive_M.nonzero().squeeze(1)
                        decoder.select(keep_M)
                        rows_M, token_M, alive_M = (
                            rows_M[keep_M],
                            token_M[keep_M],
                            alive_M[keep_M],
                        )
                        compacted = True
                        seen_MV = None if seen_MV is None else seen_MV[keep_M]
                logits_MV = decoder.decode(token_M)
        finally:
            decoder.release()
        return tokens_NC, logp_NC

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
