"""What the loop promises beyond 'it runs': no reference model at beta=0, no old-logprob pass when the
ratio is exactly 1, reward functions that raise are counted and survived, broken ones are named."""

from __future__ import annotations

import json

import pytest
import torch

import rlvr.train as train_mod
from rlvr.config import load_config
from rlvr.scoring import RewardFunctionError
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
    monkeypatch.setattr(train_mod, "completion_logprobs", completion_logprobs)
    return calls


def test_beta_zero_on_policy_needs_no_reference_and_no_old_logprob_pass(spies, tiny_model_dir, sum_dataset, tmp_path):
    train_mod.train(load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "r", "train.max_steps=2")))
    assert spies == {"ref_models": 0, "no_grad_forwards": 0}


def test_beta_positive_loads_a_frozen_reference(spies, tiny_model_dir, sum_dataset, tmp_path):
    train_mod.train(load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "r", "train.max_steps=2",
                                                      "algo.beta=0.1")))
    assert spies["ref_models"] == 1 and spies["no_grad_forwards"] > 0
    kls = [m["kl"] for m in read_jsonl(tmp_path / "r" / "metrics.jsonl")]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # first step: policy == reference
    assert kls[1] > 0.0  # after one update with lr 1e-2 they differ


@pytest.mark.parametrize("extra", [["algo.num_iterations=2"],
                                   ["train.steps_per_generation=2", "train.per_device_train_batch_size=8"]])
def test_old_logprob_pass_runs_when_the_ratio_can_move(spies, tiny_model_dir, sum_dataset, tmp_path, extra):
    train_mod.train(load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "r",
                                                      "train.max_steps=2", *extra)))
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
