"""Reward functions: short forms, a module in the working directory, a file path; every mistake in one
is reported as one line before any model loads."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

import rlvr.train as train_mod
from rlvr.cli import app
from rlvr.config import ConfigError, load_config
from rlvr.reward_refs import RewardReferenceError, import_reward
from rlvr.rewards.scoring import RewardFunctionError, load_reward_functions, score
from test_smoke import smoke_overrides

runner = CliRunner()

REWARDS_PY = """
def exact(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]

def too_few(prompts, completions, **kwargs):
    return [1.0]

def text(prompts, completions, **kwargs):
    return ["1.0"] * len(completions)

def nothing(prompts, completions, **kwargs):
    return None

def no_kwargs(completions):
    return [0.0] * len(completions)

def needs_grade(prompts, completions, completion_ids, grade):
    return [0.0] * len(completions)
"""


@pytest.mark.parametrize(
    "override,specs",
    [
        ("rewards=[math]", [("math", 1.0)]),
        ("rewards=math", [("math", 1.0)]),
        ("rewards=[{name:math}]", [("math", 1.0)]),  # YAML reads `name:math` as one key
        ("rewards=[math, {name: format, weight: 0.5}]", [("math", 1.0), ("format", 0.5)]),
        ("rewards=[myrewards:exact]", [("myrewards:exact", 1.0)]),
        ("rewards=[path/to/myrewards.py:exact]", [("path/to/myrewards.py:exact", 1.0)]),
    ],
)
def test_short_forms_are_the_long_form(override, specs):
    cfg = load_config(None, [override])
    assert [(r.name, r.weight) for r in cfg.rewards] == specs


def test_unknown_builtin_reward_names_both_ways_to_give_your_own():
    with pytest.raises(ConfigError, match="'module:function' or 'path/to/file.py:function'"):
        load_config(None, ["rewards=[maths]"])


def test_a_module_in_the_working_directory_needs_no_pythonpath(tmp_path, monkeypatch):
    (tmp_path / "cwd_rewards_mod.py").write_text(REWARDS_PY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    fn = import_reward("cwd_rewards_mod:exact")
    assert fn(prompts=["1+1="], completions=["2"], answer=["2"]) == [1.0]


def test_a_file_path_reward_is_loaded_and_named_by_its_function(tmp_path):
    path = tmp_path / "sub" / "file_rewards.py"
    path.parent.mkdir()
    path.write_text(REWARDS_PY)
    (fn,) = load_reward_functions([(f"{path}:exact", 1.0, {})])
    assert fn.name == "exact" and fn.fn(prompts=["p"], completions=[" 7"], answer=["7"]) == [1.0]


@pytest.mark.parametrize(
    "ref,message",
    [
        ("no_such_rewards_module:f", "no module 'no_such_rewards_module' in the working directory"),
        ("{dir}/missing.py:f", "no file"),
        ("{dir}/r.py:exactt", "has no function 'exactt'. Did you mean 'exact'?"),
    ],
)
def test_a_reward_that_cannot_be_found_is_one_line(tmp_path, ref, message):
    (tmp_path / "r.py").write_text(REWARDS_PY)
    with pytest.raises(RewardReferenceError, match=message.replace("(", r"\(").replace("?", r"\?")):
        import_reward(ref.format(dir=tmp_path))


@pytest.fixture
def no_model_load(monkeypatch):
    """Any attempt to build the run (load the model) fails the test: the error must come first."""

    def forbidden(*a, **k):
        raise AssertionError("the model was loaded before the bad input was reported")

    monkeypatch.setattr(train_mod, "setup", forbidden)


@pytest.mark.parametrize(
    "fn,message",
    [
        ("too_few", "'too_few' returned 1 values for 2 completions"),
        ("text", "'text' returned str '1.0' for completion 0; it must return a list of floats or None"),
        ("nothing", "'nothing' returned NoneType, expected a list of 2 floats"),
        ("no_kwargs", "'no_kwargs' does not accept prompts, completion_ids"),
        ("needs_grade", "'needs_grade' requires grade, which the dataset has no column for"),
        ("missing_fn", "has no function 'missing_fn'"),
    ],
)
def test_a_broken_reward_is_one_line_before_the_model_loads(
    no_model_load, tiny_model_dir, sum_dataset, tmp_path, fn, message
):
    (tmp_path / "r.py").write_text(REWARDS_PY)
    over = [o for o in smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "run") if not o.startswith("rewards=")]
    res = runner.invoke(app, ["train", *over, f"rewards=[{tmp_path / 'r.py'}:{fn}]"])
    assert res.exit_code in (1, 2), res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("error: ") and message in lines[0], res.output
    assert not (tmp_path / "run").exists()  # nothing was created


def test_a_missing_dataset_is_reported_before_the_model_loads(no_model_load, tiny_model_dir, tmp_path):
    over = smoke_overrides(tiny_model_dir, tmp_path / "nope.jsonl", tmp_path / "run")
    res = runner.invoke(app, ["train", *over])
    assert res.exit_code == 2 and "data.path: no dataset at" in res.output and "Traceback" not in res.output


def test_rewards_broken_during_training_are_caught_by_score():
    """The same contract is enforced on every batch (a function may misbehave only on some inputs)."""
    (rf,) = load_reward_functions([("math", 1.0, {})])
    rf.fn = lambda prompts, completions, **kw: ["x"] * len(completions)
    rf.fn.__name__ = "bad"
    with pytest.raises(RewardFunctionError, match="returned str 'x'"):
        score([rf], ["p", "q"], ["a", "b"], [[1], [2]], {"answer": ["1", "2"]})


def test_rlvr_debug_shows_the_traceback(monkeypatch, tiny_model_dir, sum_dataset, tmp_path, no_model_load):
    (tmp_path / "r.py").write_text(REWARDS_PY)
    over = [o for o in smoke_overrides(tiny_model_dir, sum_dataset, tmp_path / "run") if not o.startswith("rewards=")]
    monkeypatch.setenv("RLVR_DEBUG", "1")
    res = runner.invoke(app, ["train", *over, f"rewards=[{tmp_path / 'r.py'}:too_few]"])
    assert res.exit_code != 0 and isinstance(res.exception, RewardFunctionError)


def test_a_malformed_dataset_is_one_line_before_the_model_loads(no_model_load, tiny_model_dir, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n')
    res = runner.invoke(app, ["train", *smoke_overrides(tiny_model_dir, data, tmp_path / "run")])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1, res.output
    assert lines[0].startswith("error: ") and "bad.jsonl:2: not valid JSON" in lines[0]
    assert not (tmp_path / "run").exists()


def test_a_reward_file_imports_its_neighbours_at_call_time(tmp_path):
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "grading_helpers_i19.py").write_text("def grade(c):\n    return float(c == 'ok')\n")
    (folder / "graded.py").write_text(
        "def reward(prompts, completions, **kw):\n"
        "    from grading_helpers_i19 import grade\n"
        "    return [grade(c) for c in completions]\n"
    )
    fn = import_reward(f"{folder / 'graded.py'}:reward")
    assert fn(prompts=["p", "q"], completions=["ok", "no"]) == [1.0, 0.0]
