"""Which strict checker shadow-grades a run, and what it reports per reward function."""

import pytest

from rlvr.config import load_config
from rlvr.diagnostics.shadow import ShadowGrader, paid_but_wrong, shadow_checker, shadow_grader_for
from rlvr.rewards.base import REWARDS


def plain(prompts, completions, completion_ids=None, **kw):
    return [1.0] * len(completions)


def test_the_strict_checker_follows_the_data():
    assert shadow_checker("arithmetic", {}, [], {"f": plain}).name == "arithmetic"
    assert shadow_checker("countdown", {}, [], {"f": plain}).name == "countdown"
    math = shadow_checker(None, {}, [{"prompt": "q", "solution": "\\frac{1}{2}"}], {"f": plain})
    assert math.name == "math" and math.gold_column == "solution"
    json_gold = shadow_checker(None, {}, [{"prompt": "q", "answer": {"a": 1}}], {"f": plain})
    assert json_gold.name == "json_schema" and json_gold.gold_column == "answer"
    assert shadow_checker(None, {}, [{"prompt": "q"}], {"f": plain}) is None  # nothing to grade against
    # The run already rewards with rlvr's strict checker: its verdicts are the grade, nothing re-runs.
    assert shadow_checker("arithmetic", {}, [], {"arithmetic": REWARDS.get("arithmetic")()}) is None


def test_the_config_switch_turns_it_off():
    on = load_config(None, ["rewards=[{name: 'lenient_rewards:exact'}]"])
    off = load_config(None, ["rewards=[{name: 'lenient_rewards:exact'}]", "log.shadow_grading=false"])
    assert shadow_grader_for(on, [], {"exact": plain}).name == "arithmetic"
    assert shadow_grader_for(off, [], {"exact": plain}) is None


def record(completion, gold, rewards, truncated=False):
    return {
        "prompt": "2+2=",
        "completion": completion,
        "truncated": truncated,
        "columns": {"answer": gold},
        "rewards": rewards,
    }


def test_grades_and_paid_but_wrong():
    grader = ShadowGrader(REWARDS.get("arithmetic")(), "answer", "task arithmetic")
    records = [
        record("4", "4", {"loose": 1.0, "fmt": 1.0}),
        record("5", "4", {"loose": 1.0, "fmt": 1.0}),
        record("4 5", "4", {"loose": 1.0, "fmt": 0.0}),
        record("4", "4", {"loose": 1.0, "fmt": 0.0}, True),
        record("4", None, {"loose": 1.0, "fmt": 1.0}),
        record("four", "4", {"loose": 1.0, "fmt": 1.0}),
    ]
    verdicts = grader.grade(records)
    # No gold, or no answer the strict checker can read: ungraded (the run's own correctness decides).
    assert [v and v["correct"] for v in verdicts] == [True, False, False, False, None, None]
    for r, v in zip(records, verdicts):
        r["shadow"] = v
    m = paid_but_wrong(records, ["loose", "fmt"])
    # 4 graded, 1 correct; "loose" paid all 3 wrong ones (3 of its 4 paid points), "fmt" 1 of 3 wrong.
    assert m["shadow/accuracy"] == 0.25 and m["shadow/graded"] == pytest.approx(4 / 6)
    assert m["shadow/loose/paid_wrong"] == 1.0 and m["shadow/loose/paid_wrong_share"] == 0.75
    assert m["shadow/fmt/paid_wrong"] == pytest.approx(1 / 3) and m["shadow/fmt/paid_wrong_share"] == 0.5
