"""TRL's GRPOConfig names: each is an rlvr option, translated with TRL 1.16's meaning, or refused with
the rlvr option to use; the README's table says exactly that."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from rlvr.config import ConfigError, _section_fields, load_config
from rlvr.trl_compat import REFUSED, TRAINING_ARGUMENTS_UNSUPPORTED, TRANSLATED, UNSUPPORTED

README = Path(__file__).resolve().parents[2] / "README.md"


def test_trl_values_translate_to_rlvr_options():
    cfg = load_config(None, ["rewards=[math, format]", "reward_weights=[1.0, 0.25]"])
    assert [r.weight for r in cfg.rewards] == [1.0, 0.25]
    # No rewards given: the task's default rewards are made explicit to carry the weights.
    cfg = load_config(None, ["reward_weights=[2.0]"])
    assert [(r.name, r.weight) for r in cfg.rewards] == [("arithmetic", 2.0)]
    assert load_config(None, ["bf16=true"]).train.mixed_precision == "bf16"
    assert load_config(None, ["bf16=false"]).train.mixed_precision == "no"
    assert load_config(None, ["fp16=true"]).model.dtype == "float16"
    assert load_config(None, ["use_vllm=true"]).rollout.backend == "vllm"  # TRL's default mode: colocate
    assert load_config(None, ["use_vllm=true", "vllm_mode=server"]).rollout.backend == "vllm-server"
    assert load_config(None, ["use_vllm=false"]).rollout.backend == "native"
    # TRL: steps_per_generation = generation_batch_size / (per_device_train_batch_size x processes)
    cfg = load_config(None, ["generation_batch_size=64", "per_device_train_batch_size=16"])
    assert cfg.train.micro_batches_per_generation == 4 and cfg.generation_batch_size == 64
    assert load_config(None, ["scale_rewards=true"]).algo.scale_rewards == "group"
    assert load_config(None, ["scale_rewards=false"]).algo.scale_rewards == "none"
    assert load_config(None, ["log_completions=false"]).log.samples_per_class == 0
    assert load_config(None, ["log_completions=true"]).log.samples_per_class == 2
    assert load_config(None, ["warmup_steps=0.1"]).train.warmup_ratio == 0.1  # < 1: a ratio, as in transformers
    assert load_config(None, ["resume_from_checkpoint=true"]).resume is True
    cfg = load_config(None, ["vllm_importance_sampling_mode=token_mask", "vllm_importance_sampling_cap=2.0"])
    assert cfg.algo.sampler_importance_sampling_mode == "token_mask"
    assert cfg.algo.sampler_importance_sampling_clip_max == 2.0


def test_trl_names_in_a_yaml_file(tmp_path):
    p = tmp_path / "trl.yaml"
    p.write_text("bf16: true\nscale_rewards: false\nrewards: [math, format]\nreward_weights: [1.0, 0.1]\n")
    cfg = load_config(p)
    assert (cfg.train.mixed_precision, cfg.algo.scale_rewards, [r.weight for r in cfg.rewards]) == (
        "bf16",
        "none",
        [1.0, 0.1],
    )


@pytest.mark.parametrize(
    "override,message",
    [
        ("num_train_epochs=3", "set train.max_steps"),
        ("num_completions_to_print=4", "log.samples_per_class"),
        ("run_name=exp1", "log.output_dir=runs/NAME"),
        ("reward_weights=[1.0, 2.0]", "2 weights for 1 reward functions"),
        ("generation_batch_size=100", "must be divisible by per_device_train_batch_size"),
        ("vllm_mode=server", "only with use_vllm=true"),
        ("sync_ref_model=true", "has no rlvr equivalent"),
        ("vllm_server_port=8000", "rollout.engine_options"),
        ("push_to_hub=true", "push_to_hub (a transformers TrainingArguments option) has no rlvr equivalent"),
        ("optim=sgd", "train.optim: Input should be 'adamw_torch_fused', 'adamw_torch' or 'adamw_torch_8bit'"),  # kept name, rlvr's choices
        ("warmup_steps=6", "set train.warmup_ratio=warmup_steps/max_steps"),
    ],
)
def test_refused_trl_names_say_what_to_set(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value) and "unknown key" not in str(e.value)


def test_every_grpo_config_field_is_an_option_translated_or_refused():
    """Walks TRL 1.16's own dataclass: no GRPOConfig name falls through to a generic 'unknown key'."""
    from transformers import TrainingArguments
    from trl import GRPOConfig

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = [f.name for f in dataclasses.fields(GRPOConfig) if f.name not in base]
    rlvr_names = set(_section_fields())
    loose = [
        n for n in own if n not in rlvr_names and n not in TRANSLATED and n not in REFUSED and n not in UNSUPPORTED
    ]
    assert not loose, f"GRPOConfig fields rlvr neither has, translates nor refuses: {loose}"
    # Every TrainingArguments field (a GRPOConfig inherits them) is named too.
    loose = [
        n
        for n in base
        if not n.startswith("_")
        and n not in rlvr_names
        and n not in TRANSLATED
        and n not in REFUSED
        and n not in TRAINING_ARGUMENTS_UNSUPPORTED
    ]
    assert not loose, f"TrainingArguments fields rlvr neither has, translates nor refuses: {loose}"
    for name in (
        "learning_rate",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "max_steps",
        "logging_steps",
        "save_steps",
        "output_dir",
        "seed",
    ):
        assert name in rlvr_names, name


def test_readme_table_names_exactly_what_is_kept():
    """Every TRL name the README's table lists works as it says: kept names are options of that section,
    translated names translate, refused names are refused."""
    text = README.read_text()
    table = text[text.index("| section | what | TRL names kept |") :]
    table = table[: table.index("\n\n")]
    fields = _section_fields()
    for row in table.splitlines()[2:]:
        section, _, kept = (c.strip() for c in row.strip("|").split("|"))
        section = section.strip("`")
        for name in re.findall(r"`([a-z_0-9]+)`", kept):
            if name in TRANSLATED:
                continue
            assert section in fields.get(name, []), f"README says {name} is kept in {section}"
    listed = text[text.index("TRL names rlvr translates") :]
    for name in list(TRANSLATED) + list(REFUSED):
        assert f"`{name}`" in listed, f"README does not list {name}"
