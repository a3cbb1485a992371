"""The native engine's bfloat16 compute (``compute_dtype="bfloat16"``, set by train.mixed_precision=bf16): the
fast decoder over float32 weights computes what the same model stored in bfloat16 computes, within bf16
rounding, and samples from float32 logits."""

from __future__ import annotations

import copy

import pytest
import torch
from rollout_models import tiny_model

from rlvr.rollout import SamplingParams
from rlvr.rollout.native import LlamaFamilyDecoder, NativeEngine


def _prompts(tok):
    prompts = [tok.encode("37+45="), tok.encode("8*9="), tok.encode("(2+3)*4=")]
    ids_BP = torch.full((3, 8), tok.pad_token_id)
    mask_BP = torch.zeros(3, 8, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids_BP[b, 8 - len(p):], mask_BP[b, 8 - len(p):] = torch.tensor(p), 1
    return prompts, ids_BP, mask_BP


def _hf_last_logits(model, rows):
    out = []
    for r in rows:
        out.append(model(input_ids=torch.tensor([r])).logits[0, -1].float())
    return torch.stack(out)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bf16_decoder_matches_the_bf16_model_within_bf16_rounding(arch):
    model, tok = tiny_model(arch, seed=1)
    model.eval()
    bf16_model = copy.deepcopy(model).to(torch.bfloat16)
    prompts, ids_BP, mask_BP = _prompts(tok)
    n, steps = 2, 4
    dec = LlamaFamilyDecoder(model, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        logits = dec.prefill(ids_BP, mask_BP, n, steps + 1)
        rows = [list(p) for p in prompts for _ in range(n)]
        for _ in range(steps):
            token_N = torch.randint(3, len(tok), (len(rows),), generator=g)
            for r, t in zip(rows, token_N.tolist()):
                r.append(t)
            logits = dec.decode(token_N)
        want_bf16 = _hf_last_logits(bf16_model, rows)
        want_fp32 = _hf_last_logits(model, rows)
    assert logits.dtype == torch.float32
    scale = float(want_fp32.abs().max())
    to_bf16 = (logits - want_bf16).abs().max() / scale
    to_fp32 = (logits - want_fp32).abs().max() / scale
    # A few bf16 roundings (2^-8 relative each) through the layers: well under 5% of the logits' scale ...
    assert to_bf16 < 0.05, to_bf16
    # ... and the decoder did run in bf16 (float32 would agree with the float32 model to ~1e-6).
    assert to_fp32 > 1e-4, to_fp32


def test_engine_option_samples_in_bf16_and_keeps_the_weights():
    model, tok = tiny_model("llama", seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = NativeEngine(model, tok, compute_dtype="bfloat16")
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=0)
    assert "bfloat16" in engine.describe(sampling)
    out = engine.generate([tok.encode("1+2="), tok.encode("3+4=")], 3, sampling)
    assert len(out) == 6 and all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for c in out)
    assert all(lp <= 0 for c in out for lp in c.logprobs)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with pytest.raises(ValueError, match="compute_dtype"):
        NativeEngine(model, tok, compute_dtype="float8")


def test_lora_adapters_run_under_bf16_compute():
    import peft

    model, tok = tiny_model("llama", seed=2)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    lora.eval()
    engine = NativeEngine(lora, tok, compute_dtype="bfloat16")
    sampling = SamplingParams(temperature=0.0, max_tokens=5, seed=0)
    bf16 = engine.generate([tok.encode("12+30=")], 1, sampling)[0]
    fp32 = NativeEngine(lora, tok).generate([tok.encode("12+30=")], 1, sampling)[0]
    assert len(bf16.token_ids) == 5
    # Greedy log-probs of the same first token agree to bf16 rounding (the adapter is honoured in both).
    assert bf16.token_ids[0] == fp32.token_ids[0]
    assert abs(bf16.logprobs[0] - fp32.logprobs[0]) < 0.05
