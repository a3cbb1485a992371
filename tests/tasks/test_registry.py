"""get_task / TASKS: names, options, and the Task contract every built-in meets."""

from __future__ import annotations

import itertools
import json

import pytest

from rlvr.registry import UnknownNameError
from rlvr.rewards.base import REWARDS
from rlvr.tasks import TASKS, Task, get_task


def test_builtin_tasks_and_checkers_are_registered_on_import():
    assert {"arithmetic", "countdown", "file", "gsm8k"} <= set(TASKS.names())
    assert {"arithmetic", "countdown"} <= set(REWARDS.names())


def test_unknown_task_lists_the_valid_ones():
    with pytest.raises(UnknownNameError, match="valid choices: arithmetic, countdown"):
        get_task("arithmetik")


def test_unknown_option_lists_the_task_options():
    with pytest.raises(TypeError, match="task 'countdown'.*n_numbers"):
        get_task("countdown", numbers=3)


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "file"])
def test_every_builtin_meets_the_task_contract(name, tmp_path):
    options = {}
    if name == "file":
        path = tmp_path / "d.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"{i}*2=", "answer": str(2 * i)}) + "\n" for i in range(100)))
        options = {"path": str(path), "rewards": [("arithmetic", 1.0)]}
    task = get_task(name, **options)
    assert isinstance(task, Task)
    assert task.max_completion_length > 0
    for reward_name, weight in task.default_rewards:
        assert reward_name in REWARDS and weight > 0
    rows = list(itertools.islice(task.train_rows(0), 20)) + task.eval_rows(5)
    for row in rows:
        assert isinstance(row["prompt"], (str, list))
        assert isinstance(row["answer"], str) and row["answer"]
        assert isinstance(row["data_source"], str) and isinstance(row["prompt_id"], str)
