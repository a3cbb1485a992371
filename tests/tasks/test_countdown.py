"""The countdown task and its checker, which must never execute model text."""

from __future__ import annotations

import builtins
import itertools
from fractions import Fraction

import pytest

from rlvr.rewards.base import REWARDS
from rlvr.tasks import CountdownTask, check_countdown, evaluate_equation, get_task

NUMBERS, TARGET = [3, 4, 5, 6], 18


def verdict(text, numbers=NUMBERS, target=TARGET, truncated=False):
    return check_countdown(text, numbers, target, truncated)


@pytest.mark.parametrize(
    "text",
    [
        "(6-3)*(5+4)/3*2",  # 3*9/3*2 = 18, but reuses 3 and uses 2
        "3*(4+6)-12",  # 18, but 12 was not given and 5 is unused
        "6*3",  # 18 but leaves 4 and 5 unused
        "6*3+4-4",  # reuses 4 and leaves 5 unused
        "6*3+5-5+4-4",
        "18",
        "(6*3)+(5-4)-1",  # an extra 1
    ],
)
def test_equations_that_reuse_omit_or_add_numbers_are_rejected(text):
    v = verdict(text)
    assert not v.correct and v.reason == "wrong_numbers"


@pytest.mark.parametrize(
    "text",
    [
        "6*(5-4)*3",  # hand: 6*1*3 = 18
        "(6*5-4*3)",  # hand: 30-12 = 18
        "  6 * 3 * (5 - 4)  ",
        "6*3/(5-4) = 18",  # a stated result that is right is allowed
        "<answer>(6*5)-(4*3)</answer>",
        "Let me think. <answer>6*(5-4)*3</answer>",
    ],
)
def test_correct_equations(text):
    v = verdict(text)
    assert v.correct and v.reward == 1.0 and v.reason == "ok", v


def test_exact_rational_arithmetic():
    # 6/4 = 3/2 exactly; 3/2*... with floats 0.1-style rounding could pass wrong answers or fail right ones.
    assert evaluate_equation("(6/4)*(3*4)") == (Fraction(18), [6, 4, 3, 4])
    assert verdict("(5+4/6)*3", numbers=[5, 4, 6, 3], target=17).correct  # (5 + 2/3)*3 = 17 exactly
    # 4/3*6 is exactly 8, so 4/3*6-5 = 3 for target 3, and plainly wrong for target 4.
    assert verdict("4/3*6-5", target=3).correct
    assert verdict("4/3*6-5", target=4).reason == "wrong"


def test_wrong_value_and_wrong_stated_result():
    assert verdict("6*5-4-3").reason == "wrong"  # 23
    assert verdict("6*(5-4)*3 = 19").reason == "wrong_stated_result"
    assert verdict("6*(5-4)*3 = x").reason == "wrong_stated_result"


@pytest.mark.parametrize(
    "text, reason",
    [
        ("__import__('os').system('echo pwned')", "forbidden_syntax"),
        ("(3).__class__", "forbidden_syntax"),
        ("(3).real*6*(5-4)", "forbidden_syntax"),  # attribute access
        ("abs(3)*6*(5-4)", "forbidden_syntax"),  # a call
        ("(lambda: 18)()", "forbidden_syntax"),
        ("[3,4,5,6][0]*6", "forbidden_syntax"),
        ("9**9**9**9", "forbidden_syntax"),  # a huge exponent must never be computed
        ("3**4+5+6", "forbidden_syntax"),
        ("-3+4*5+6-5", "forbidden_syntax"),  # unary minus
        ("3.0*6*(5-4)", "forbidden_syntax"),  # floats
        ("True*18", "forbidden_syntax"),  # bool is an int subclass
        ("'18'", "forbidden_syntax"),
        ("x", "forbidden_syntax"),
        ("3 if 4 else 5", "forbidden_syntax"),
        ("(3 := 4)", "unparsable"),
        ("3*6 == 18", "forbidden_syntax"),
        ("import os", "unparsable"),
        ("3+", "unparsable"),
        ("6/(5-5)*3*4", "division_by_zero"),
        ("+".join(["1"] * 150), "too_long"),
    ],
)
def test_smuggled_code_and_malformed_input_are_rejected_without_running(text, reason, monkeypatch):
    # If the checker ever reached eval/exec/__import__, these sentinels would fail the test.
    def forbidden(*args, **kwargs):
        raise AssertionError("the checker executed model text")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    v = verdict(text)
    assert not v.correct and v.reward == 0.0
    assert v.reason == reason, v


def test_empty_truncated_and_multiple_answers():
    assert verdict("").reason == "no_answer"
    assert verdict("   ").reason == "no_answer"
    assert verdict("6*(5-4)*3", truncated=True).reason == "truncated"
    assert verdict("<answer>6*3</answer> <answer>6*(5-4)*3</answer>").reason == "multiple_answers"


def test_registered_reward_reads_numbers_and_target_columns():
    reward = REWARDS.get("countdown")()
    assert reward.__name__ == "countdown" and reward.kind == "correctness"
    scores = reward(
        ["p", "p"], ["6*(5-4)*3", "6*3"], None, numbers=[NUMBERS, NUMBERS], target=[18, 18], truncated=[False, False]
    )
    assert scores == [1.0, 0.0]


def test_generated_rows_are_solvable_by_their_own_answer():
    task = get_task("countdown")
    for row in itertools.islice(task.train_rows(1), 100):
        assert len(row["numbers"]) == 4 and 0 < row["target"] <= 1000
        assert check_countdown(row["answer"], row["numbers"], row["target"]).correct, row
        assert str(row["target"]) in row["prompt"]


def test_countdown_eval_is_disjoint_from_train():
    task = CountdownTask(n_numbers=3, max_number=9, max_target=50)
    evaluation = {r["prompt_id"] for r in task.eval_rows(20)}
    assert len(evaluation) == 20
    train = {r["prompt_id"] for r in itertools.islice(task.train_rows(0), 3000)}
    assert not evaluation & train
