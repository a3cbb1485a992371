"""No two completions of a run share a noise stream, for every engine.

The trainer seeds consecutive requests ``base + generation``. An engine that gave every prompt the
request seed (vLLM seeds child ``j`` with ``seed + j``) would draw child ``j`` of every prompt from the
same stream, and request ``s + 1``'s children from request ``s``'s streams shifted by one: with the same
prompt in several slots (GRPO batches repeat prompts across steps), identical completions far above
chance. The tiny Llama at T = 1 spreads its mass over an 86-token vocabulary, so two independent
8-token completions are equal with negligible probability; the test asks that almost all of them differ.
"""

from __future__ import annotations

import fake_vllm
import pytest
import torch.distributed as dist

from rlvr.rollout import SamplingParams, make_engine

ENGINES = [
    pytest.param(("hf", {}), id="hf"),
    pytest.param(("native", {}), id="native"),  # the C kernel
    pytest.param(("native", {"cpu_kernel": False}), id="native-torch"),
    pytest.param(("openai", {}), id="openai-local-server"),
    pytest.param(("vllm", {}), id="vllm-fake"),
]


@pytest.fixture(params=ENGINES)
def engine(request, llama_and_tok, tmp_path, monkeypatch):
    name, options = request.param
    model, tok = llama_and_tok
    if name == "openai":
        options = {"base_url": request.getfixturevalue("completions_server").base_url}
    if name == "vllm":  # vLLM's seeding (child j: seed + j), stood in for; real vLLM: tests/vllm_cpu
        fake_vllm.install(monkeypatch)
        model.save_pretrained(tmp_path / "policy")
        options = {"model_path": str(tmp_path / "policy")}
    engine = make_engine(name, model, tok, **options)
    yield engine
    engine.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_no_two_completions_share_a_noise_stream(engine, prompts):
    same = [prompts[0]] * 6  # one prompt in six slots: only the noise tells their completions apart
    completions = []
    for seed in (100, 101):  # consecutive requests, as the trainer seeds them
        out = engine.generate(same, 4, SamplingParams(temperature=1.0, max_tokens=8, seed=seed))
        completions += [tuple(c.token_ids) for c in out]
    # 48 completions; shared streams would leave about 5 distinct ones (4 per request, shifted by one).
    # Independent ones collide only when a completion ends early on a likely EOS: allow a few.
    assert len(set(completions)) >= 40, sorted(completions)
