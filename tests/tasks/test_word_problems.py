"""The generated word-problem task: gold answers, the held-out split, options, and the checker it uses."""

from __future__ import annotations

import itertools

import pytest

from rlvr.rewards.mathcheck import check_math
from rlvr.tasks import get_task
from rlvr.tasks.base import is_held_out


def test_rows_hold_the_right_answer_for_each_operation():
    task = get_task("word_problems", max_number=12, operations="+-*")
    rows = list(itertools.islice(task.train_rows(seed=3), 300))
    assert {r["op"] for r in rows} == {"+", "-", "*"}
    for r in rows:
        a, b = r["a"], r["b"]
        assert r["answer"] == str({"+": a + b, "-": a - b, "*": a * b}[r["op"]])
        assert 1 <= b <= 12 and (r["op"] != "-" or a >= b)  # differences never go negative
        assert str(a) in r["question"] and str(b) in r["question"] and r["prompt"].endswith("\\boxed{}.")
        assert check_math(f"So the answer is \\boxed{{{r['answer']}}}.", r["answer"]).correct


def test_held_out_split_is_disjoint_and_deterministic():
    task = get_task("word_problems")
    held = task.eval_rows(40)
    assert len({r["question"] for r in held}) == 40 and all(is_held_out(r["question"]) for r in held)
    train = {r["question"] for r in itertools.islice(task.train_rows(seed=0), 2000)}
    assert not train & {r["question"] for r in held}
    assert [r["prompt"] for r in task.eval_rows(40)] == [r["prompt"] for r in held]


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="operations must be a non-empty string over"):
        get_task("word_problems", operations="/")
    with pytest.raises(ValueError, match="max_number must be an integer >= 2"):
        get_task("word_problems", max_number=1)
