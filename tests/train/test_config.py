"""Config: round trip, and every kind of bad input fails at load with a message naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlvr.config import Config, ConfigError, dump_config, load_config

REPO = Path(__file__).resolve().parents[2]


def test_defaults_follow_trl_names_and_values():
    cfg = load_config()
    assert cfg.rollout.num_generations == 8 and cfg.algo.beta == 0.0 and cfg.algo.epsilon == 0.2
    assert cfg.algo.loss_type == "dapo" and cfg.algo.scale_rewards == "group"
    assert cfg.rollout.temperature == 1.0 and cfg.algo.importance_sampling_level is None  # the preset's level
    assert cfg.prompts_per_generation * cfg.rollout.num_generations == cfg.generation_batch_size


def test_round_trip(tmp_path):
    cfg = load_config(None, ["algo.loss_type=gspo", "algo.beta=0.04", 'rollout.stop=["\\n"]', "train.seed=3"])
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(cfg))
    again = load_config(path)
    assert again == cfg
    assert again.algo.loss_type == "gspo" and again.rollout.stop == ["\n"]


def test_flat_trl_names_are_routed_to_their_section(tmp_path):
    cfg = load_config(None, ["loss_type=bnpo", "num_generations=4", "learning_rate=1e-5"])
    assert (cfg.algo.loss_type, cfg.rollout.num_generations, cfg.train.learning_rate) == ("bnpo", 4, 1e-5)
    path = tmp_path / "flat.yaml"
    path.write_text(yaml.safe_dump({"beta": 0.1, "max_steps": 7}))
    cfg = load_config(path)
    assert cfg.algo.beta == 0.1 and cfg.train.max_steps == 7


def test_unknown_key_names_the_valid_keys_and_a_suggestion():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.loss_typ=grpo"])
    msg = str(e.value)
    assert "algo.loss_typ: unknown key" in msg and "Did you mean 'loss_type'?" in msg and "epsilon_high" in msg


def test_bad_type_is_named():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.max_steps=lots"])
    assert "train.max_steps" in str(e.value) and "'lots'" in str(e.value)


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.loss_type=ppo"])
    msg = str(e.value)
    assert "unknown loss_type 'ppo'" in msg
    for name in ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "luspo"):
        assert name in msg


def test_unknown_reward_and_backend_and_task():
    with pytest.raises(ConfigError, match="unknown reward 'mathh'.*math"):
        load_config(None, ["rewards=[{name: mathh}]"])
    with pytest.raises(ConfigError, match="unknown rollout backend 'sglang'.*native"):
        load_config(None, ["rollout.backend=sglang"])
    with pytest.raises(ConfigError, match="unknown data.task 'algebra'.*arithmetic"):
        load_config(None, ["data.task=algebra"])


def test_batch_must_hold_whole_groups():
    with pytest.raises(ConfigError, match="divisible by rollout.num_generations 8"):
        load_config(None, ["train.per_device_train_batch_size=12"])


def test_dataset_without_rewards_is_refused():
    with pytest.raises(ConfigError, match="needs `rewards:`"):
        load_config(None, ["data.path=x.jsonl"])


def test_malformed_override_and_missing_file():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["loss_type"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("no/such/config.yaml")


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "rlvr" / "configs").glob("*.yaml")))
def test_shipped_configs_validate(name):
    cfg = load_config(REPO / "rlvr" / "configs" / name)
    assert isinstance(cfg, Config)


def test_docs_config_md_is_current():
    from rlvr.config import config_markdown

    assert (REPO / "docs" / "config.md").read_text() == config_markdown(), (
        "docs/config.md is stale: run `python -m rlvr.config > docs/config.md`"
    )


def test_cispo_needs_a_cap_above_one():
    with pytest.raises(ConfigError, match="epsilon_high"):
        load_config(None, ["loss_type=cispo"])
    assert load_config(None, ["loss_type=cispo", "epsilon_high=5.0"]).algo.epsilon_high == 5.0


def test_algorithm_choices_come_from_the_registries(monkeypatch):
    """A newly registered advantage estimator / KL estimator is valid config at once; unknown names list
    exactly what the registries hold."""
    from rlvr import core

    for key, registry, leaf in (
        ("advantage_estimator", core.ADVANTAGE_ESTIMATORS, lambda r, g, s: r),
        ("kl_estimator", core.KL_ESTIMATORS, lambda logp, ref: logp - ref),
    ):
        with pytest.raises(ConfigError, match=f"unknown {key} 'mine'; valid choices: {', '.join(registry.names())}"):
            load_config(None, [f"algo.{key}=mine"])
        monkeypatch.setitem(registry._items, "mine", leaf)
        assert getattr(load_config(None, [f"algo.{key}=mine"]).algo, key) == "mine"
    for key, bad in (
        ("scale_rewards", "median"),
        ("importance_sampling_level", "group"),
        ("sampler_importance_sampling_mode", "clip"),
    ):
        with pytest.raises(ConfigError, match=f"unknown {key} '{bad}'"):
            load_config(None, [f"algo.{key}={bad}"])


def test_ready_configs_resolve_by_bare_name_from_anywhere(tmp_path, monkeypatch):
    """They ship inside the package (rlvr/configs/, package data), so a pip install has them too."""
    monkeypatch.chdir(tmp_path)
    assert load_config("dapo_math") == load_config(REPO / "rlvr" / "configs" / "dapo_math.yaml")
    with pytest.raises(ConfigError, match="nor is it a ready config: .*dapo_math"):
        load_config("dapo_mathh")
