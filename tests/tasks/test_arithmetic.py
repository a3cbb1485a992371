"""The arithmetic task and its strict integer checker."""

from __future__ import annotations

import itertools

import pytest

from rlvr.rewards.base import REWARDS, Verdict
from rlvr.tasks import ArithmeticTask, get_task, is_held_out
from rlvr.tasks.arithmetic import check_integer


def test_rows_have_the_task_contract_and_correct_answers():
    task = get_task("arithmetic", digits=2, operations="+-*")
    for row in itertools.islice(task.train_rows(seed=3), 200):
        assert set(row) >= {"prompt", "answer", "data_source", "prompt_id"}
        a, op, b = row["a"], row["op"], row["b"]
        assert row["prompt"] == f"{a}{op}{b}="
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert int(row["answer"]) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert row["prompt_id"] == f"arithmetic/{row['prompt']}"


def test_train_stream_is_deterministic_in_the_seed():
    task = ArithmeticTask()
    first = [r["prompt"] for r in itertools.islice(task.train_rows(7), 50)]
    again = [r["prompt"] for r in itertools.islice(task.train_rows(7), 50)]
    other = [r["prompt"] for r in itertools.islice(task.train_rows(8), 50)]
    assert first == again and first != other


def test_eval_rows_are_disjoint_from_every_train_row():
    # 1-digit addition has only 100 problems, so a long train stream covers every training problem:
    # the held-out ones must never appear in it.
    task = get_task("arithmetic", digits=1)
    train = {r["prompt_id"] for r in itertools.islice(task.train_rows(0), 5000)}
    held_out_pool = [f"arithmetic/{a}+{b}=" for a in range(10) for b in range(10) if is_held_out(f"{a}+{b}=")]
    assert held_out_pool, "the hash split should hold out some of the 100 problems"
    assert len(train) == 100 - len(held_out_pool)
    evaluation = task.eval_rows(len(held_out_pool))
    assert {r["prompt_id"] for r in evaluation} == set(held_out_pool)
    assert not train & set(held_out_pool)


def test_eval_rows_on_the_default_task_are_distinct_held_out_and_seeded():
    task = ArithmeticTask()
    rows = task.eval_rows(300)
    prompts = [r["prompt"] for r in rows]
    assert len(set(prompts)) == 300 and all(is_held_out(p) for p in prompts)
    assert prompts == [r["prompt"] for r in task.eval_rows(300)]
    assert prompts != [r["prompt"] for r in task.eval_rows(300, seed=1)]
    train = {r["prompt"] for r in itertools.islice(task.train_rows(0), 20_000)}
    assert not train & set(prompts)


def test_asking_for_more_eval_rows_than_exist_says_how_many_there_are():
    with pytest.raises(ValueError, match="has only \\d+ held-out problems"):
        get_task("arithmetic", digits=1).eval_rows(1000)


@pytest.mark.parametrize("options", [{"digits": 0}, {"digits": 10}, {"operations": "/"}, {"operations": ""}])
def test_bad_options_are_rejected(options):
    with pytest.raises(ValueError, match="arithmetic"):
        ArithmeticTask(**options)


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(TypeError, match="digits"):
        get_task("arithmetic", digit=2)


def test_max_completion_length_fits_the_longest_answer_plus_eos():
    # 99+99=198: 3 characters, one token each, + EOS + slack 3 = 7 >= 4.
    assert ArithmeticTask(digits=2).max_completion_length >= len("198") + 1
    # 99*99 = 9801 and 10-99 = -89: the longest answer with "+-*" has 4 characters.
    assert ArithmeticTask(digits=2, operations="+-*").max_completion_length >= len("9801") + 1


@pytest.mark.parametrize(
    "completion, truncated, correct, reason",
    [
        ("82", False, True, "ok"),
        ("  82\n", False, True, "ok"),  # surrounding whitespace is not part of the answer
        ("82", True, False, "truncated"),  # cut off by max_completion_length: 0 whatever it says
        ("83", False, False, "wrong"),
        ("-82", False, False, "wrong"),
        ("82 83", False, False, "multiple_answers"),  # answer spraying
        ("82 82", False, False, "multiple_answers"),  # the same number twice is still not one integer
        ("82.5", False, False, "malformed"),
        ("82.0", False, False, "malformed"),  # strict: an integer literal only
        ("eighty-two", False, False, "no_answer"),
        ("", False, False, "no_answer"),
        ("The answer is 82", False, False, "malformed"),
        ("82</s>", False, False, "malformed"),
    ],
)
def test_checker_hand_written_cases(completion, truncated, correct, reason):
    verdict = check_integer(completion, "82", truncated=truncated)
    assert isinstance(verdict, Verdict)
    assert (verdict.correct, verdict.reason) == (correct, reason)
    assert verdict.reward == (1.0 if correct else 0.0)


def test_checker_negative_gold_and_leading_zero():
    assert check_integer("-45", "-45").correct
    assert check_integer("045", "45").correct  # the same integer; the model never writes it, but it is 45


def test_gold_that_is_not_an_integer_is_unscorable_not_zero():
    verdict = check_integer("82", "82.5")
    assert verdict.reward is None and verdict.reason == "bad_gold"


def test_registered_reward_follows_the_trl_signature_and_contract():
    reward = REWARDS.get("arithmetic")()
    assert reward.__name__ == "arithmetic" and reward.kind == "correctness" and reward.gold_column == "answer"
    completions = ["82", "82", "83", [{"role": "assistant", "content": "82"}]]
    scores = reward(["37+45="] * 4, completions, None, answer=["82"] * 4, truncated=[False, True, False, False])
    assert scores == [1.0, 0.0, 0.0, 1.0]
    verdicts = reward.verdicts(["37+45="] * 4, completions, None, answer=["82"] * 4)
    assert [v.reason for v in verdicts] == ["ok", "ok", "wrong", "ok"]  # no truncated column: none truncated


def test_reward_without_the_gold_column_names_it():
    with pytest.raises(KeyError, match="'answer'"):
        REWARDS.get("arithmetic")()(["1+1="], ["2"], None, solution=["2"])


def test_task_checkers_share_the_checker_base_and_count_their_verdicts():
    """Built on CheckerReward, so the trainer logs their reasons (rewards/<name>/timeouts among them)."""
    from rlvr.rewards.base import CheckerReward

    arithmetic, countdown = REWARDS.get("arithmetic")(), REWARDS.get("countdown")()
    assert isinstance(arithmetic, CheckerReward) and isinstance(countdown, CheckerReward)
    arithmetic(["1+1="] * 3, ["2", "3", "2"], None, answer=["2"] * 3, truncated=[False, False, True])
    assert arithmetic.stats == {"ok": 1, "wrong": 1, "truncated": 1}
    countdown(["p"], ["1+2"], None, numbers=[[1, 2]], target=[3])
    assert countdown.stats == {"ok": 1}
    with pytest.raises(ValueError, match="one value per completion"):
        arithmetic(["1+1="] * 2, ["2", "2"], None, answer=["2"])
