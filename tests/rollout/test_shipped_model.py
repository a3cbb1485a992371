"""The engines on the model the default job actually trains (rlvr/models/tiny-arith), with its real
tokenizer and EOS: greedy agreement with generate and log-probs equal to the trainer's."""

from __future__ import annotations

import pytest
import torch
from test_contract import trainer_logp

from rlvr.rollout import SamplingParams, make_engine


@pytest.fixture(scope="module")
def shipped():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.models import tiny_model_path

    path = tiny_model_path()  # the shipped model is part of the package: missing is a failure, not a skip
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("cpu_kernel", [None, False], ids=["kernel", "torch"])
def test_native_matches_generate_and_trainer_on_shipped_model(shipped, cpu_kernel):
    model, tok = shipped
    prompts = [tok.encode(p) for p in ("37+45=", "18+27=", "60+39=", "5+8=")]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    ref = make_engine("hf", model, tok).generate(prompts, 1, greedy)
    native = make_engine("native", model, tok, cpu_kernel=cpu_kernel)
    assert [c.token_ids for c in native.generate(prompts, 1, greedy)] == [c.token_ids for c in ref]
    assert any(c.finish_reason == "stop" for c in ref), "the trained model should emit its EOS"
    out = native.generate(prompts, 8, SamplingParams(temperature=1.0, max_tokens=8, seed=0))
    for c in out:
        assert c.logprobs == pytest.approx(trainer_logp(model, prompts[c.prompt_index], c.token_ids, 1.0), abs=2e-4)
    assert native.last_decoder == ("torch" if cpu_kernel is False else "kernel")
    assert torch.is_inference_mode_enabled() is False
