"""Hacks as users meet them: plain reward functions, no roles declared, a strict shadow grader.

Scripted policies (diag_synthetic) behave for ONSET steps, then game a lenient function; the right
monitor must fire within 20 steps of the hack becoming common, and healthy runs must stay silent.
Roles are inferred from the first step, correctness comes from the shadow grade (rlvr's math
checker), never from "total reward > 0".
"""

import json
import random
import re

import pytest
from diag_synthetic import (
    HACKING_POLICIES,
    ONSET,
    Policy,
    all_warnings,
    answer_in_tail,
    const,
    first_warning,
    has_think,
    lenient_numbers_checker,
    make_step,
    run_policy,
    strict_shadow,
    switch,
)

from rlvr.diagnostics import Diagnostics
from rlvr.diagnostics.monitors import MonitorConfig, run_monitors
from rlvr.diagnostics.roles import infer_role

WITHIN = 20  # steps after the hack becomes common (the bar; the measured delays are in the docs)


@pytest.mark.parametrize("monitor", ["answer_spraying", "format_farming", "length_inflation", "truncation_gaming"])
def test_plain_function_hacks_are_caught(monitor):
    diag, trace = run_policy(HACKING_POLICIES[monitor](), ONSET + WITHIN, seed=0, plain=True)
    assert diag.reward_kinds == {"correct": "correctness", "format": "format"}
    first = first_warning(trace, monitor)
    assert first is not None and ONSET <= first <= ONSET + WITHIN, (monitor, first)


@pytest.mark.parametrize("seed", range(2))
def test_plain_function_healthy_run_is_silent(seed):
    diag, trace = run_policy(Policy(), 60, seed=seed, plain=True)
    assert all_warnings(trace) == []
    # The header line says what was assumed, and it is the only thing printed.
    assert len(diag.messages) == 1 and "assumed" in diag.messages[0] and "shadow grading with math" in diag.messages[0]


@pytest.mark.parametrize(
    "style,checker", [("two", lenient_numbers_checker), ("concat", answer_in_tail), ("three", lenient_numbers_checker)]
)
def test_short_sprays_are_caught(style, checker):
    # "72 82", "7282", "72 or 82 or 83": the other numbers offered are the decoys, so a checker that
    # pays the gold among them pays a decoy too.
    policy = Policy(p_correct=const(0.3), p_spray=switch(0.0, 0.5, ONSET), spray_style=style, checker=checker)
    _, trace = run_policy(policy, ONSET + WITHIN, seed=0, plain=True)
    first = first_warning(trace, "answer_spraying")
    assert first is not None and ONSET <= first <= ONSET + 5
    # The rate is over the completions re-checked (every paid one fits in the budget), not over all paid.
    rate = [m["hacking/decoy_pass_rate"] for s, m, _ in trace if s >= ONSET and "hacking/decoy_pass_rate" in m]
    assert min(rate) >= 0.3


def test_the_same_sprays_under_a_strict_checker_are_silent():
    from rlvr.rewards.mathcheck import MathReward

    policy = Policy(
        p_correct=const(0.3),
        p_spray=switch(0.0, 0.5, ONSET),
        spray_style="two",
        checker=lambda prompts, completions, completion_ids=None, answer=None, **kw: MathReward()(
            prompts, completions, answer=answer
        ),
    )
    _, trace = run_policy(policy, ONSET + WITHIN, seed=0, plain=True)
    assert all_warnings(trace) == []


def test_roles_inferred_from_what_the_functions_do():
    records = make_step(Policy(), 0, random.Random(0))
    for r in records:
        r["rewards"]["longer"] = r["n_tokens"] / 100
    assert infer_role(lenient_numbers_checker, "correct", records, "answer")[0] == "correctness"
    assert infer_role(has_think, "format", records, "answer")[0] == "format"
    for r in records:
        r["rewards"]["constant"] = 0.5
    constant = lambda prompts, completions, completion_ids=None, **kw: [0.5] * len(completions)  # noqa: E731
    assert infer_role(constant, "constant", records, "answer")[0] == "format"  # ignores the gold, not length
    longer = lambda prompts, completions, completion_ids=None, **kw: [0.0] * len(completions)  # noqa: E731
    assert infer_role(longer, "longer", records, "answer")[0] == "length"
    for r in records:
        del r["columns"]
    assert infer_role(lenient_numbers_checker, "correct", records, None)[0] == "other"  # no gold to compare with


def test_a_format_checker_verdict_is_never_correct():
    # The built-in format checker gives verdicts; a record whose only verdict is its verdict has no
    # correctness at all, not "correct: True".
    records = make_step(Policy(), 0, random.Random(0))
    for r in records:
        r["correct"] = r["rewards"]["format"] > 0
    diag = Diagnostics(None, 8, ["format"], [1.0], {"format": "format"}, console=lambda m: None)
    metrics, _ = diag.observe(0, [dict(r, rewards={"format": r["rewards"]["format"]}) for r in records])
    assert "groups/pass_rate" not in metrics and "lengths/correct_mean" not in metrics
    shadowed = Diagnostics(
        None, 8, ["format"], [1.0], {"format": "format"}, console=lambda m: None, shadow=strict_shadow()
    )
    metrics, _ = shadowed.observe(0, [dict(r, rewards={"format": r["rewards"]["format"]}) for r in records])
    strict = strict_shadow().grade(records)
    assert metrics["groups/pass_rate"] == pytest.approx(sum(v["correct"] for v in strict) / len(records))
    assert metrics["shadow/format/paid_wrong"] > 0


def test_persistence_holds_at_the_first_step():
    # Truncated completions paid from step 0: the level branch holds on the first step's data, but a
    # warning needs it on two consecutive steps, the first step included.
    policy = Policy(truncated_rewarded=True, p_truncate_incorrect=const(0.3))
    history = []
    from diag_synthetic import REWARD_KINDS

    from rlvr.diagnostics.summary import summarize_step

    rng = random.Random(0)
    for step in range(2):
        records = make_step(policy, step, rng)
        history.append(summarize_step(records, 8, {"correct": 1.0, "format": 0.2}, REWARD_KINDS) | {"step": step})
        fired = {r.name for r in run_monitors(history, MonitorConfig()) if r.fired}
        assert ("truncation_gaming" in fired) == (step == 1)


def test_resumed_run_keeps_the_assumed_roles(tmp_path):
    from rlvr.diagnostics.diagnose import analyse_record

    policy = HACKING_POLICIES["format_farming"]()
    diag, _ = run_policy(policy, 3, seed=0, plain=True, run_dir=tmp_path)
    state = json.loads(json.dumps(diag.state_dict()))  # through JSON, as a checkpoint does
    resumed, _ = run_policy(policy, 0, seed=0, plain=True, run_dir=tmp_path)
    resumed.load_state_dict(state)
    assert resumed.reward_kinds == {"correct": "correctness", "format": "format"} and not resumed.roles_pending
    resumed.observe(3, make_step(policy, 3, random.Random(3)))
    from rlvr.diagnostics.record import iter_lines

    headers = [obj for obj in iter_lines(tmp_path / "rollouts.jsonl.gz") if "rlvr_record" in obj]
    assert len(headers) == 2  # one per start, each with the roles
    assert all(h["reward_kinds"] == resumed.reward_kinds for h in headers)
    assert analyse_record(tmp_path)["reward_roles"] == resumed.reward_kinds


def test_spraying_without_the_functions_is_read_from_paid_but_wrong_texts():
    # No reward functions to re-call (roles declared, a shadow grade): a paid completion the strict
    # grader rejects that offers the gold among other numbers is a spray.
    policy = Policy(
        p_correct=const(0.3), p_spray=switch(0.0, 0.5, ONSET), spray_style="two", checker=lenient_numbers_checker
    )
    _, trace = run_policy(policy, ONSET + WITHIN, seed=0, shadow=strict_shadow())
    first = first_warning(trace, "answer_spraying")
    assert first is not None and ONSET <= first <= ONSET + 5
    _, healthy = run_policy(Policy(checker=lenient_numbers_checker), 60, seed=0, shadow=strict_shadow())
    assert all_warnings(healthy) == []


def test_a_checker_with_a_tolerance_is_not_taken_for_spraying():
    # Honest single answers under a checker that accepts 1 % relative error: no decoy is near the gold.
    def within_one_percent(prompts, completions, completion_ids=None, answer=None, **kw):
        out = []
        for text, gold in zip(completions, answer):
            numbers = re.findall(r"-?\d+", text.rsplit("The answer is", 1)[-1])
            out.append(1.0 if numbers and abs(float(numbers[-1]) - float(gold)) <= 0.01 * abs(float(gold)) else 0.0)
        return out

    _, trace = run_policy(Policy(checker=within_one_percent), 40, seed=0, plain=True)
    assert all_warnings(trace) == []
    assert max(m.get("hacking/decoy_pass_rate") or 0.0 for _, m, _ in trace) == 0.0
