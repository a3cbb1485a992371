"""`rlvr eval MODEL --config CONFIG --set key=value`: a model evaluated the way a config would train it
(its task and options, prompt template, chat formatting and rewards), which is how candidate tasks
are measured before a run."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.evaluate import resolve_eval

runner = CliRunner()


def test_config_and_overrides_shape_the_rows_and_rewards():
    setup = resolve_eval(
        "tiny",
        None,
        None,
        None,
        5,
        None,
        "native",
        "default",
        ["data.prompt_template='Q: {a} {op} {b}'", "rewards=[{name: math}]"],
    )
    assert len(setup.rows) == 5 and all(r["prompt"].startswith("Q: ") for r in setup.rows)
    assert [rf.name for rf in setup.reward_fns] == ["math"]
    plain = resolve_eval("tiny", None, None, None, 5, None, "native")
    assert all(r["prompt"].endswith("=") for r in plain.rows) and [rf.name for rf in plain.reward_fns] == ["arithmetic"]


def test_cli_options_reach_the_task():
    res = runner.invoke(
        app,
        [
            "eval",
            "tiny",
            "--config",
            "default",
            "--set",
            "data.task_options={digits: 1}",
            "--n-prompts",
            "10",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output[res.output.index("{") :])["greedy"]["num_prompts"] == 10
    # One-digit addition has only 10 held-out problems: asking for more is the task's own error.
    res = runner.invoke(
        app, ["eval", "tiny", "--config", "default", "--set", "data.task_options={digits: 1}", "--n-prompts", "11"]
    )
    assert res.exit_code == 1 and "has only 10 held-out problems" in res.output  # one error line, exit 1
