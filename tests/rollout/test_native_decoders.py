"""The native engine's decoders reproduce the Hugging Face forward's logits: a fast path is only
worth having if it computes the trainer's function, so every prefill and decode step is compared
with the unpadded Hugging Face forward of the same rows (float32 bound derived in tests/numerics.py)."""

from __future__ import annotations

import pytest
import torch
from numerics import assert_logits_match_hf
from rollout_models import tiny_model

from rlvr.rollout.native import (
    HFCacheDecoder,
    LlamaFamilyDecoder,
    NativeEngine,
    fast_path_supported,
)

ARCHS = [
    ("llama", {}),
    (
        "llama",
        {"attention_bias": True, "tie_word_embeddings": True, "num_key_value_heads": 4},
    ),
    ("qwen2", {}),  # q/k/v biases
    ("qwen3", {}),  # per-head q/k RMSNorm, explicit head_dim
]


@pytest.mark.parametrize("decoder_cls", [LlamaFamilyDecoder, HFCacheDecoder], ids=["fast", "generic"])
@pytest.mark.parametrize("arch,overrides", ARCHS, ids=["llama", "llama-bias-tied-mha", "qwen2", "qwen3"])
def test_prefill_and_decode_logits_equal_hf_forward(arch, overrides, decoder_cls):
    model, tok = tiny_model(arch, seed=1, **overrides)
    model.eval()
    assert fast_path_supported(model)[0]
    prompts = [tok.encode("37+45="), tok.encode("8*9="), tok.encode("(2+3)*4=")]
    n, steps = 2, 4
    ids_BP = torch.full((3, 8), tok.pad_token_id)
    mask_BP = torch.zeros(3, 8, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids_BP[b, 8 - len(p) :], mask_BP[b, 8 - len(p) :] = torch.tensor(p), 1
    dec = decoder_cls(model)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        logits_BV = dec.prefill(ids_BP, mask_BP, n, steps + 1)
        assert_logits_match_hf(logits_BV, model, prompts)
        rows = [list(p) for p in prompts for _ in range(n)]
        for _ in range(steps):
            # Arbitrary (different per row) continuations: rows of one group must diverge correctly.
            token_N = torch.randint(3, len(tok), (len(rows),), generator=g)
            for r, t in zip(rows, token_N.tolist()):
                r.append(t)
            logits_NV = dec.decode(token_N)
        assert_logits_match_hf(logits_NV, model, rows)
        # Dropping rows keeps the survivors' state intact.
        keep = torch.tensor([0, 3, 5])
        dec.select(keep)
        token_M = torch.tensor([5, 6, 7])
        rows = [rows[i] + [t] for i, t in zip(keep.tolist(), token_M.tolist())]
        assert_logits_match_hf(dec.decode(token_M), model, rows)


def test_lora_adapters_are_sampled_live():
    """A PEFT-wrapped policy: the fast path calls the LoRA-wrapped projections, so adapter updates
    are sampled without a merge or a copy."""
    import peft  # a dependency of rlvr (LoRA): never skipped

    model, tok = tiny_model("llama", seed=2)
    lora = peft.get_peft_model(
        model,
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
    )
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # LoRA B starts at zero; make the adapter matter
    lora.eval()
    prompt = tok.encode("12+30=")
    engine = NativeEngine(lora, tok)
    assert engine.fast_path
    from rlvr.rollout import SamplingParams

    (c,) = engine.generate([prompt], 1, SamplingParams(temperature=0.0, max_tokens=6))
    with torch.no_grad():
        ids = torch.tensor([prompt + c.token_ids])
        expected = lora(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
        with lora.disable_adapter():
            without = lora(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
    assert c.token_ids == expected[: len(c.token_ids)]
    assert expected != without  # the adapter really changes the greedy path


def test_unsupported_architecture_falls_back_or_errors():
    from rollout_models import char_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = char_tokenizer()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tok),
            n_embd=32,
            n_layer=1,
            n_head=2,
            eos_token_id=1,
            pad_token_id=0,
        )
    )
    ok, why = fast_path_supported(model)
    assert not ok and "gpt2" in why
    assert NativeEngine(model, tok).fast_path is False
    with pytest.raises(ValueError, match="fast_path=True"):
        NativeEngine(model, tok, fast_path=True)
    # The generic decoder still matches generate on this architecture.
    from rlvr.rollout import SamplingParams, make_engine

    prompts = [tok.encode("1+1="), tok.encode("22+3=")]
    sp = SamplingParams(temperature=0.0, max_tokens=5)
    ref = make_engine("hf", model, tok).generate(prompts, 1, sp)
    out = make_engine("native", model, tok).generate(prompts, 1, sp)
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]


@pytest.mark.parametrize(
    "options",
    [{}, {"cpu_kernel": False}, {"fast_path": False}],
    ids=["kernel", "fast", "generic"],
)
def test_rows_finishing_at_different_steps_are_compacted_correctly(options):
    """Many EOS ids make rows stop at scattered steps; with compact_fraction tiny, the batch is
    compacted after almost every step. Every surviving row must still see exactly its own cache:
    its log-probs equal the trainer's full-forward recompute, and nothing follows its first EOS."""
    from test_contract import trainer_logp

    from rlvr.rollout import SamplingParams

    model, tok = tiny_model("llama", seed=4)
    model.eval()
    eos = list(range(3, 33))  # ~35% of the vocabulary ends a completion
    engine = NativeEngine(model, tok, eos_token_ids=eos, compact_fraction=0.01, **options)
    prompts = [tok.encode("37+45="), tok.encode("8*9="), tok.encode("(2+3)*4=")]
    out = engine.generate(prompts, 6, SamplingParams(temperature=1.0, max_tokens=10, seed=0))
    assert engine.last_decoder == ("kernel" if not options else "torch")
    lengths = {len(c.token_ids) for c in out}
    assert len(lengths) >= 3, f"rows should finish at different steps, got lengths {lengths}"
    for c in out:
        assert not set(c.token_ids[:-1]) & set(eos)
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in eos)
        expected = trainer_logp(model, prompts[c.prompt_index], c.token_ids, 1.0)
        assert c.logprobs == pytest.approx(expected, abs=2e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decode_across_key_bucket_boundaries_equals_hf_forward(arch):
    """Decode attention runs over the key prefix rounded up to a multiple of ``KEY_BUCKET``; the
    padded slots are zero and masked. 40 steps after a 6-token (left-padded to 8) prompt take the
    key length through 32 (the first bucket) into the second, with rows compacted half-way: the
    logits must still be the Hugging Face forward's for every row at every checked step."""
    from rlvr.rollout.native import KEY_BUCKET

    model, tok = tiny_model(arch, seed=5)
    model.eval()
    prompts = [tok.encode("37+45="), tok.encode("8*9=")]
    P, n, steps = 8, 2, 40
    assert P + steps > KEY_BUCKET  # the test really crosses a bucket boundary
    ids_BP = torch.full((2, P), tok.pad_token_id)
    mask_BP = torch.zeros(2, P, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids_BP[b, P - len(p) :], mask_BP[b, P - len(p) :] = torch.tensor(p), 1
    dec = LlamaFamilyDecoder(model)
    g = torch.Generator().manual_seed(1)
    rows = [list(p) for p in prompts for _ in range(n)]
    with torch.inference_mode():
        dec.prefill(ids_BP, mask_BP, n, steps)
        for step in range(steps):
            if step == 20:
                keep = torch.tensor([1, 2])  # one row of each prompt survives
                dec.select(keep)
                rows = [rows[i] for i in keep.tolist()]
            token_M = torch.randint(3, len(tok), (len(rows),), generator=g)
            for r, t in zip(rows, token_M.tolist()):
                r.append(t)
            logits_MV = dec.decode(token_M)
            if step in (KEY_BUCKET - P - 2, KEY_BUCKET - P, steps - 1):
                assert_logits_match_hf(logits_MV, model, rows)


def test_unfused_projections_equal_hf_forward(monkeypatch):
    """Off CPU the fast decoder calls q/k/v and gate/up one by one instead of through a
    concatenated weight copy; that path (forced here on CPU) must give the same logits."""
    import rlvr.rollout.native as native

    monkeypatch.setattr(native, "_fused_linear", lambda modules, dtype=None: None)
    model, tok = tiny_model("qwen2", seed=6)  # q/k/v biases, GQA
    model.eval()
    prompts = [tok.encode("12+30="), tok.encode("7*6=")]
    P = 6
    ids_BP = torch.full((2, P), tok.pad_token_id)
    mask_BP = torch.zeros(2, P, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids_BP[b, P - len(p) :], mask_BP[b, P - len(p) :] = torch.tensor(p), 1
    dec = LlamaFamilyDecoder(model)
    with torch.inference_mode():
        logits_BV = dec.prefill(ids_BP, mask_BP, 1, 3)
        assert_logits_match_hf(logits_BV, model, prompts)
        token_M = torch.tensor([5, 9])
        rows = [p + [t] for p, t in zip(prompts, token_M.tolist())]
        assert_logits_match_hf(dec.decode(token_M), model, rows)
