import pytest

from rlvr.diagnostics.summary import group_outcome, loggable, pearson, summarize_step

WEIGHTS = {"correct": 1.0, "format": 0.5}
KINDS = {"correct": "correctness", "format": "format"}


def rec(
    group, index, correct, n_tokens, fmt, truncated=False, source=None, advantage=0.0, completion="The answer is 1"
):
    rewards = {"correct": 1.0 if correct else 0.0, "format": fmt}
    return {
        "step": 0,
        "prompt_id": f"p{group}",
        "group": group,
        "index": index,
        "prompt": "q",
        "completion": completion,
        "n_tokens": n_tokens,
        "finish_reason": "length" if truncated else "stop",
        "truncated": truncated,
        "rewards": rewards,
        "reward": rewards["correct"] + 0.5 * fmt,
        "advantage": advantage,
        "correct": correct,
        "verdict": None,
        "data_source": source,
        "columns": {"answer": "1"},
    }


@pytest.fixture
def three_groups():
    # g0: all fail, two of four truncated, formatted. g1: mixed, unformatted. g2: all pass, formatted.
    g0 = [rec(0, i, False, n, 1.0, truncated=i >= 2, source="gsm8k") for i, n in enumerate([10, 20, 30, 40])]
    g1 = [
        rec(1, i, ok, n, 0.0, source="gsm8k", advantage=0.87 if ok else -0.87)
        for i, (ok, n) in enumerate([(True, 5), (False, 15), (True, 5), (False, 15)])
    ]
    g2 = [rec(2, i, True, 8, 1.0, source="math") for i in range(4)]
    return g0 + g1 + g2


def test_group_outcomes_and_histogram(three_groups):
    s = summarize_step(three_groups, 4, WEIGHTS, KINDS)
    assert s["groups/all_fail"] == s["groups/mixed"] == s["groups/all_pass"] == pytest.approx(1 / 3)
    # Totals: g0 all 0.5 and g2 all 1.5 have zero spread; g1 alternates 1.0/0.0.
    assert s["groups/zero_spread"] == pytest.approx(2 / 3)
    assert s["groups/nonzero_advantage"] == pytest.approx(4 / 12)
    # Solve counts 0, 2 and 4 of 4.
    assert [s[f"groups/solve_hist/{k}"] for k in range(5)] == pytest.approx([1 / 3, 0, 1 / 3, 0, 1 / 3])
    assert s["groups/gsm8k/all_fail"] == 0.5 and s["groups/gsm8k/mixed"] == 0.5 and s["groups/gsm8k/all_pass"] == 0
    assert s["groups/math/all_pass"] == 1.0
    assert s["groups/pass_rate"] == 0.5


def test_lengths_and_truncation(three_groups):
    s = summarize_step(three_groups, 4, WEIGHTS, KINDS)
    # Correct: 5, 5, 8, 8, 8, 8 -> 42 / 6 = 7. Incorrect: 10, 20, 30, 40, 15, 15 -> 130 / 6.
    assert s["lengths/correct_mean"] == pytest.approx(7.0)
    assert s["lengths/incorrect_mean"] == pytest.approx(130 / 6)
    assert s["lengths/incorrect_to_correct"] == pytest.approx(130 / 6 / 7)
    assert s["truncation/rate"] == pytest.approx(2 / 12)
    assert s["truncation/rate_all_fail"] == pytest.approx(2 / 4)
    # The truncated completions got 0.5 from the format term but did not pass the checker.
    assert s["truncation/reward_mean"] == pytest.approx(0.5)
    assert s["truncation/rewarded_rate"] == 0.0


def test_format_share(three_groups):
    s = summarize_step(three_groups, 4, WEIGHTS, KINDS)
    # correctness: 1.0 x mean 6/12 = 0.5; format: 0.5 x mean 8/12 = 1/3; share = (1/3) / (0.5 + 1/3) = 0.4.
    assert s["hacking/format_share"] == pytest.approx(0.4)
    assert s["hacking/spray_rate"] is None  # no completion was decoy re-checked
    assert s["hacking/tamper_rate"] is None  # no programs


def test_non_binary_rewards_fall_back_to_spread():
    def r(reward):
        return {"group": 0, "reward": reward, "correct": None}

    assert group_outcome([r(0.2), r(0.2)]) == "all_pass"
    assert group_outcome([r(0.0), r(0.0)]) == "all_fail"
    assert group_outcome([r(0.1), r(0.3)]) == "mixed"
    # With verdicts, an unscorable completion (None) counts as a fail.
    assert group_outcome([{"correct": True}, {"correct": None}]) == "mixed"


def test_loggable_drops_internal_and_undefined(three_groups):
    logged = loggable(summarize_step(three_groups, 4, WEIGHTS, KINDS))
    assert "hacking/tamper_rate" not in logged
    assert not any(k.startswith("_") for k in logged)
    assert all(isinstance(v, float) for v in logged.values())


def test_empty_step_is_a_clear_error():
    with pytest.raises(ValueError, match="no records"):
        summarize_step([], 4, WEIGHTS, KINDS)


def test_pearson():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 1, 1], [1, 2, 3]) is None
