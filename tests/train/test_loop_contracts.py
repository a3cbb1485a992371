"""What the loop promises beyond 'it runs': no reference model at beta=0, no old-logprob pass when the
ratio is exactly 1, reward functions that raise are counted and survived, broken ones are named."""

from __future__ import annotations

import json

import pytest
import torch

import rlvr.builders as builders
import rlvr.train as train_mod
from rlvr.config import load_config
from rlvr.rewards.scoring import RewardFunctionError
from test_smoke import read_jsonl, smoke_overrides


@pytest.fixture
def spies(monkeypatch):
    calls = {"ref_models": 0, "no_grad_forwards": 0}
    real_load, real_lp = train_mod.load_model, train_mod.completion_logprobs

    def load_model(cfg, device, trainable=True):
        calls["ref_models"] += not trainable
        return real_load(cfg, device, trainable)

    def completion_logprobs(run, model, mb, with_entropy=False):
        calls["no_grad_forwards"] += not torch.is_grad_enabled()
        return real_lp(run, model, mb, with_entropy)

    monkeypatch.setattr(train_mod, "load_model", load_model)
    monkeypatch.setattr(builders, "load_model", load_model)  # the reference: builders.load_reference
    monkeypatch.setattr(train_mod, "completion_logprobs", completion_logprobs)
    return calls


def test_beta_zero_on_policy_needs_no_reference_and_no_old_logprob_pass(spies, tiny_model_dir, sum_dataset, tmp_path):
    train_mod.train(
        load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "r", "train.max_steps=2"))
    )
    assert spies == {"ref_models": 0, "no_grad_forwards": 0}


def test_beta_positive_loads_a_frozen_reference(spies, tiny_model_dir, sum_dataset, tmp_path):
    train_mod.train(
        load_config(
            None, smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "r", "train.max_steps=2", "algo.beta=0.1")
        )
    )
    assert spies["ref_models"] == 1 and spies["no_grad_forwards"] > 0
    kls = [m["kl"] for m in read_jsonl(tmp_path / "r" / "metrics.jsonl")]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # first step: policy == reference
    assert kls[1] > 0.0  # after one update with lr 1e-2 they differ


@pytest.mark.parametrize(
    "extra", [["algo.num_iterations=2"], ["train.steps_per_generation=2", "train.per_device_train_batch_size=8"]]
)
def test_old_logprob_pass_runs_when_the_ratio_can_move(spies, tiny_model_dir, sum_dataset, tmp_path, extra):
    train_mod.train(
        load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "r", "train.max_steps=2", *extra))
    )
    assert spies["ref_models"] == 0 and spies["no_grad_forwards"] > 0


def test_raising_reward_function_is_counted_and_the_run_goes_on(tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "r"
    over = smoke_overrides(tiny_model_dir, sum_dataset, out, "train.max_steps=2")
    over = [o for o in over if not o.startswith("rewards=")]
    over.append("rewards=[{name: 'smoke_rewards:length_bonus'}, {name: 'smoke_rewards:flaky', weight: 0.5}]")
    result = train_mod.train(load_config(None, over))
    assert result["step"] == 2
    last = read_jsonl(out / "metrics.jsonl")[-1]
    assert last["rewards/flaky/errors"] == 2.0
    assert last["rewards/length_bonus/errors"] == 0.0


def test_wrong_length_reward_is_a_clear_error(tiny_model_dir, sum_dataset, tmp_path):
    over = [o for o in smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "r") if not o.startswith("rewards=")]
    over.append("rewards=[{name: 'smoke_rewards:wrong_length'}]")
    with pytest.raises(RewardFunctionError, match="'wrong_length' returned 1 values for 2 completions"):
        train_mod.train(load_config(None, over))


class _DropLogprobs:
    """Wraps the run's engine and drops the sampler log-probs of every `every`-th completion: what an
    OpenAI-compatible server does with misaligned log-probs, and what vLLM does when it returns None."""

    def __init__(self, engine, every: int):
        self.engine, self.every, self.kept_tokens = engine, every, 0
        self.samples_live_policy = engine.samples_live_policy

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompt_ids, n, sampling):
        out = self.engine.generate(prompt_ids, n, sampling)
        assert all(c.logprobs is not None for c in out), "the wrapped engine must report log-probs"
        for i, c in enumerate(out):
            if i % self.every == 0:
                c.logprobs = None
        self.kept_tokens = sum(len(c.token_ids) for c in out if c.logprobs is not None)
        return out


@pytest.mark.parametrize("every", [1, 2], ids=["all-missing", "some-missing"])
def test_completions_without_sampler_logprobs_do_not_break_the_loop(
    monkeypatch, tiny_model_dir, sum_dataset, tmp_path, every
):
    wrapped = []
    real_build = train_mod.build_engine

    def build_engine(*args, **kwargs):
        wrapped.append(_DropLogprobs(real_build(*args, **kwargs), every))
        return wrapped[-1]

    monkeypatch.setattr(train_mod, "build_engine", build_engine)
    out = tmp_path / "run"
    # per_device_train_batch_size = the whole generation batch: one micro-batch, so mismatch/tokens is the
    # count over the whole batch and can be compared with what the engine kept.
    result = train_mod.train(load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, out, "train.max_steps=2")))
    assert result["step"] == 2
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2]
    if every == 1:  # nothing to compare: no mismatch keys at all
        assert not [k for k in lines[-1] if k.startswith("mismatch/")]
    else:  # compared on the completions that kept their log-probs, and only there
        assert lines[-1]["mismatch/tokens"] == wrapped[0].kept_tokens > 0
        assert lines[-1]["mismatch/tokens"] < lines[-1]["num_tokens"]
        assert lines[-1]["mismatch/abs_logp_diff_mean"] < 1e-3  # hf engine: same model, same dtype
