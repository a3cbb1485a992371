import gzip
import json
import random

import pytest
from diag_synthetic import (
    HACKING_POLICIES,
    REWARD_KINDS,
    REWARD_NAMES,
    Policy,
    lenient_numbers_checker,
    make_step,
    strict_checker,
)

from rlvr.diagnostics import Diagnostics
from rlvr.diagnostics.record import RECORD_NAME, read_record
from rlvr.diagnostics.tracker import decoy_recheck


def new_diag(run_dir=None, **kwargs):
    kwargs.setdefault("console", lambda message: None)
    return Diagnostics(
        run_dir, group_size=8, reward_names=REWARD_NAMES, reward_weights=[1.0, 0.2], reward_kinds=REWARD_KINDS, **kwargs
    )


def test_observe_returns_documented_namespaces():
    diag = new_diag(reward_funcs={"correct": strict_checker})
    metrics, warnings = diag.observe(0, make_step(Policy(), 0, random.Random(0)))
    assert warnings == []
    for key in (
        "groups/all_fail",
        "groups/mixed",
        "groups/all_pass",
        "groups/nonzero_advantage",
        "groups/solve_hist/8",
        "groups/easy/mixed",
        "lengths/mean",
        "truncation/rate",
        "hacking/answer_spraying/fired",
        "hacking/warnings",
        "hacking/format_share",
    ):
        assert key in metrics, key
    assert metrics["groups/all_fail"] + metrics["groups/mixed"] + metrics["groups/all_pass"] == pytest.approx(1.0)
    assert all(isinstance(v, float) for v in metrics.values())
    json.dumps(metrics, allow_nan=False)  # strict JSON: no NaN ever reaches metrics.jsonl


class Counting:
    """A reward function that records how it was called (and can raise)."""

    gold_column = "answer"

    def __init__(self, inner, raise_with=None):
        self.inner, self.raise_with, self.calls = inner, raise_with, []

    def __call__(self, prompts, completions, completion_ids, **columns):
        self.calls.append((list(completions), dict(columns)))
        if self.raise_with:
            raise self.raise_with
        return self.inner(prompts, completions, completion_ids, **columns)


def test_decoy_recheck_budget_and_golds():
    records = make_step(HACKING_POLICIES["answer_spraying"](), 12, random.Random(0))
    fn = Counting(lenient_numbers_checker)
    passed, error = decoy_recheck(fn, records, "correct", budget=3)
    assert error is None and len(fn.calls) == 1  # one batched call per step
    completions, columns = fn.calls[0]
    # 3 completions x (the other numbers each offers, gold x 100)
    from rlvr.diagnostics.signals import decoy_golds

    expected = [d for i in passed for d in decoy_golds(records[i]["columns"]["answer"], records[i]["completion"])]
    assert len(completions) == len(expected) and columns["answer"] == expected
    first = next(i for i in passed)
    gold = int(records[first]["columns"]["answer"])
    first_decoys = decoy_golds(str(gold), records[first]["completion"])
    assert first_decoys[-1] == str(gold * 100) and str(gold) not in first_decoys
    assert len({records[i]["group"] for i in passed}) == 3  # spread over groups first
    # Only rewarded completions are re-checked.
    assert all(records[i]["rewards"]["correct"] > 0 for i in passed)


def test_decoy_recheck_never_raises():
    records = make_step(Policy(), 0, random.Random(0))
    messages = []
    diag = new_diag(
        reward_funcs={"correct": Counting(strict_checker, raise_with=RuntimeError("boom"))}, console=messages.append
    )
    for step in range(3):
        metrics, _ = diag.observe(step, records)
    assert metrics["hacking/decoy_errors"] == 3.0
    assert len([m for m in messages if "decoy re-check" in m and "boom" in m]) == 1  # said once, counted always


def test_only_correctness_rewards_are_rechecked():
    fmt = Counting(strict_checker)
    diag = new_diag(reward_funcs={"format": fmt})
    diag.observe(0, make_step(Policy(), 0, random.Random(0)))
    assert fmt.calls == []


def run_steps(diag, policy, steps, seed=0, start=0):
    rng = random.Random(seed)
    out = []
    for step in range(steps):
        records = make_step(policy, step, rng)
        if step >= start:
            out.append(diag.observe(step, records))
    return out


def test_state_dict_resume_matches_uninterrupted(tmp_path):
    policy = HACKING_POLICIES["length_inflation"]()
    uninterrupted = run_steps(new_diag(), policy, 30)

    first = new_diag(tmp_path / "a")
    rng = random.Random(0)
    all_records = [make_step(policy, step, rng) for step in range(30)]
    for step in range(12):
        first.observe(step, all_records[step])
    state = json.loads(json.dumps(first.state_dict()))  # the trainer checkpoints it as JSON
    resumed = new_diag(tmp_path / "a")
    resumed.load_state_dict(state)
    after = [resumed.observe(step, all_records[step]) for step in range(12, 30)]
    assert after == uninterrupted[12:]
    assert any(warnings for _, warnings in after)  # the comparison covers a warning


def test_load_state_dict_rejects_unknown_version():
    with pytest.raises(ValueError, match="version"):
        new_diag().load_state_dict({"version": 99})


def test_samples_choose_best_worst_truncated(tmp_path):
    policy = Policy(p_truncate_incorrect=lambda s: 0.3)
    records = make_step(policy, 3, random.Random(0))
    printed = []
    diag = new_diag(tmp_path, samples_per_class=2, console=printed.append)
    samples = diag.samples(3, records)
    classes = [s["class"] for s in samples]
    assert classes == ["best", "best", "worst", "worst", "truncated", "truncated"]
    top = max(r["reward"] for r in records)
    assert all(s["reward"] == top for s in samples[:2])
    assert all(s["reward"] == min(r["reward"] for r in records) for s in samples[2:4])
    assert all(s["truncated"] for s in samples[4:])
    assert len({(s["group"], s["index"]) for s in samples}) == 6  # no completion shown twice
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert [json.loads(line)["class"] for line in lines] == classes
    assert len(printed) == 6 and printed[0].startswith("[step 3] best")


def test_record_written_readable_and_switchable(tmp_path, monkeypatch):
    import rlvr.diagnostics.tracker as tracker

    monkeypatch.setattr(tracker, "HISTORY_EVERY_S", 1e9)  # no rewrite by the clock in this test
    diag = new_diag(tmp_path, reward_funcs={"correct": lenient_numbers_checker})
    run_steps(diag, HACKING_POLICIES["answer_spraying"](), 14)
    header, steps = read_record(tmp_path / RECORD_NAME)
    assert header["reward_kinds"] == REWARD_KINDS and header["group_size"] == 8
    assert sorted(steps) == list(range(14)) and all(len(v) == 64 for v in steps.values())
    assert any(r.get("decoy") for r in steps[13])  # decoy verdicts are kept for `rlvr diagnose`
    history = json.loads((tmp_path / "prompt_history.json").read_text())
    assert history["step"] == 0  # written at the first step, then only when HISTORY_EVERY_S has passed
    diag.close()
    history = json.loads((tmp_path / "prompt_history.json").read_text())
    assert history["step"] == 13 and set(history["prompts"]) == {f"p{i}" for i in range(32)}

    off = tmp_path / "off"
    run_steps(new_diag(off, record_rollouts=False), Policy(), 2)
    assert not (off / RECORD_NAME).exists()


def test_record_survives_crash_and_resume(tmp_path):
    policy = Policy()
    diag = new_diag(tmp_path)
    rng = random.Random(0)
    steps = [make_step(policy, s, rng) for s in range(6)]
    for s in range(6):
        diag.observe(s, steps[s])
    # Killed mid-write: a torn gzip member at the end.
    with open(tmp_path / RECORD_NAME, "ab") as f:
        f.write(gzip.compress(b'{"step": 6, "group": 0}\n{"step": 6')[:20])
    _, read = read_record(tmp_path / RECORD_NAME)
    assert sorted(read) == list(range(6))
    # Resumed from a checkpoint at step 3: steps 4 and 5 are re-run and replace the first copies.
    resumed = new_diag(tmp_path)
    for s in (4, 5):
        resumed.observe(s, steps[s][:8])
    _, read = read_record(tmp_path / RECORD_NAME)
    assert sorted(read) == list(range(6))
    assert len(read[3]) == 64 and len(read[4]) == 8 and len(read[5]) == 8


def test_record_lines_are_strict_json_whatever_a_record_holds(tmp_path):
    """Non-finite numbers become null (strict JSON has no NaN), what JSON has no type for becomes its str, an
    integer beyond 64 bits and a lone surrogate (which orjson refuses) go through the json module, and a gzip reader
    gets it all back."""
    import numpy as np

    from rlvr.diagnostics.record import append_lines, iter_lines, to_json_line

    class Opaque:
        def __str__(self):
            return "opaque"

    objs = [
        {"step": 0, "reward": float("nan"), "rewards": {"a": float("inf"), "b": -1.5}, "text": "é ✓", "ok": True},
        {"step": 0, "big": 2**70, "gone": float("-inf"), "nested": [1, {"x": None}]},
        {"step": 0, 7: "int key", "thing": Opaque(), "np": np.float32(0.25), "pair": (1, 2)},
        {"step": 0, "completion": "bad \udc80 byte", "reward": float("nan")},  # a lone surrogate: not UTF-8
    ]
    expected = [
        {"step": 0, "reward": None, "rewards": {"a": None, "b": -1.5}, "text": "é ✓", "ok": True},
        {"step": 0, "big": 2**70, "gone": None, "nested": [1, {"x": None}]},
        {"step": 0, "7": "int key", "thing": "opaque", "np": 0.25, "pair": [1, 2]},
        {"step": 0, "completion": "bad \udc80 byte", "reward": None},
    ]
    for obj, want in zip(objs, expected, strict=True):
        line = to_json_line(obj)
        assert line.endswith("\n") and line.count("\n") == 1
        assert json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}")) == want
    append_lines(tmp_path / "r.jsonl.gz", objs[:2])
    append_lines(tmp_path / "r.jsonl.gz", objs[2:])
    assert list(iter_lines(tmp_path / "r.jsonl.gz")) == expected
    assert json.loads(gzip.decompress((tmp_path / "r.jsonl.gz").read_bytes()).decode().splitlines()[2]) == expected[2]
    assert to_json_line(objs[3]).isascii()  # the surrogate escaped, as JSON allows


def test_prompt_history_counts_flips():
    diag = new_diag()
    base = make_step(Policy(), 0, random.Random(0))[:8]  # one group, prompt p0

    def as_outcome(records, correct):
        out = []
        for r in records:
            r = dict(r, correct=correct, rewards={"correct": float(correct), "format": 0.0})
            out.append(dict(r, reward=float(correct)))
        return out

    diag.observe(0, as_outcome(base, False))
    m1, _ = diag.observe(1, as_outcome(base, False))
    m2, _ = diag.observe(2, as_outcome(base, True))
    entry = diag.history["p0"]
    assert entry["all_fail"] == 2 and entry["all_pass"] == 1 and entry["n_flips"] == 1
    assert entry["flips"] == [[2, "all_fail", "all_pass"]]
    assert m1["groups/prompt_flips"] == 0.0 and m2["groups/prompt_flips"] == 1.0
    assert m2["groups/prompts_ever_flipped"] == 1.0


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(ValueError, match="weights"):
        Diagnostics(None, 8, ["a", "b"], [1.0], {})
    with pytest.raises(ValueError, match="valid roles"):
        Diagnostics(None, 8, ["a"], [1.0], {"a": "corectness"})


def test_decoy_recheck_with_the_shipped_math_checker():
    # The real strict checker: an honest answer passes only its own gold, and the call signature
    # diagnostics uses (empty completion_ids, the truncated column) is one the checker accepts.
    from rlvr.rewards.base import REWARDS

    if "math" not in REWARDS:
        pytest.skip("math checker not registered")
    math_reward = REWARDS.get("math")()
    records = [
        {
            "group": 0,
            "prompt": "q",
            "completion": "So the answer is \\boxed{18}.",
            "rewards": {"math": 1.0},
            "columns": {"answer": "18"},
            "truncated": False,
        },
        {
            "group": 1,
            "prompt": "q",
            "completion": "#### 1,234",
            "rewards": {"math": 1.0},
            "columns": {"answer": "1234"},
            "truncated": False,
        },
    ]
    assert decoy_recheck(math_reward, records, "math", budget=4) == ({0: False, 1: False}, None)
    # The same completions against a deliberately lenient checker do pass a decoy.
    sprayed = [dict(records[0], completion="The answer is 17 or 18 or 19 or 1800")]
    assert decoy_recheck(lenient_numbers_checker, [dict(sprayed[0], rewards={"correct": 1.0})], "correct", 4) == (
        {0: True},
        None,
    )


def test_samples_show_decoy_verdicts_of_the_observed_step(tmp_path):
    policy = HACKING_POLICIES["answer_spraying"]()
    records = make_step(policy, 15, random.Random(3))
    diag = new_diag(tmp_path, reward_funcs={"correct": lenient_numbers_checker}, samples_per_class=64)
    diag.observe(15, records)
    flagged = [s for s in diag.samples(15, records, echo=False) if "decoy" in s["flags"]]
    assert flagged and all(s["decoy"] is True for s in flagged)
    assert "decoy" not in records[0]  # the trainer's records are never modified
