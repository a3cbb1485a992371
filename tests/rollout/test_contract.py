"""One contract, every backend: shapes and grouping, finish reasons, EOS and stop strings,
seeds, greedy agreement with ``transformers.generate``, and log-probs equal to what the trainer
recomputes. Backends that need something this machine may lack are skipped, never faked."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.rollout import SamplingParams, make_engine

BACKENDS = [
    pytest.param(("hf", {}), id="hf"),
    # "native" is the C decode kernel here (a float32 Llama on CPU); "native-torch" its PyTorch one.
    pytest.param(("native", {}), id="native"),
    pytest.param(("native", {"cpu_kernel": False}), id="native-torch"),
    pytest.param(("native", {"fast_path": False}), id="native-generic"),
    pytest.param(("openai", {}), id="openai-local-server"),
    # vLLM in float32 from a saved copy of the same weights; needs vLLM and CUDA, skipped elsewhere.
    pytest.param(
        (
            "vllm",
            {
                "dtype": "float32",
                "gpu_memory_utilization": 0.2,
                "max_model_len": 128,
                "enforce_eager": True,
            },
        ),
        id="vllm-colocate",
        marks=[pytest.mark.vllm, pytest.mark.gpu],
    ),
]

#: |sampler − trainer| log-prob tolerance: float32 end to end on CPU; a GPU sampler's kernels differ.
LOGP_TOL = {"vllm": 2e-3}


@pytest.fixture(params=BACKENDS)
def backend(request, llama_and_tok):
    """``(make(**extra_options) -> engine)`` for one backend over the shared tiny Llama."""
    name, options = request.param
    model, tok = llama_and_tok
    if name == "openai":
        server = request.getfixturevalue("completions_server")
        options = {"base_url": server.base_url, **options}
    if name == "vllm":
        pytest.importorskip("vllm")
        if not torch.cuda.is_available():
            pytest.skip("vLLM needs a CUDA device")
        path = request.getfixturevalue("tmp_path") / "policy"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        options = {"model_path": str(path), **options}
    engines = []

    def make(**extra):
        engine = make_engine(name, model, tok, **{**options, **extra})
        engines.append(engine)
        return engine

    make.name = name
    yield make
    for engine in engines:
        engine.close()


def trainer_logp(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """What the trainer computes: log_softmax(logits / T) of one full forward, at the completion tokens."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    T = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / T, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()


def sampled_logp(model, prompt: list[int], completion: list[int], sampling: SamplingParams, order: str) -> list[float]:
    """The contract's log-probs: those of the distribution each token was drawn from, rebuilt from one full
    forward with transformers' own logits processors (an implementation independent of every engine's).
    ``order``: "transformers" (penalty, temperature, top-k, top-p, min-p: hf, native) or "vllm" (penalty,
    temperature, min-p, then top-k and top-p). Greedy: log_softmax(logits), as the trainer at T = 1."""
    from transformers import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    if sampling.temperature == 0.0:
        return trainer_logp(model, prompt, completion, 0.0)
    procs = {
        "penalty": RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty)
        if sampling.repetition_penalty != 1.0
        else None,
        "temperature": TemperatureLogitsWarper(sampling.temperature),
        "top_k": TopKLogitsWarper(sampling.top_k) if sampling.top_k > 0 else None,
        "top_p": TopPLogitsWarper(sampling.top_p) if sampling.top_p < 1.0 else None,
        "min_p": MinPLogitsWarper(sampling.min_p) if sampling.min_p > 0.0 else None,
    }
    names = {
        "transformers": ("penalty", "temperature", "top_k", "top_p", "min_p"),
        "vllm": ("penalty", "temperature", "min_p", "top_k", "top_p"),
    }[order]
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    out = []
    for t, token in enumerate(completion):
        pos = len(prompt) - 1 + t
        scores = logits[pos : pos + 1]
        for name in names:
            if procs[name] is not None:
                scores = procs[name](ids[:, : pos + 1], scores)
        out.append(torch.log_softmax(scores, dim=-1)[0, token].item())
    return out


def greedy_reference(model, tok, prompts, max_tokens, **sampling):
    return make_engine("hf", model, tok).generate(
        prompts, 1, SamplingParams(temperature=0.0, max_tokens=max_tokens, **sampling)
    )


def test_shapes_grouping_finish_reasons(backend, prompts, llama_and_tok):
    _, tok = llama_and_tok
    n, max_tokens = 3, 6
    out = backend().generate(prompts, n, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=1))
    assert len(out) == len(prompts) * n
    assert [c.prompt_index for c in out] == [i for i in range(len(prompts)) for _ in range(n)]
    for c in out:
        assert 1 <= len(c.token_ids) <= max_tokens
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in c.logprobs)
        assert tok.eos_token_id not in c.token_ids[:-1]  # nothing is kept after the first EOS
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == tok.eos_token_id
        else:
            assert c.finish_reason == "length" and len(c.token_ids) == max_tokens
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=1.0, max_tokens=8, seed=3),
        SamplingParams(temperature=0.7, max_tokens=8, seed=4),
        # With filters the reported log-probs are those of the filtered distribution actually sampled.
        SamplingParams(
            temperature=0.7,
            top_k=5,
            top_p=0.9,
            min_p=0.05,
            repetition_penalty=1.2,
            max_tokens=8,
            seed=5,
        ),
        SamplingParams(temperature=0.0, max_tokens=8),
    ],
    ids=["T1", "T0.7", "T0.7-filtered", "greedy"],
)
def test_logprobs_are_the_sampling_distribution(backend, prompts, llama_and_tok, sampling):
    model, _ = llama_and_tok
    out = backend().generate(prompts, 2, sampling)
    order = "vllm" if backend.name == "vllm" else "transformers"
    for c in out:
        expected = sampled_logp(model, prompts[c.prompt_index], c.token_ids, sampling, order)
        # float32 end to end; the only differences are summation order (KV cache vs full forward).
        assert c.logprobs == pytest.approx(expected, abs=LOGP_TOL.get(backend.name, 2e-4))


def test_seed_reproduces_and_differs(backend, prompts):
    engine = backend()
    a = engine.generate(prompts, 3, SamplingParams(temperature=1.0, max_tokens=8, seed=11))
    b = engine.generate(prompts, 3, SamplingParams(temperature=1.0, max_tokens=8, seed=11))
    c = engine.generate(prompts, 3, SamplingParams(temperature=1.0, max_tokens=8, seed=12))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    # 12 completions of up to 8 tokens over an 86-token vocabulary: equal by chance has negligible odds.
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


@pytest.mark.parametrize(
    "sampling",
    [
        {},
        {"repetition_penalty": 1.3},
    ],
    ids=["plain", "repetition-penalty"],
)
def test_greedy_matches_transformers_generate(backend, prompts, llama_and_tok, sampling):
    model, tok = llama_and_tok
    expected = greedy_reference(model, tok, prompts, 12, **sampling)
    out = backend().generate(prompts, 2, SamplingParams(temperature=0.0, max_tokens=12, **sampling))
    assert [c.token_ids for c in out] == [e.token_ids for e in expected for _ in range(2)]
    assert [c.finish_reason for c in out] == [e.finish_reason for e in expected for _ in range(2)]


@pytest.mark.parametrize(
    "filters",
    [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 0.999999}],
    ids=["top_k=1", "top_p~0", "min_p~1"],
)
def test_degenerate_filters_are_greedy(backend, prompts, llama_and_tok, filters):
    """Each filter, pushed to its limit, leaves only the argmax: proves the filter is applied at all."""
    model, tok = llama_and_tok
    expected = greedy_reference(model, tok, prompts, 8)
    out = backend().generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=8, seed=0, **filters))
    assert [c.token_ids for c in out] == [e.token_ids for e in expected for _ in range(2)]


def _first_new_token_position(ids: list[int]) -> int:
    """Smallest k >= 1 such that ids[k] does not occur in ids[:k] (so cutting at it is unambiguous);
    never the last position, which may be the real EOS."""
    for k in range(1, len(ids) - 1):
        if ids[k] not in ids[:k]:
            return k
    pytest.fail(
        "the test model's greedy output repeats one token, so no unambiguous EOS can be derived from "
        "it: change the fixture model's seed"
    )


def test_eos_ends_completion_and_is_kept(backend, prompts, llama_and_tok):
    model, tok = llama_and_tok
    ref = greedy_reference(model, tok, prompts[:1], 12)[0].token_ids
    k = _first_new_token_position(ref)
    # Declare the k-th greedy token to be the EOS: the completion must end right there, EOS included.
    out = backend(eos_token_ids=[ref[k]]).generate(prompts[:1], 2, SamplingParams(temperature=0.0, max_tokens=12))
    for c in out:
        assert c.token_ids == ref[: k + 1]
        assert c.finish_reason == "stop"
        assert len(c.logprobs) == k + 1


def test_stop_string_truncates_text_and_ids(backend, prompts, llama_and_tok):
    model, tok = llama_and_tok
    ref = greedy_reference(model, tok, prompts[:1], 12)[0]
    k = _first_new_token_position(ref.token_ids)
    assert ref.token_ids[k] != tok.eos_token_id
    stop = tok.decode([ref.token_ids[k]])  # one char with the char-level tokenizer
    out = backend().generate(
        prompts[:1],
        1,
        SamplingParams(temperature=0.0, max_tokens=12, stop=("@@never@@", stop)),
    )
    (c,) = out
    assert c.token_ids == ref.token_ids[: k + 1]
    assert c.text == tok.decode(ref.token_ids[: k + 1], skip_special_tokens=True)
    assert c.text.endswith(stop) and c.finish_reason == "stop"
    assert len(c.logprobs) == k + 1
