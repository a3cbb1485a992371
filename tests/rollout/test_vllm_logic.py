"""The vLLM engines' own logic, against a stand-in for vLLM (tests/rollout/fake_vllm.py) so it runs in
the normal CPU suite: model sources, greedy requests, parameter checks before waking, finish reasons,
EOS ids, seeds, keyword options, LoRA folders, teardown, the server's log-prob mode and rank-0 pushes.
The real engine is tested in tests/vllm_cpu (the vLLM CPU lane)."""

from __future__ import annotations

import os
import sys
import types

import fake_vllm
import pytest
import torch
import torch.distributed as dist

from rlvr.rollout import SamplingParams, make_engine
from rlvr.rollout import vllm as rv


@pytest.fixture
def fake(monkeypatch):
    llm = fake_vllm.install(monkeypatch)
    yield llm
    if dist.is_initialized():  # a failed test must not leak the group into the next one
        dist.destroy_process_group()


@pytest.fixture
def saved(llama_and_tok, tmp_path):
    model, tok = llama_and_tok
    model.save_pretrained(tmp_path / "policy")
    return model, tok, str(tmp_path / "policy")


def colocate(saved, **options):
    model, tok, path = saved
    return make_engine("vllm", model, tok, model_path=path, **options)


def test_hub_ids_and_folders_are_model_sources(llama_and_tok, tmp_path):
    model, _ = llama_and_tok
    assert rv.model_source(model, "Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert rv.model_source(model, "Qwen/Qwen2.5-0.5B-Instruct@main") == "Qwen/Qwen2.5-0.5B-Instruct@main"
    assert rv.model_source(model, str(tmp_path)) == str(tmp_path)
    for bad in (str(tmp_path / "missing" / "folder"), "", None):
        with pytest.raises(ValueError, match="neither a local folder nor a hub id"):
            rv.model_source(types.SimpleNamespace(name_or_path=bad), None)


def test_hub_id_reaches_vllm(fake, llama_and_tok):
    model, tok = llama_and_tok
    engine = make_engine("vllm", model, tok, model_path="Qwen/Qwen2.5-0.5B-Instruct")
    assert fake.instances[0].kwargs["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    engine.close()


def test_greedy_with_n_above_one_asks_one_and_repeats(fake, saved, prompts):
    engine = colocate(saved)
    out = engine.generate(prompts, 3, SamplingParams(temperature=0.0, max_tokens=5))
    assert [c.prompt_index for c in out] == [i for i in range(len(prompts)) for _ in range(3)]
    for i in range(len(prompts)):
        group = out[3 * i : 3 * i + 3]
        assert group[0].token_ids == group[1].token_ids == group[2].token_ids
        assert group[0] is not group[1]  # independent objects: the trainer may annotate one
    engine.close()


def test_parameters_are_checked_before_waking_and_the_engine_sleeps_after_errors(fake, saved, prompts, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # sleep mode is CUDA-only
    engine = colocate(saved)
    llm = fake.instances[0]
    assert engine.sleep_mode and llm.calls[-1] == ("sleep", 2)
    llm.calls.clear()
    # vLLM refuses this parameter: the error must come before any wake-up, so nothing stays awake.
    sys.modules["vllm"].SamplingParams = _refusing_params
    with pytest.raises(ValueError, match="refused"):
        engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=4, seed=0))
    assert not [c for c in llm.calls if c[0] == "wake_up"]
    sys.modules["vllm"].SamplingParams = fake_vllm.SamplingParams
    # An error inside generation: the engine is put back to sleep.
    monkeypatch.setattr(llm, "generate", _raising_generate)
    with pytest.raises(RuntimeError, match="boom"):
        engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=4, seed=0))
    assert llm.calls[-1][0] == "sleep" and not engine._weights_awake
    engine.close()


def _refusing_params(**kwargs):
    raise ValueError("refused by vLLM")


def _raising_generate(*args, **kwargs):
    raise RuntimeError("boom")


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_abort_and_error_are_not_length(fake, saved, prompts, reason):
    engine = colocate(saved)
    fake.force_finish = reason
    out = engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=4, seed=0))
    assert {c.finish_reason for c in out} == {reason}
    engine.close()


def test_every_eos_id_is_a_stop_token(fake, saved, prompts):
    engine = colocate(saved, eos_token_ids=[3, 7, 11])
    out = engine.generate(prompts, 4, SamplingParams(temperature=1.0, max_tokens=30, seed=1))
    assert any(c.finish_reason == "stop" for c in out)
    for c in out:
        # vLLM itself stopped at the first of them: nothing was generated past it and cut here.
        assert all(t not in (3, 7, 11) for t in c.token_ids[:-1])
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in (3, 7, 11))
    engine.close()


def test_eos_ids_outside_the_vocabulary_are_not_sent(fake, saved, prompts):
    _, tok, _ = saved
    engine = colocate(saved, eos_token_ids=[3, len(tok) + 5])  # vLLM refuses out-of-vocab stop ids
    _, params = engine._params(prompts, 2, SamplingParams(max_tokens=4, seed=0))
    assert {tuple(p.stop_token_ids) for p in params} == {(3,)}
    engine.close()


def test_user_options_override_defaults_and_engine_owned_ones_are_refused(fake, saved):
    engine = colocate(saved, enforce_eager=True, max_model_len=64, seed=3, distributed_executor_backend="mp")
    kwargs = fake.instances[0].kwargs
    assert (kwargs["enforce_eager"], kwargs["max_model_len"], kwargs["seed"]) == (True, 64, 3)
    assert kwargs["distributed_executor_backend"] == "mp" and kwargs["logprobs_mode"] == "processed_logprobs"
    engine.close()
    with pytest.raises(ValueError, match="logprobs_mode cannot be passed"):
        colocate(saved, logprobs_mode="raw_logprobs")


def test_no_fixed_port_and_no_environment_left_behind(fake, saved):
    before = {
        k: os.environ.get(k)
        for k in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "VLLM_ENABLE_V1_MULTIPROCESSING")
    }
    engine = colocate(saved)
    assert {k: os.environ.get(k) for k in before} == before
    engine.close()
    a, b = rv.free_port(), rv.free_port()
    for port in (a, b):  # really free: it can be bound
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_trainers_random_streams_survive_the_engine_start(fake, saved):
    import random

    torch.manual_seed(1234)
    random.seed(1234)
    expected = (torch.rand(3).tolist(), random.random())
    torch.manual_seed(1234)
    random.seed(1234)
    engine = colocate(saved)  # vLLM seeds the global RNGs with its own seed while it starts
    assert (torch.rand(3).tolist(), random.random()) == expected
    engine.close()


def test_close_releases_vllm_and_its_process_group(fake, saved, prompts):
    assert not dist.is_initialized()
    engine = colocate(saved)
    assert dist.is_initialized()  # vLLM's worker started a one-rank group
    assert "distributed_executor_backend" not in fake.instances[0].kwargs  # in-process, uni-process
    engine.close()
    assert not dist.is_initialized() and not hasattr(engine, "llm")
    engine.close()  # idempotent


def test_close_keeps_the_trainers_process_group(fake, saved):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    engine = colocate(saved)
    assert fake.instances[0].kwargs["distributed_executor_backend"] == "external_launcher"
    engine.close()
    assert dist.is_initialized()  # rlvr's own group: not vLLM's to destroy
    dist.destroy_process_group()


def test_weights_pushed_through_vllms_reload(fake, saved, prompts):
    model, _, _ = saved
    engine = colocate(saved)
    engine.load_weights(model.named_parameters())
    llm = fake.instances[0]
    method, kwargs = llm.calls[-2][1], llm.calls[-2][2]
    assert method == "reload_weights" and kwargs["weights_iterator"] == [n for n, _ in model.named_parameters()]
    assert llm.calls[-1] == ("reset_prefix_cache",) and engine.version == 1
    engine.close()


def test_lora_adapter_folders_do_not_pile_up(fake, llama_and_tok, tmp_path):
    from peft import LoraConfig, get_peft_model

    from rollout_models import tiny_model

    base, tok = tiny_model("llama", seed=1)
    base.save_pretrained(tmp_path / "base")
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))
    engine = make_engine("vllm", model, tok, model_path=str(tmp_path / "base"))
    folder = engine._lora_dir
    for _ in range(3):
        engine.load_weights(model.named_parameters())
    assert os.listdir(folder) == ["v3"] and engine._lora_request.path.endswith("v3")
    engine.close()
    assert not os.path.exists(folder)


# ------------------------------------------------------------------ server mode


class FakeHTTP:
    """Answers the two routes the server engine's start-up reads, with a chosen probe log-prob."""

    def __init__(self, probe_logprob):
        self.probe_logprob, self.posts = probe_logprob, []

    def install(self, monkeypatch):
        from rlvr.rollout.openai import CompletionsClient

        monkeypatch.setattr(
            CompletionsClient, "request", lambda client, path, payload=None, timeout=None: self(path, payload)
        )
        return self

    def __call__(self, path, payload=None):
        if path == "/v1/models":
            return {"data": [{"id": "policy"}]}
        self.posts.append((path, payload))
        if path == "/v1/completions":
            return {
                "choices": [
                    {
                        "index": 0,
                        "text": "a",
                        "token_ids": [5],
                        "finish_reason": "length",
                        "logprobs": {"token_logprobs": [self.probe_logprob]},
                    }
                ]
            }
        return {}


@pytest.mark.parametrize(
    "probe, ok", [(0.0, True), (-2.3, False), (7.5, False)], ids=["processed_logprobs", "raw_logprobs", "logits"]
)
def test_server_logprobs_mode_is_checked(monkeypatch, llama_and_tok, probe, ok):
    model, tok = llama_and_tok
    http = FakeHTTP(probe).install(monkeypatch)
    if ok:
        make_engine("vllm-server", model, tok, push="none").close()
        ((path, payload),) = http.posts
        assert payload["top_k"] == 1 and payload["temperature"] != 1.0 and payload["max_tokens"] == 1
    else:
        with pytest.raises(ValueError, match="--logprobs-mode processed_logprobs"):
            make_engine("vllm-server", model, tok, push="none")


class FakeClient:
    made: list = []

    def __init__(self, base_url, group_port):
        self.group_port, self.pushes = group_port, 0
        FakeClient.made.append(self)

    def init_communicator(self, device):
        self.device = device

    def update_model_params(self, model):
        self.pushes += 1

    def reset_prefix_cache(self):
        pass

    def close_communicator(self):
        pass


@pytest.mark.parametrize("rank", [0, 1])
def test_server_push_from_rank_zero_only(monkeypatch, llama_and_tok, rank):
    model, tok = llama_and_tok
    FakeHTTP(0.0).install(monkeypatch)
    mod = types.ModuleType("trl.generation.vllm_client")
    mod.VLLMClient = FakeClient
    monkeypatch.setitem(sys.modules, "trl.generation.vllm_client", mod)
    fake_vllm.install(monkeypatch)
    barriers = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # NCCL pushes need CUDA
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: rank)
    monkeypatch.setattr(dist, "barrier", lambda: barriers.append(1))
    FakeClient.made = []
    engine = make_engine("vllm-server", model, tok, push="nccl", device=0)
    engine.load_weights(model.named_parameters())
    if rank == 0:
        (client,) = FakeClient.made
        assert client.pushes == 1 and client.group_port != 51216  # not TRL's fixed default port
    else:
        assert FakeClient.made == []  # another rank never joins the NCCL group
    assert barriers == [1] and engine.policy_lag == 0  # every rank waits for the push to land
    engine.close()


def test_server_reload_counts_the_lag(monkeypatch, llama_and_tok, tmp_path):
    model, tok = llama_and_tok
    http = FakeHTTP(0.0).install(monkeypatch)
    engine = make_engine("vllm-server", model, tok, push="reload", reload_dir=str(tmp_path), reload_every=2)
    lags = []
    for _ in range(4):
        engine.load_weights(model.named_parameters())
        lags.append(engine.policy_lag)
    assert lags == [1, 0, 1, 0] and not engine.receives_weights  # stale in between: the trainer must accept it
    reloads = [p for path, p in http.posts if path == "/collective_rpc"]
    assert len(reloads) == 2 and reloads[0]["method"] == "reload_weights"
    path = reloads[-1]["kwargs"]["weights_path"]
    assert os.path.exists(os.path.join(path, "model.safetensors")) and os.listdir(tmp_path) == [os.path.basename(path)]


def test_server_nccl_push_needs_cuda(monkeypatch, llama_and_tok):
    model, tok = llama_and_tok
    FakeHTTP(0.0).install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="push='reload'"):
        make_engine("vllm-server", model, tok, push="nccl")
    engine = make_engine("vllm-server", model, tok)  # the CPU default reloads from disk
    assert engine.push == "reload" and engine.receives_weights
    engine.close()
    assert not os.path.exists(engine.reload_dir)  # its own temporary export folder is deleted


def test_gsm8k_config_gets_to_the_model_download(monkeypatch, tmp_path):
    """The shipped GSM8K config validates, its hub id is a model source vLLM takes, and setup goes as far as
    fetching the model; offline, that is one line naming HF_HUB_OFFLINE and the fix."""
    import huggingface_hub.constants

    import rlvr.train as train_mod
    from rlvr.config import load_config

    config = os.path.join(os.path.dirname(__file__), "..", "..", "rlvr", "configs", "gsm8k_qwen2.5_0.5b.yaml")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text('{"question": "What is 2+3?", "answer": "2+3=5\\n#### 5"}\n')
    cfg = load_config(config, [f"data.path={data}", f"data.eval_path={data}", f"log.output_dir={tmp_path / 'run'}"])
    assert cfg.rollout.backend == "vllm" and rv.model_source(types.SimpleNamespace(), cfg.model.path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import time
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: the model is not there
    with pytest.raises(OSError, match=r"HF_HUB_OFFLINE=1 forbids downloading it .*hf download Qwen/Qwen2\.5-0\.5B"):
        train_mod.setup(cfg)
