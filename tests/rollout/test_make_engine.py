import importlib.util

import pytest

from rlvr.rollout import ENGINE_NAMES, RolloutEngine, SamplingParams, engine_class, make_engine


def test_engine_names_cover_the_backends():
    assert set(ENGINE_NAMES) == {"hf", "native", "openai", "vllm", "vllm-server"}


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_every_engine_declares_every_capability(name):
    """The loop and the config read these attributes and nothing else: each engine states them itself."""
    cls = engine_class(name)
    for capability in ("samples_live_policy", "receives_weights", "reports_logprobs"):
        assert isinstance(vars(cls).get(capability), bool), f"{cls.__name__} does not declare {capability}"
    assert "policy_lag" in vars(cls), f"{cls.__name__} does not declare policy_lag"
    if cls.samples_live_policy:  # a live engine is current by construction
        assert cls.receives_weights and vars(cls)["policy_lag"] == 0


def test_unknown_engine_lists_valid_names(llama_and_tok):
    model, tok = llama_and_tok
    with pytest.raises(ValueError) as err:
        make_engine("vlm", model, tok)
    assert all(name in str(err.value) for name in ENGINE_NAMES)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_names_the_extra(llama_and_tok):
    model, tok = llama_and_tok
    with pytest.raises(ImportError, match=r"pip install 'rlvr\[vllm\]'"):
        make_engine("vllm", model, tok)
    # Server mode talks HTTP: without vLLM here it only needs the server (NCCL pushes need vLLM and CUDA).
    with pytest.raises(ConnectionError, match="cannot reach"):
        make_engine("vllm-server", model, tok, base_url="http://127.0.0.1:9", push="none")


def test_unknown_vllm_mode(llama_and_tok):
    model, tok = llama_and_tok
    with pytest.raises(ValueError, match="colocate, server"):
        make_engine("vllm", model, tok, mode="remote")


@pytest.mark.parametrize("name", ["hf", "native"])
def test_live_policy_engines(name, llama_and_tok, prompts):
    """Samples from the very model object being trained: mode restored, no weight copy, no autograd."""
    model, tok = llama_and_tok
    engine = make_engine(name, model, tok)
    assert isinstance(engine, RolloutEngine) and engine.samples_live_policy is True
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    model.train()
    try:
        before = [c.token_ids for c in engine.generate(prompts, 1, greedy)]
        assert model.training, "engine must restore training mode"
        engine.load_weights(model.named_parameters())  # a no-op for live engines
        with __import__("torch").no_grad():
            model.lm_head.weight.neg_()  # an in-place "optimizer step": a copy would not see it
        after = [c.token_ids for c in engine.generate(prompts, 1, greedy)]
        assert after != before
    finally:
        with __import__("torch").no_grad():
            model.lm_head.weight.neg_()
        model.eval()
    assert all(p.grad is None for p in model.parameters())


def test_bad_request_is_a_clear_error(llama_and_tok, prompts):
    model, tok = llama_and_tok
    engine = make_engine("hf", model, tok)
    with pytest.raises(ValueError, match="num_generations"):
        engine.generate(prompts, 0, SamplingParams())
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[]], 1, SamplingParams())


def test_native_cpu_threads_are_restored(llama_and_tok, prompts):
    import torch

    model, tok = llama_and_tok
    before = torch.get_num_threads()
    engine = make_engine("native", model, tok)  # hidden 64 < 512: PyTorch decoder on 1 thread
    assert engine.cpu_threads == 1
    torch.set_num_threads(2)
    try:
        engine.generate(prompts, 2, SamplingParams(max_tokens=3, seed=0))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="cpu_threads"):
        make_engine("native", model, tok, cpu_threads=0)
