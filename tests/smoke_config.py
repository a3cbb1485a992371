"""The overrides of a smoke run: a tiny model, a few steps, small batches, no evaluation, no sinks. Every
test that trains for real starts from these and adds what it is about (later key=value pairs win)."""

from __future__ import annotations

from pathlib import Path


def smoke_overrides(model_dir: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"model.path={model_dir}",
        f"data.path={data}",
        "rewards=[{name: 'smoke_rewards:length_bonus'}]",
        "rollout.backend=hf",
        "rollout.max_completion_length=6",
        "rollout.num_generations=4",
        "train.per_device_train_batch_size=16",
        "train.max_steps=3",
        "train.learning_rate=1e-2",
        f"log.output_dir={out}",
        "log.logging_steps=1",
        "log.eval_before_after=false",
        "log.report_to=[]",
        "log.progress=false",
        *extra,
    ]
