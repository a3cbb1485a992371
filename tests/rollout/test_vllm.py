"""vLLM backends. Need vLLM and a CUDA GPU; skipped elsewhere (see docs/rollout.md, "What is and is
not tested")."""

from __future__ import annotations

import pytest
import torch
from rollout_models import tiny_model

from rlvr.rollout import SamplingParams, make_engine

pytestmark = [pytest.mark.vllm, pytest.mark.gpu]
vllm = pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("vLLM engines need a CUDA device", allow_module_level=True)


@pytest.fixture(scope="module")
def saved_policy(tmp_path_factory):
    model, tok = tiny_model("llama", seed=0)
    path = tmp_path_factory.mktemp("policy")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    model.name_or_path = str(path)
    return model.cuda(), tok


def test_colocate_matches_trainer_and_takes_weights(saved_policy):
    model, tok = saved_policy
    engine = make_engine(
        "vllm",
        model,
        tok,
        dtype="float32",
        gpu_memory_utilization=0.2,
        max_model_len=128,
        enforce_eager=True,
    )
    prompts = [tok.encode("37+45="), tok.encode("8*9=")]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    ref = make_engine("hf", model, tok).generate(prompts, 1, greedy)
    assert [c.token_ids for c in engine.generate(prompts, 1, greedy)] == [
        c.token_ids for c in ref
    ]

    out = engine.generate(
        prompts, 4, SamplingParams(temperature=0.8, max_tokens=8, seed=0)
    )
    assert len(out) == 8 and [c.prompt_index for c in out] == [0] * 4 + [1] * 4
    for c in out:
        ids = torch.tensor([prompts[c.prompt_index] + c.token_ids], device="cuda")
        with torch.no_grad():
            logits = (
                model(ids).logits[0, len(prompts[c.prompt_index]) - 1 : -1].float()
                / 0.8
            )
        expected = (
            torch.log_softmax(logits, -1)
            .gather(1, torch.tensor(c.token_ids, device="cuda")[:, None])
            .squeeze(1)
        )
        assert c.logprobs == pytest.approx(expected.tolist(), abs=1e-3)

    with torch.no_grad():
        model.lm_head.weight.neg_()
    engine.load_weights(model.named_parameters())
    ref = make_engine("hf", model, tok).generate(prompts, 1, greedy)
    assert [c.token_ids for c in engine.generate(prompts, 1, greedy)] == [
        c.token_ids for c in ref
    ]
    engine.close()
