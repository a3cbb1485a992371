"""The vLLM engines where only a CUDA machine can check them (skipped elsewhere; run all of it with
scripts/vllm_gpu_checks.sh): the colocated engine with sleep mode (the weights discarded between
rollouts and re-pushed), and weights pushed to a ``vllm serve`` over NCCL (two GPUs: NCCL refuses two
ranks on one device). Everything else runs on CPU in tests/vllm_cpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from rollout_models import tiny_model

from rlvr.rollout import SamplingParams, make_engine

pytestmark = [pytest.mark.vllm, pytest.mark.gpu]
vllm = pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("these vLLM checks need a CUDA device", allow_module_level=True)

OPTIONS = {"dtype": "float32", "gpu_memory_utilization": 0.2, "max_model_len": 128, "enforce_eager": True}


@pytest.fixture(scope="module")
def saved_policy(tmp_path_factory):
    # head_dim 32: a shape every vLLM attention backend takes.
    model, tok = tiny_model("llama", seed=0, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    path = tmp_path_factory.mktemp("policy")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    model.name_or_path = str(path)
    return model.cuda(), tok


def greedy_ids(engine, prompts, n=1):
    return [c.token_ids for c in engine.generate(prompts, n, SamplingParams(temperature=0.0, max_tokens=8))]


def test_colocate_sleep_mode_matches_trainer_and_takes_weights(saved_policy):
    model, tok = saved_policy
    engine = make_engine("vllm", model, tok, enable_sleep_mode=True, **OPTIONS)
    prompts = [tok.encode("37+45="), tok.encode("8*9=")]
    assert greedy_ids(engine, prompts, 2) == [
        i for i in greedy_ids(make_engine("hf", model, tok), prompts) for _ in range(2)
    ]
    T = 0.8
    out = engine.generate(prompts, 4, SamplingParams(temperature=T, max_tokens=8, seed=0))
    assert len(out) == 8 and [c.prompt_index for c in out] == [0] * 4 + [1] * 4
    for c in out:
        ids = torch.tensor([prompts[c.prompt_index] + c.token_ids], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompts[c.prompt_index]) - 1 : -1].float() / T
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(c.token_ids, device="cuda")[:, None])
        # float32 on both sides; GPU kernels (split-K matmuls, paged attention) reorder sums.
        assert c.logprobs == pytest.approx(expected.squeeze(1).tolist(), abs=1e-3)
    with torch.no_grad():
        model.lm_head.weight.neg_()
    engine.load_weights(model.named_parameters())
    assert greedy_ids(engine, prompts) == greedy_ids(make_engine("hf", model, tok), prompts)
    with torch.no_grad():
        model.lm_head.weight.neg_()
    engine.close()
    assert not torch.distributed.is_initialized()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs the server on a second GPU")
def test_server_nccl_push(saved_policy, tmp_path):
    model, tok = saved_policy
    from rlvr.rollout.vllm import free_port

    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model.name_or_path,
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
            "--weight-transfer-config",
            '{"backend": "nccl"}',
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "1", "VLLM_SERVER_DEV_MODE": "1"},
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                    json.loads(r.read())
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(2)
        engine = make_engine("vllm-server", model, tok, base_url=f"http://127.0.0.1:{port}", push="nccl", device=0)
        prompts = [tok.encode("37+45="), tok.encode("8*9=")]
        with torch.no_grad():
            model.lm_head.weight.neg_()
        engine.load_weights(model.named_parameters())
        assert engine.policy_lag == 0
        assert greedy_ids(engine, prompts) == greedy_ids(make_engine("hf", model, tok), prompts)
        with torch.no_grad():
            model.lm_head.weight.neg_()
        engine.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
