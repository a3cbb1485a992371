"""What a new user meets first: model paths, the command line, held-out data, console output, a full
disk, and figures in the docs that must agree with the code."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.preflight import check_model_ref, looks_like_path
from test_smoke import read_jsonl, smoke_overrides

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def one_error_line(res) -> str:
    """The one `error:` line of a failed command (after whatever the run printed), and no traceback."""
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    return errors[0]


@pytest.fixture
def no_network(monkeypatch):
    """Any hub request fails the test: path-like references must never reach it."""
    import huggingface_hub

    def forbidden(*a, **k):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", forbidden)


@pytest.mark.parametrize(
    "ref,message",
    [
        ("./my-modle", "no model at './my-modle': no such file or folder. Did you mean 'my-model'?"),
        ("nonexistent_dir/", "no model at 'nonexistent_dir/': no such file or folder"),
        ("notamodel", "no model at 'notamodel': the folder has no config.json"),
        ("mul.jsonl", "no model at 'mul.jsonl': it is a file, not a model (it looks like data"),
        ("missing.gguf", "no model at 'missing.gguf': no such file or folder"),
    ],
)
def test_eval_of_something_that_is_no_model_is_one_line(no_network, tmp_path, monkeypatch, ref, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-model").mkdir()
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "tokenizer.model").write_text("x")
    (tmp_path / "mul.jsonl").write_text('{"prompt": "2*3=", "answer": "6"}\n')
    res = runner.invoke(app, ["eval", ref])
    assert res.exit_code == 2
    assert message in one_error_line(res)


def test_a_hub_id_offline_is_refused_without_the_network(no_network, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not in the Hugging Face cache \\(HF_HUB_OFFLINE is set"):
        check_model_ref("nonexistent_dir")


def test_a_hub_lookup_that_fails_is_one_line(monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []

    def unreachable(self, repo_id, timeout=None, **k):
        calls.append(timeout)
        raise ConnectionError("no route")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    with pytest.raises(UserError, match="the Hugging Face hub could not be asked"):
        check_model_ref("some-org/some-model-not-cached")
    assert calls == [10]  # one request, with a timeout: no retries


def test_what_counts_as_a_path():
    for ref in ("./m", "/abs/m", "~/m", "a/b/c", "m/", "model.gguf", "data.jsonl", "..", "runs\\x"):
        assert looks_like_path(ref), ref
    for ref in ("gpt2", "Qwen/Qwen2.5-0.5B-Instruct", "nonexistent_dir"):
        assert not looks_like_path(ref), ref


def test_a_gguf_file_and_a_model_folder_pass_the_check(tmp_path, tiny_model_dir):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    check_model_ref(str(tmp_path / "m.gguf"))
    check_model_ref(str(tiny_model_dir))
    check_model_ref("tiny")


def test_train_with_a_mistyped_model_path_fails_before_anything_is_written(no_network, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-model").mkdir()
    res = runner.invoke(app, ["train", "model.path=./my-modle", "log.output_dir=out"])
    assert res.exit_code == 2 and "no model at './my-modle'" in one_error_line(res)
    assert not (tmp_path / "out").exists()


def test_version_and_short_help():
    import rlvr

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"rlvr {rlvr.__version__}"
    for argv in (["-h"], ["train", "-h"], ["eval", "-h"]):
        res = runner.invoke(app, argv)
        assert res.exit_code == 0 and "Usage:" in res.output, argv


def test_a_custom_dataset_holds_out_a_stable_slice(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(50)))
    from rlvr.tasks.stream import PromptStream, describe_held_out, eval_rows

    over = [f"data.path={data}", "rewards=[math]"]
    cfg = load_config(None, over)
    held = eval_rows(cfg)
    assert len(held) == 5  # 10% of 50 distinct prompts
    trained = {r["prompt"] for r in PromptStream(cfg).take(200)}
    assert len(trained) == 45 and not trained & {r["prompt"] for r in held}
    # The same rows whatever the seed; described in one line.
    assert [r["prompt"] for r in eval_rows(load_config(None, over + ["train.seed=7"]))] == [r["prompt"] for r in held]
    assert "held out 5 of 50 rows" in describe_held_out(cfg)
    assert eval_rows(load_config(None, over + ["data.eval_fraction=0"])) == []
    assert len(eval_rows(load_config(None, over + ["data.eval_size=2"]))) == 2


def test_correctness_is_the_checkers_verdict_and_is_said():
    from rlvr.evaluate import correctness_rule
    from rlvr.rewards.scoring import load_reward_functions

    fns = load_reward_functions([("format", 1.0, {}), ("math", 0.0, {})])
    assert correctness_rule(fns) == "correct = the 'math' checker's verdict"
    fns = load_reward_functions([("format", 1.0, {})])
    assert correctness_rule(fns).startswith("correct = reward of 'format' >= 1")


def test_a_full_disk_is_one_line_and_leaves_the_last_checkpoint_whole(
    tiny_model_dir, sum_dataset, tmp_path, monkeypatch
):
    import torch

    real = torch.save  # the checkpoint's scheduler and RNG files go through it

    def fill_up(obj, filename, *a, **k):
        if "step-000002" in str(filename):
            Path(filename).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, filename, *a, **k)

    monkeypatch.setattr(torch, "save", fill_up)
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", *smoke_overrides(tiny_model_dir, sum_dataset, out, "log.save_steps=1")])
    assert res.exit_code == 1
    line = one_error_line(res)
    assert "no space left on device while writing" in line and ".tmp-step-000002" in line and "resume=true" in line
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001"]  # no partial folder
    state = json.loads((out / "checkpoints" / "step-000001" / "state.json").read_text())
    assert state["step"] == 1
    monkeypatch.setattr(torch, "save", real)  # space freed: the run resumes from the whole checkpoint
    res = runner.invoke(
        app, ["train", *smoke_overrides(tiny_model_dir, sum_dataset, out, "log.save_steps=1", "resume=true")]
    )
    assert res.exit_code == 0, res.output
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]


def test_piped_console_lines_do_not_wrap(capsys):
    from rlvr.console import Console

    Console().samples(
        7,
        [],
        {
            "reward": 0.5,
            "completions/mean_length": 123.456,
            "groups/all_fail": 0.1,
            "groups/mixed": 0.8,
            "groups/all_pass": 0.1,
            "loss": 0.1234567,
        },
    )
    Console().info("x" * 150)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("step 7: reward 0.500") and len(out[1]) > 150


def test_transformers_progress_bars_are_silenced(tiny_model_dir, tmp_path, capfd):
    from transformers import AutoModelForCausalLM

    from rlvr.preflight import quiet_libraries

    quiet_libraries()
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "copy")
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert "Writing model shards" not in captured.err + captured.out


def test_docs_figures_agree_with_the_code():
    readme = (ROOT / "README.md").read_text()
    fixtures = ROOT / "rlvr" / "rewards" / "fixtures" / "math.jsonl"
    n_math = sum(1 for line in fixtures.read_text().splitlines() if line.strip())
    assert f"on {n_math} fixtures" in readme
    assert f"({n_math} cases)" in (ROOT / "docs" / "checkers.md").read_text()
    readme_s = re.search(r"in\s+about (\d+) seconds on 2 CPU cores", readme).group(1)
    yaml_s = re.search(r"in about (\d+) s", (ROOT / "rlvr" / "configs" / "default.yaml").read_text()).group(1)
    assert readme_s == yaml_s
