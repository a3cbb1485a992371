"""The shipped tiny model trained under plain reward functions (tests/diagnostics/lenient_rewards.py).

Format farming is learned for real here: on 3-digit additions (the model was trained on 2-digit ones,
so it is ~never right) a reward that pays "looks like a sum" beside an exact-match reward teaches it
to write 3-4 digit wrong answers within a few steps. The monitor must fire within 20 steps of that
becoming common, as measured by re-grading the record with the strict arithmetic checker; a healthy
run under the same kind of plain function must stay silent; a greedy run must say it cannot learn.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rlvr.config import load_config
from rlvr.diagnostics.diagnose import EXIT_CANNOT_LEARN, diagnose
from rlvr.diagnostics.record import read_record
from rlvr.tasks.arithmetic import check_integer
from rlvr.train import train

COMMON = 0.5  # the hack is "common" once half the completions are formatted and wrong


def tiny_run(out: Path, *extra: str) -> dict:
    return train(
        load_config(
            None,
            [
                "model.path=tiny",
                "rollout.max_completion_length=8",
                "train.learning_rate=1e-3",
                "train.seed=3",
                f"log.output_dir={out}",
                "log.logging_steps=100",
                "log.eval_before_after=false",
                "log.report_to=[]",
                "log.progress=false",
                "log.samples_per_class=0",
                "log.save_steps=1000",
                *extra,
            ],
        )
    )


def warnings_of(out: Path) -> list[dict]:
    path = out / "warnings.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_tiny_model_learns_format_farming_and_the_monitor_fires(tmp_path):
    out = tmp_path / "farm"
    tiny_run(
        out,
        "data.task=arithmetic",
        "data.task_options={digits: 3}",
        "train.max_steps=10",
        "train.per_device_train_batch_size=128",
        "rewards=[{name: 'lenient_rewards:exact'}, {name: 'lenient_rewards:looks_like_sum', weight: 0.5}]",
    )
    header = json.loads((out / "header.json").read_text())
    assert header["reward_roles"]["roles"] == {"exact": "correctness", "looks_like_sum": "format"}
    # When did formatted-but-wrong answers become common, by the strict checker?
    _, steps = read_record(out / "rollouts.jsonl.gz")
    share = {
        step: sum(
            bool(re.fullmatch(r"\d{3,4}", r["completion"].strip()))
            and not check_integer(r["completion"], r["columns"]["answer"], r["truncated"]).correct
            for r in records
        )
        / len(records)
        for step, records in steps.items()
    }
    onset = min((s for s, v in share.items() if v >= COMMON), default=None)
    assert onset is not None, f"the policy never farmed format: {share}"
    fired = [w["step"] for w in warnings_of(out) if w["monitor"] == "format_farming"]
    assert fired and fired[0] <= onset + 20, (fired, onset, share)
    # The strict grade says nothing was correct; the format reward paid the wrong answers.
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in metrics if "shadow/accuracy" in m][-1]
    assert last["shadow/looks_like_sum/paid_wrong"] >= COMMON and last["shadow/exact/paid_wrong"] == 0.0
    assert last["timing/shadow"] > 0


def test_tiny_model_healthy_run_is_silent(tmp_path):
    out = tmp_path / "healthy"
    tiny_run(
        out, "train.max_steps=8", "train.per_device_train_batch_size=128", "rewards=[{name: 'lenient_rewards:exact'}]"
    )
    assert warnings_of(out) == []
    assert json.loads((out / "header.json").read_text())["reward_roles"]["roles"] == {"exact": "correctness"}


def test_greedy_run_says_it_cannot_learn(tmp_path, capsys):
    out = tmp_path / "greedy"
    tiny_run(out, "train.max_steps=3", "train.per_device_train_batch_size=32", "rollout.temperature=0")
    assert [w["monitor"] for w in warnings_of(out)] == ["cannot_learn"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["health/cannot_learn"] == 1.0 and metrics[-1]["health/zero_signal_steps"] == 3.0
    capsys.readouterr()
    assert diagnose(out) == EXIT_CANNOT_LEARN
    assert capsys.readouterr().out.startswith("THIS RUN CANNOT LEARN: every group had zero reward spread")
