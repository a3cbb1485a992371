"""The OpenAI-compatible engine is a stale sampler: it counts the lag, and with reload_every=k the
server is re-pointed at an export of the live policy so the lag stays below k."""

from __future__ import annotations

import copy

import pytest
import torch
from rollout_models import tiny_model

from rlvr.rollout import SamplingParams, make_engine


def test_stale_sampler_lag_and_reload(tmp_path):
    from completions_server import CompletionsServer

    server_model, tok = tiny_model("llama", seed=7)
    server = CompletionsServer(server_model.eval(), tok)
    try:
        policy = copy.deepcopy(server_model)  # the trainer's live policy starts equal to the served one
        engine = make_engine(
            "openai",
            policy,
            tok,
            base_url=server.base_url + "/v1",
            reload_every=2,
            export_dir=str(tmp_path),
            reload_url=server.base_url + "/reload",
        )
        assert engine.samples_live_policy is False and engine.model_name == "tiny"
        prompts = [tok.encode("37+45="), tok.encode("8*9=")]
        greedy = SamplingParams(temperature=0.0, max_tokens=6)
        live = make_engine("native", policy, tok)
        assert [c.token_ids for c in engine.generate(prompts, 1, greedy)] == [
            c.token_ids for c in live.generate(prompts, 1, greedy)
        ]

        with torch.no_grad():  # an "optimizer step" on the live policy only
            policy.lm_head.weight.mul_(-1.0)
        engine.load_weights(policy.named_parameters())
        out = engine.generate(prompts, 1, greedy)
        assert engine.policy_lag == 1 and all(c.extra["policy_lag"] == 1 for c in out)
        assert server.reloads == []
        # Stale: the server still samples the old weights, so its tokens differ from the live policy's.
        assert [c.token_ids for c in out] != [c.token_ids for c in live.generate(prompts, 1, greedy)]

        engine.load_weights(policy.named_parameters())  # second step: reload_every=2 triggers a reload
        assert engine.policy_lag == 0 and len(server.reloads) == 1
        assert server.reloads[0].endswith("policy-v2") and sorted(p.name for p in tmp_path.iterdir()) == ["policy-v2"]
        out = engine.generate(prompts, 1, greedy)
        assert [c.token_ids for c in out] == [c.token_ids for c in live.generate(prompts, 1, greedy)]
        assert all(c.extra["policy_lag"] == 0 for c in out)
    finally:
        server.close()


def test_request_carries_ids_and_sampling(completions_server, llama_and_tok):
    model, tok = llama_and_tok
    engine = make_engine("openai", model, tok, base_url=completions_server.base_url)
    sp = SamplingParams(temperature=0.7, top_k=5, max_tokens=4, stop=("#",), seed=3)
    engine.generate([[6, 10, 65]], 3, sp)
    req = completions_server.requests[-1]
    assert req["prompt"] == [6, 10, 65] and req["n"] == 3 and req["max_tokens"] == 4
    # The prompt's own stream seed (prompt 0 of a request seeded 3: 3 · 2^20), not the request seed.
    assert (req["temperature"], req["top_k"], req["stop"], req["seed"]) == (
        0.7,
        5,
        ["#"],
        3 * 2**20,
    )
    assert req["logprobs"] == 1 and req["return_token_ids"] is True


def test_reload_needs_a_mechanism(llama_and_tok, completions_server):
    model, tok = llama_and_tok
    with pytest.raises(ValueError, match="reload_url"):
        make_engine("openai", model, tok, base_url=completions_server.base_url, reload_every=3)


def test_unreachable_server_is_a_clear_error(llama_and_tok):
    model, tok = llama_and_tok
    with pytest.raises(ConnectionError, match="cannot reach"):
        make_engine("openai", model, tok, base_url="http://127.0.0.1:9")


def test_llama_cpp_python_dialect_request_shape_and_id_recovery():
    """Without the llama-cpp-python server (an optional extra): one request per sample with distinct seeds,
    a text prompt, every filter explicit; ids recovered from one-token pieces, log-probs kept aligned."""
    from rlvr.rollout.openai import LlamaCppPythonDialect, choice_ids

    class StubClient:
        def __init__(self):
            self.payloads = []

        def request(self, path, payload=None, timeout=None):
            self.payloads.append(payload)
            return {
                "usage": {"prompt_tokens": 4},
                "choices": [{"text": "12", "logprobs": {"tokens": ["1", "2"], "token_logprobs": [-0.5, -0.25]}}],
            }

    _, tok = tiny_model("llama")
    client = StubClient()
    sampling = SamplingParams(temperature=0.7, max_tokens=3, seed=10)
    choices = LlamaCppPythonDialect().choices(client, "m", tok, tok.encode("1+2="), 2, sampling)
    assert [p["seed"] for p in client.payloads] == [10, 11] and len(choices) == 2
    assert client.payloads[0]["prompt"] == "1+2=" and client.payloads[0]["repeat_penalty"] == 1.0
    assert client.payloads[0]["top_k"] == 0 and client.payloads[0]["min_p"] == 0.0
    assert choice_ids(choices[0], tok) == (tok.encode("12"), [-0.5, -0.25])
    with pytest.raises(RuntimeError, match="tokenized the 3-token prompt"):
        LlamaCppPythonDialect().choices(client, "m", tok, tok.encode("1+2"), 1, sampling)
    # Ids re-tokenized from text whose length disagrees with the log-probs: the log-probs are dropped.
    assert choice_ids({"text": "123", "logprobs": {"token_logprobs": [-1.0]}}, tok) == (tok.encode("123"), None)


def test_llama_cpp_python_engine_restores_the_eos_and_drops_log_probs_of_other_distributions():
    """llama-cpp-python's server ends on the end-of-generation token without returning it, and reports
    log_softmax of the raw logits at any temperature. The engine puts the policy's EOS back (NaN log-prob)
    only when the server stopped and no stop string did, and keeps log-probs only for temperature 1 or
    greedy with no filter or penalty."""
    model, tok = tiny_model("llama")
    eos = tok.eos_token_id

    class StubClient:
        finish = "stop"

        def request(self, path, payload=None, timeout=None):
            choice = {"text": "12", "finish_reason": self.finish,
                      "logprobs": {"tokens": ["1", "2"], "token_logprobs": [-0.5, -0.25]}}
            return {"usage": {"prompt_tokens": 4}, "choices": [choice]}

    engine = make_engine(
        "openai", model, tok, base_url="http://127.0.0.1:9", model_name="m", dialect="llama-cpp-python"
    )
    engine.client = StubClient()
    prompt = [tok.encode("1+2=")]
    [c] = engine.generate(prompt, 1, SamplingParams(temperature=1.0, max_tokens=4))
    assert c.token_ids == tok.encode("12") + [eos] and c.finish_reason == "stop" and c.text == "12"
    assert c.logprobs[:2] == [-0.5, -0.25] and len(c.logprobs) == 3 and c.logprobs[2] != c.logprobs[2]  # NaN
    # Stopped by a stop string: the server's "stop" is not an EOS, nothing is appended.
    [c] = engine.generate(prompt, 1, SamplingParams(temperature=1.0, max_tokens=4, stop=("2",)))
    assert c.token_ids == tok.encode("12") and c.finish_reason == "stop"
    # Ended by the length limit: no EOS either.
    engine.client.finish = "length"
    [c] = engine.generate(prompt, 1, SamplingParams(temperature=1.0, max_tokens=2))
    assert c.token_ids == tok.encode("12") and c.finish_reason == "length" and c.logprobs == [-0.5, -0.25]
    # Any other sampling distribution: the raw log-probs are not the sampler's, so none are reported.
    for sampling in (SamplingParams(temperature=0.7, max_tokens=2), SamplingParams(top_k=5, max_tokens=2),
                     SamplingParams(min_p=0.1, max_tokens=2), SamplingParams(repetition_penalty=1.1, max_tokens=2)):
        [c] = engine.generate(prompt, 1, sampling)
        assert c.token_ids == tok.encode("12") and c.logprobs is None
        assert "log-probs are not reported" in engine.describe(sampling)
    [c] = engine.generate(prompt, 1, SamplingParams(temperature=0.0, max_tokens=2))
    assert c.logprobs == [-0.5, -0.25] and "not reported" not in engine.describe(SamplingParams(temperature=0.0))
