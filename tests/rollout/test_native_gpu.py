"""The native engine on CUDA. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from rollout_models import tiny_model

from rlvr.rollout import SamplingParams, make_engine

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.bfloat16, 5e-2)])
def test_native_on_cuda_matches_trainer(dtype, tol):
    model, tok = tiny_model("qwen2", seed=3)
    model = model.to("cuda", dtype)
    prompts = [tok.encode("37+45="), tok.encode("8*9="), tok.encode("123-77=")]
    engine = make_engine("native", model, tok)
    if dtype == torch.float32:
        ref = make_engine("hf", model, tok).generate(prompts, 1, SamplingParams(temperature=0.0, max_tokens=10))
        out = engine.generate(prompts, 1, SamplingParams(temperature=0.0, max_tokens=10))
        assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    out = engine.generate(prompts, 8, SamplingParams(temperature=0.9, max_tokens=10, seed=0))
    again = engine.generate(prompts, 8, SamplingParams(temperature=0.9, max_tokens=10, seed=0))
    assert [c.token_ids for c in out] == [c.token_ids for c in again]
    for c in out:
        ids = torch.tensor([prompts[c.prompt_index] + c.token_ids], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompts[c.prompt_index]) - 1 : -1].float() / 0.9
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids, device="cuda")[:, None]).squeeze(1)
        assert c.logprobs == pytest.approx(expected.tolist(), abs=tol)
