"""The trainer with a stale sampler: a real HTTP completions server holding its own copy of the model.
The lag is counted, importance sampling corrects for it, and reload_every bounds it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import rlvr.train as train_mod
from rlvr.config import ConfigError, load_config
from test_smoke import read_jsonl, smoke_overrides

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from completions_server import CompletionsServer  # noqa: E402


@pytest.fixture
def server(tiny_model_dir):
    srv = CompletionsServer(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)
    )
    yield srv
    srv.close()


def overrides(model, data, out, server, *extra):
    return [o for o in smoke_overrides(model, data, out, "train.max_steps=3", *extra) if "rollout.backend" not in o] + [
        "rollout.backend=openai",
        "rollout.allow_stale_sampler=true",
        f"rollout.engine_options={{base_url: '{server.base_url}/v1'}}",
    ]


def test_stale_backend_needs_explicit_consent():
    with pytest.raises(ConfigError, match="allow_stale_sampler=true"):
        load_config(None, ["rollout.backend=openai"])
    for backend in ("native", "hf", "vllm", "vllm-server"):  # engines that take weights need no consent
        load_config(None, [f"rollout.backend={backend}"])


def test_lag_grows_and_importance_sampling_acts(server, tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "r"
    train_mod.train(load_config(None, overrides(tiny_model_dir, sum_dataset, out, server)))
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["policy_lag"] for m in lines] == [0.0, 1.0, 2.0]
    assert server.reloads == []
    # Step 1 samples the same weights the trainer has: sampler and trainer log-probs agree; later
    # steps sample old weights, and the mismatch shows it.
    assert lines[0]["mismatch/abs_logp_diff_mean"] < 1e-4
    assert lines[2]["mismatch/abs_logp_diff_mean"] > 10 * lines[0]["mismatch/abs_logp_diff_mean"]
    # The correction acts: weights differ from 1 once the sampler lags, and every key is documented.
    assert lines[2]["sampling/importance_sampling_ratio/max"] != pytest.approx(1.0, abs=1e-6)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert all(f"`{k}`" in doc for k in lines[2] if k.startswith(("sampling/", "mismatch/")))


def test_reload_every_bounds_the_lag(server, tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "r"
    extra = [
        f"rollout.engine_options={{base_url: '{server.base_url}/v1', "
        f"reload_every: 1, reload_url: '{server.base_url}/reload'}}"
    ]
    over = overrides(tiny_model_dir, sum_dataset, out, server)[:-1] + extra
    train_mod.train(load_config(None, over))
    assert [m["policy_lag"] for m in read_jsonl(out / "metrics.jsonl")] == [0.0, 0.0, 0.0]
    assert len(server.reloads) == 3
    assert all(Path(p).parent == out / "policy-exports" for p in server.reloads)
