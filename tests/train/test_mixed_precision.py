"""train.mixed_precision=bf16: the policy's forwards under bfloat16 autocast over float32 weights (TRL's bf16=true).

The chunked head must compute what the model's own head computes under autocast (its matmuls in bf16, the
log-softmax in float32), gradients must reach the float32 weights in float32, and the result must sit within
bf16 rounding of the float32 path (and clearly not equal to it: the autocast really ran)."""

from __future__ import annotations

import json

import torch
from test_smoke import read_jsonl, smoke_overrides

from rlvr import core
from rlvr.builders import load_model
from rlvr.config import attention_implementation, load_config
from rlvr.policy_logprobs import completion_logprobs
from rlvr.rollout import cpu_kernel
from rlvr.train import train

V = 97


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def _batch(N=4, P=5, T=7):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, V, (N, P + T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return ids, mask, pos, ids[:, P:]


def _logp_and_grads(model, chunked: bool, autocast: bool):
    ids, mask, pos, comp = _batch()
    model.zero_grad()
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        logp, ent = completion_logprobs(model, ids, mask, pos, comp, 0.9, with_entropy=True, chunked=chunked)
    logp.sum().backward()
    return logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_chunked_head_under_autocast_matches_the_models_own_head_under_autocast():
    model = _llama()
    chunked, ent_c, grads_c = _logp_and_grads(model, chunked=True, autocast=True)
    plain, ent_p, grads_p = _logp_and_grads(model, chunked=False, autocast=True)
    exact, _, grads_exact = _logp_and_grads(model, chunked=False, autocast=False)
    assert chunked.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads_c.values())
    # The same bf16 matmuls (the head's logits rounded to bf16 in both), reduced in float32 in another order.
    assert torch.allclose(chunked, plain, rtol=0, atol=1e-5)
    assert torch.allclose(ent_c, ent_p, rtol=0, atol=1e-5)
    for name in grads_c:
        scale = float(grads_p[name].abs().max()) + 1e-12
        assert torch.allclose(grads_c[name], grads_p[name], rtol=0, atol=2e-2 * scale), name
    # bf16 rounding (8 bits of mantissa) moves log-probs of a random model by ~1e-2, not more ...
    gap = (chunked - exact).abs().max()
    assert gap < 0.1
    # ... and it does move them: the autocast really ran in bf16.
    assert gap > 1e-4
    head_gap = (grads_c["lm_head.weight"] - grads_exact["lm_head.weight"]).abs().max()
    assert 0 < head_gap < 0.05 * float(grads_exact["lm_head.weight"].abs().max())


def test_head_logprobs_in_bf16_equals_the_float32_softmax_of_bf16_logits():
    """Hand-derived: log softmax of the bf16-rounded logits, in float32."""
    g = torch.Generator().manual_seed(3)
    h = torch.randn(6, 16, generator=g).bfloat16()
    w = torch.randn(V, 16, generator=g).bfloat16()
    ids = torch.randint(0, V, (6,), generator=g)
    logp, _ = core.head_logprobs(h[None], w, ids[None], temperature=0.7)
    logits = (h @ w.t()).float() / 0.7  # the bf16 matmul's result, as the model's head returns it
    want = logits.log_softmax(-1).gather(-1, ids[:, None]).squeeze(-1)
    assert logp.dtype == torch.float32
    assert torch.allclose(logp[0], want, rtol=0, atol=1e-5)


def test_a_bf16_mixed_precision_run_trains_float32_weights(tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "run"
    cfg = load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, out, "train.mixed_precision=bf16",
                                            "train.max_steps=2", "rollout.backend=native"))
    train(cfg)
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(torch.isfinite(torch.tensor([r["loss"], r["grad_norm"]])).all() for r in rows)
    assert rows[-1]["grad_norm"] > 0
    # The sampler: the C kernel on bfloat16 copies of the weights where the CPU has AVX512-BF16, the float32
    # kernel elsewhere; either way the trainer's bf16 log-probs differ from it by bf16 rounding.
    assert 1e-5 < rows[-1]["mismatch/abs_logp_diff_mean"] < 0.1
    decoder = json.loads((out / "header.json").read_text())["rollout_decoder"]
    assert ("bfloat16 weights" in decoder) == cpu_kernel.bf16_fast(), decoder
    assert "C decode kernel" in decoder, decoder
    from safetensors.torch import load_file

    assert all(t.dtype == torch.float32 for t in load_file(str(out / "final" / "model.safetensors")).values())


def test_attention_is_eager_on_cpu_only_where_sdpa_measured_slow(tiny_model_dir, sum_dataset, tmp_path):
    """model.attn_implementation unset: eager on a CPU under bf16 autocast or below hidden 512, else transformers'
    default; a setting always wins; the shipped-size model loads with it."""
    def config(*overrides):
        return load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "run", *overrides))

    plain, bf16 = config(), config("train.mixed_precision=bf16")
    asked = config("train.mixed_precision=bf16", "model.attn_implementation=sdpa")
    assert attention_implementation(plain, "cpu", 96) == "eager"
    assert attention_implementation(plain, "cpu", 512) is None
    assert attention_implementation(bf16, "cpu", 2048) == "eager"
    assert attention_implementation(bf16, "cuda", 96) is None
    assert attention_implementation(asked, "cpu", 96) == "sdpa"
    model = load_model(plain, torch.device("cpu"))
    assert model.config.hidden_size < 512 and model.config._attn_implementation == "eager"
    assert load_model(asked, torch.device("cpu")).config._attn_implementation == "sdpa"
