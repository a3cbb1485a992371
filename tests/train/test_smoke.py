"""A few real training steps on CPU with a tiny random model: the whole loop, files and metrics."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors.torch import load_file
from smoke_config import smoke_overrides  # noqa: F401  (tests/train import it from here too)

from rlvr.config import load_config
from rlvr.train import train

ALWAYS_LOGGED = [
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/clipped_ratio",
    "num_tokens",
    "loss",
    "grad_norm",
    "learning_rate",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "entropy",
    "rewards/length_bonus/mean",
    "rewards/length_bonus/std",
    "timing/rollout",
    "timing/reward",
    "timing/advantage",
    "timing/logprobs",
    "timing/update",
    "timing/sync",
    "groups/all_fail",
    "groups/mixed",
    "groups/all_pass",
    "tokens_per_second",
    "policy_lag",
    "memory/peak_rollout",
    "memory/peak_logprobs",
    "memory/peak_update",
    "memory/peak",
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_three_steps_train_and_log(tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "run"
    cfg = load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, out))
    result = train(cfg)
    assert result["step"] == 3
    # Parameters changed: compare the final weights with the initial ones.
    init = load_file(str(tiny_model_dir / "model.safetensors"))
    final = load_file(str(out / "final" / "model.safetensors"))
    changed = [k for k in init if not torch.equal(init[k], final[k])]
    assert len(changed) >= len(init) // 2, f"only {changed} changed"
    lines = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        missing = [k for k in ALWAYS_LOGGED if k not in m]
        assert not missing, f"missing metrics {missing}"
        bad = {k: m[k] for k in ALWAYS_LOGGED if not math.isfinite(m[k])}
        assert not bad, f"non-finite metrics {bad}"
        # DAPO's dynamic sampling is off by default: no group filter runs, so it has nothing to count.
        assert not [k for k in m if k.startswith("dapo/")]
    assert read_jsonl(out / "samples.jsonl"), "no samples written"
    assert (out / "config.yaml").exists() and (out / "header.json").exists()
    # Which decoder sampled is part of what made the run (decoders draw different random streams).
    assert (
        json.loads((out / "header.json").read_text())["rollout_decoder"]
        == "hf engine: transformers generate on the live policy"
    )
    assert (out / "checkpoints").is_dir()


def test_every_logged_key_is_documented(tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "run"
    train(load_config(None, smoke_overrides(tiny_model_dir, sum_dataset, out, "train.max_steps=1", "algo.beta=0.04")))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    keys = {k for m in read_jsonl(out / "metrics.jsonl") for k in m if k != "step"}
    assert "kl" in keys
    # Per-function, per-source, per-bucket and per-monitor keys are documented by pattern.
    monitors = r"(answer_spraying|format_farming|length_inflation|truncation_gaming|test_tampering)"
    patterns = [
        (r"^rewards/[^/]+/", "rewards/<name>/"),
        (r"^groups/sums/.*", "groups/<source>/{all_fail,mixed,all_pass}"),
        (r"/\d+$", "/<k>"),
        (rf"^hacking/{monitors}", "hacking/<m>"),
        (r"^shadow/(?!accuracy$|graded$)[^/]+/", "shadow/<name>/"),
    ]

    def documented_as(key: str) -> str:
        for pat, repl in patterns:
            key = re.sub(pat, repl, key)
        return key

    undocumented = sorted(k for k in keys if f"`{documented_as(k)}`" not in doc)
    assert not undocumented, f"keys missing from docs/metrics.md: {undocumented}"


def test_default_job_runs_on_the_shipped_model(tmp_path):
    """`rlvr train` with no arguments, cut to 2 steps: the shipped model, the arithmetic task, native rollouts."""
    out = tmp_path / "default"
    result = train(
        load_config(None, [f"log.output_dir={out}", "train.max_steps=2", "data.eval_size=16", "log.progress=false"])
    )
    assert result["step"] == 2
    assert 0.0 <= result["before"]["accuracy"] <= 1.0 and result["after"]["num_prompts"] == 16
    lines = read_jsonl(out / "metrics.jsonl")
    train_lines = [m for m in lines if "reward" in m]
    assert train_lines and "rewards/arithmetic/mean" in train_lines[-1]
    assert train_lines[-1]["mismatch/abs_logp_diff_mean"] < 1e-3  # native engine == trainer log-probs
