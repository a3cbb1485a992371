"""A run killed with SIGKILL at any moment and resumed ends with exactly the weights of a run never killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.config import load_config
from rlvr.train import train
from test_smoke import smoke_overrides

STEPS = 8


def run_args(model_dir: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return smoke_overrides(
        model_dir,
        data,
        out,
        f"train.max_steps={STEPS}",
        "log.save_steps=1",
        "log.save_total_limit=2",
        "rollout.num_generations=4",
        *extra,
    )


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "final" / "model.safetensors"))


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    tmp = tmp_path_factory.mktemp("resume")
    data = tmp / "sums.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(10) for b in range(3))
    )
    t0 = time.perf_counter()
    train(load_config(None, run_args(tiny_model_dir, data, tmp / "uninterrupted")))
    step_s = (time.perf_counter() - t0) / STEPS  # an upper bound on one step's wall time
    return data, final_weights(tmp / "uninterrupted"), step_s


# (checkpoints written before the kill, delay as a fraction of a step): right after a checkpoint
# (possibly while the next one is being written), and in the middle of a later step.
@pytest.mark.parametrize("kill_after_checkpoints,delay", [(1, 0.0), (4, 0.5)])
def test_sigkill_and_resume_is_bitwise_identical(
    tiny_model_dir, uninterrupted, tmp_path, kill_after_checkpoints, delay
):
    sum_dataset, ref, step_s = uninterrupted
    out = tmp_path / "killed"
    args = run_args(tiny_model_dir, sum_dataset, out)
    # Same intra-op thread count as this process (tests/conftest.py): float reductions split across a
    # different number of threads sum in a different order, and bitwise equality is the claim here.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.getcwd()]),
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlvr.cli", "train", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ckpts = out / "checkpoints"
    deadline = time.time() + 120
    # Kill while it works: after the k-th checkpoint appeared, plus a little, possibly mid-write.
    while time.time() < deadline and proc.poll() is None:
        done = [p for p in ckpts.glob("step-*")] if ckpts.exists() else []
        if done and max(int(p.name[5:]) for p in done) >= kill_after_checkpoints:
            time.sleep(delay * step_s)
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "final").exists()

    result = train(load_config(None, args + ["resume=true"]))
    assert result["step"] == STEPS
    got = final_weights(out)
    assert ref.keys() == got.keys()
    diff = {k: (ref[k] - got[k]).abs().max().item() for k in ref if not torch.equal(ref[k], got[k])}
    assert not diff, f"resumed weights differ from the uninterrupted run: {diff}"
    # The metrics log has one line per step, not duplicated lines from the killed attempt.
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))
    # Nor are samples: each (step, class) written once, though the killed attempt wrote some of them too.
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    keys = [(s["step"], s["class"], s["group"], s["index"]) for s in samples]
    assert len(keys) == len(set(keys)) and max(k[0] for k in keys) == STEPS


def test_resume_detects_a_difference(tiny_model_dir, sum_dataset, tmp_path):
    """The comparison above can fail: a different seed gives different final weights."""
    a, b = tmp_path / "a", tmp_path / "b"
    train(load_config(None, run_args(tiny_model_dir, sum_dataset, a, "train.max_steps=2")))
    train(load_config(None, run_args(tiny_model_dir, sum_dataset, b, "train.max_steps=2", "train.seed=7")))
    wa, wb = final_weights(a), final_weights(b)
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)
