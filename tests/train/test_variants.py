"""Model variants through the same loop: LoRA (peft), bfloat16, gradient checkpointing."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlvr.config import load_config
from rlvr.train import train
from test_smoke import read_jsonl, smoke_overrides


def test_lora_trains_only_the_adapter_and_uses_the_base_as_reference(tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "r"
    train(
        load_config(
            None,
            smoke_overrides(
                tiny_model_dir,
                sum_dataset,
                out,
                "train.max_steps=2",
                "algo.beta=0.1",
                "model.lora.enabled=true",
                "model.lora.r=4",
                "model.lora.target_modules=[q_proj, v_proj]",
            ),
        )
    )
    from torch.distributed.checkpoint import FileSystemReader

    dcp_dir = sorted((out / "checkpoints").glob("step-*"))[-1] / "dcp"
    saved = FileSystemReader(str(dcp_dir)).read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith("model.")]
    assert weights and all("lora_" in k for k in weights), sorted(weights)[:5]  # the adapter only, no base weights
    assert (out / "final" / "adapter_config.json").exists()
    kls = [m["kl"] for m in read_jsonl(out / "metrics.jsonl")]
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[1] > 0  # reference = adapter switched off
    # The adapter-only checkpoint (tied embeddings: the frozen alias is not in it) resumes.
    resumed = train(
        load_config(
            None,
            smoke_overrides(
                tiny_model_dir,
                sum_dataset,
                out,
                "train.max_steps=3",
                "algo.beta=0.1",
                "model.lora.enabled=true",
                "model.lora.r=4",
                "model.lora.target_modules=[q_proj, v_proj]",
                "resume=true",
            ),
        )
    )
    assert resumed["step"] == 3 and [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]


def test_bfloat16_and_gradient_checkpointing(tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "r"
    result = train(
        load_config(
            None,
            smoke_overrides(
                tiny_model_dir,
                sum_dataset,
                out,
                "train.max_steps=2",
                "model.dtype=bfloat16",
                "model.gradient_checkpointing=true",
            ),
        )
    )
    assert result["step"] == 2
    final = load_file(str(out / "final" / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in final.values())
    assert all(abs(m["loss"]) < 10 and m["grad_norm"] > 0 for m in read_jsonl(out / "metrics.jsonl"))
