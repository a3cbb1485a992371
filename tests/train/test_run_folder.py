"""Run folders: a folder that holds a run is never appended to, a busy one is refused, a resume records
what changed and refuses what cannot work, and every refusal is one `error:` line that loses nothing."""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.runfolder import LOCK_NAME
from test_smoke import read_jsonl, smoke_overrides

runner = CliRunner()


def args(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", *smoke_overrides(model, data, out, "train.max_steps=2", "log.save_steps=1", *extra)]


def error_line(res) -> str:
    """The one line a refused command prints; fails when there is a traceback or more than one line."""
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert "Traceback" not in res.output, res.output
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, res.output
    return errors[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """A 2-step run, finished (checkpoints at steps 1 and 2, final/); tests work on copies."""
    tmp = tmp_path_factory.mktemp("finished")
    data = tmp / "sums.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(10) for b in range(3))
    )
    res = runner.invoke(app, args(tiny_model_dir, data, tmp / "run"))
    assert res.exit_code == 0, res.output
    return data, tmp / "run"


@pytest.fixture
def run_copy(finished, tmp_path) -> tuple[Path, Path]:
    data, run = finished
    shutil.copytree(run, tmp_path / "run")
    return data, tmp_path / "run"


def test_a_second_run_into_a_finished_folder_is_refused_and_changes_nothing(tiny_model_dir, run_copy):
    data, run = run_copy
    before = snapshot(run)
    res = runner.invoke(app, args(tiny_model_dir, data, run))
    assert res.exit_code == 2
    line = error_line(res)
    assert "already holds a run" in line and "resume=true" in line and "overwrite=true" in line
    assert f"log.output_dir={run}-2" in line  # a free folder to use instead
    assert snapshot(run) == before


def test_overwrite_starts_again_with_one_copy_of_each_step(tiny_model_dir, run_copy):
    data, run = run_copy
    (run / "metrics.jsonl").write_text('{"step": 99, "marker": 1}\n')
    res = runner.invoke(app, args(tiny_model_dir, data, run, "overwrite=true"))
    assert res.exit_code == 0, res.output
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001", "step-000002"]


def test_overwrite_refuses_a_folder_rlvr_did_not_write(tiny_model_dir, sum_dataset, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("my own file\n")
    res = runner.invoke(app, args(tiny_model_dir, sum_dataset, folder, "overwrite=true"))
    assert res.exit_code == 2 and "not clearly a run folder" in error_line(res)
    assert (folder / "metrics.jsonl").read_text() == "my own file\n"


def test_a_folder_in_use_is_refused_and_a_dead_owner_does_not_block(tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    with open(out / LOCK_NAME, "a+") as held:  # another run's lock: a second open file description
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 4242 on elsewhere")
        held.flush()
        res = runner.invoke(app, args(tiny_model_dir, sum_dataset, out))
        assert res.exit_code == 2
        line = error_line(res)
        assert "in use by a run that is still training" in line and "pid 4242 on elsewhere" in line
        assert not (out / "metrics.jsonl").exists()
    # The owner is gone (its lock released, its pid left in the file): the folder is free again.
    res = runner.invoke(app, args(tiny_model_dir, sum_dataset, out))
    assert res.exit_code == 0, res.output
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]


def test_resume_records_the_changed_config_and_continues(tiny_model_dir, run_copy):
    data, run = run_copy
    # A new group size works on the saved state (optimizer, data position, DAPO and monitor histories).
    res = runner.invoke(
        app,
        args(
            tiny_model_dir,
            data,
            run,
            "resume=true",
            "train.max_steps=3",
            "train.learning_rate=0.005",
            "rollout.num_generations=2",
        ),
    )
    assert res.exit_code == 0, res.output
    history = read_jsonl(run / "config-history.jsonl")
    assert len(history) == 1 and history[0]["step"] == 2
    assert history[0]["changed"] == {
        "rollout.num_generations": [4, 2],
        "train.learning_rate": [0.01, 0.005],
        "train.max_steps": [2, 3],
    }
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]


def test_resume_with_max_steps_reached_says_so_and_leaves_final(tiny_model_dir, run_copy):
    data, run = run_copy
    before = snapshot(run)
    res = runner.invoke(app, args(tiny_model_dir, data, run, "resume=true"))  # max_steps 2 = the checkpoint's
    assert res.exit_code == 2
    line = error_line(res)
    assert "nothing to train" in line and "at step 2" in line and "train.max_steps" in line
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "change,named", [("model.lora.enabled=true", "model.lora.enabled=false"), ("model.path=tiny", "model.path")]
)
def test_resume_refuses_a_change_that_cannot_work(tiny_model_dir, run_copy, change, named):
    data, run = run_copy
    before = snapshot(run)
    res = runner.invoke(app, args(tiny_model_dir, data, run, "resume=true", "train.max_steps=4", change))
    assert res.exit_code == 2
    assert named in error_line(res)
    assert snapshot(run) == before


def test_a_lora_run_resumed_without_lora_names_the_fix(tiny_model_dir, sum_dataset, tmp_path):
    run = tmp_path / "lora"
    res = runner.invoke(
        app, args(tiny_model_dir, sum_dataset, run, "model.lora.enabled=true", "model.lora.r=2", "train.max_steps=1")
    )
    assert res.exit_code == 0, res.output
    (run / "config.yaml").unlink()  # without the folder's config, the checkpoint itself is read
    res = runner.invoke(app, args(tiny_model_dir, sum_dataset, run, "resume=true", "train.max_steps=2"))
    assert res.exit_code == 2
    assert "holds a LoRA adapter: resume with model.lora.enabled=true" in error_line(res)


def test_resume_and_overwrite_together_are_a_config_error():
    res = runner.invoke(app, ["train", "resume=true", "overwrite=true"])
    assert res.exit_code == 2 and "resume and overwrite exclude each other" in res.output


def test_a_log_line_cut_short_does_not_stop_a_resume(tmp_path):
    from rlvr.runfolder import truncate_jsonl

    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo')  # a full disk mid-line
    truncate_jsonl(log, 2)
    assert [m["step"] for m in read_jsonl(log)] == [1, 2]
    truncate_jsonl(log, 1)
    assert log.read_text() == '{"step": 1, "loss": 0.5}\n'
