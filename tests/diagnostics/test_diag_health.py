"""Runs that cannot learn, non-finite rewards, and what the console, diagnose and report say about them."""

import json
import math
import random

import pytest
from diag_synthetic import REWARD_KINDS, REWARD_NAMES, Policy, make_step

from rlvr.diagnostics import Diagnostics, write_report
from rlvr.diagnostics.diagnose import EXIT_CANNOT_LEARN, EXIT_QUIET, analyse_record, diagnose
from rlvr.diagnostics.monitors import MonitorConfig

N = MonitorConfig().no_signal_steps


def new_diag(run_dir=None, messages=None):
    return Diagnostics(
        run_dir,
        8,
        REWARD_NAMES,
        [1.0, 0.2],
        REWARD_KINDS,
        console=(messages.append if messages is not None else lambda m: None),
    )


def flat(records, value):
    """Every completion scored alike: zero spread in every group (greedy sampling does this)."""
    return [dict(r, rewards={"correct": value, "format": value}, advantage=0.0) for r in records]


def test_zero_spread_for_n_steps_warns_and_diagnose_exits_non_zero(tmp_path, capsys):
    messages = []
    diag = new_diag(tmp_path, messages)
    rng = random.Random(0)
    for step in range(N + 1):
        metrics, warnings = diag.observe(step, flat(make_step(Policy(), step, rng), 0.0))
        assert metrics["health/zero_signal_steps"] == step + 1
        assert metrics["health/cannot_learn"] == float(step + 1 >= N)
        assert bool(warnings) == (step + 1 == N)  # once, when it becomes true (then once per window)
    assert any("CANNOT LEARN" in m and "zero reward spread" in m for m in messages)
    assert diagnose(tmp_path) == EXIT_CANNOT_LEARN
    assert capsys.readouterr().out.startswith("THIS RUN CANNOT LEARN")
    page = write_report(tmp_path).read_text()
    assert page.index('id="cannot-learn"') < page.index('class="cards"')  # at the top


def test_a_short_run_that_never_had_signal_is_flagged_by_diagnose(tmp_path):
    diag = new_diag(tmp_path)
    diag.observe(0, flat(make_step(Policy(), 0, random.Random(0)), 1.0))
    assert analyse_record(tmp_path)["cannot_learn"]  # one step, every group flat: nothing to learn
    healthy = tmp_path / "healthy"
    diag = new_diag(healthy)
    diag.observe(0, make_step(Policy(), 0, random.Random(0)))
    assert diagnose(healthy) == EXIT_QUIET


def test_a_reward_that_scores_nothing_on_every_batch_warns():
    # One of two rewards scores nothing: the run still learns from the other, so it is a warning
    # after a window of steps, not "cannot learn".
    messages = []
    diag = new_diag(messages=messages)
    rng = random.Random(0)
    window = MonitorConfig().window
    for step in range(window):
        records = [
            dict(r, rewards={"correct": r["rewards"]["correct"], "format": None})
            for r in make_step(Policy(), step, rng)
        ]
        metrics, warnings = diag.observe(step, records)
        assert metrics["health/silent_rewards"] == 1.0 and metrics["health/cannot_learn"] == 0.0
        assert bool(warnings) == (step == window - 1)
    assert any("'format' scored nothing on the last 10 steps" in m for m in messages)


def test_the_only_reward_failing_on_every_batch_cannot_learn(tmp_path, capsys):
    messages = []
    diag = new_diag(tmp_path, messages)
    rng = random.Random(0)
    for step in range(N):
        records = [dict(r, rewards={"correct": None, "format": None}) for r in make_step(Policy(), step, rng)]
        metrics, _ = diag.observe(step, records)
    assert metrics["health/cannot_learn"] == 1.0
    assert any("CANNOT LEARN: no reward function scored anything" in m for m in messages)
    assert diagnose(tmp_path) == EXIT_CANNOT_LEARN
    assert "no reward function scored anything" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_rewards_are_not_scorable_everywhere_alike(tmp_path, bad):
    # A reward returning inf: the live metrics, the record diagnose reads and the report agree on
    # group outcomes (inf is None, like NaN), and nothing non-finite reaches a file.
    records = make_step(Policy(), 0, random.Random(0))
    for r in records:
        r["rewards"]["format"] = bad
        r["reward"] = r["rewards"]["correct"] + 0.2 * bad
    diag = new_diag(tmp_path)
    metrics, _ = diag.observe(0, records)
    table = analyse_record(tmp_path)["table"][0]
    for key in ("all_fail", "mixed", "all_pass"):
        assert table[key] == pytest.approx(metrics[f"groups/{key}"])
    import gzip

    text = gzip.decompress((tmp_path / "rollouts.jsonl.gz").read_bytes()).decode()
    assert "NaN" not in text and "Infinity" not in text
    assert all(math.isfinite(v) for v in metrics.values())


def test_scoring_treats_inf_like_nan():
    from rlvr.rewards.scoring import RewardFn, score

    def broken(prompts, completions, completion_ids=None, **kw):
        return [math.inf, 1.0, -math.inf, math.nan]

    res = score([RewardFn("broken", broken, 1.0)], ["p"] * 4, ["a"] * 4, [[1]] * 4, {})
    assert res.nan_count == {"broken": 3}
    assert res.rewards_NK[:, 0].isnan().tolist() == [True, False, True, True]


def test_scoring_keeps_only_correctness_verdicts():
    from rlvr.rewards.formatcheck import FormatReward
    from rlvr.rewards.scoring import RewardFn, score

    res = score(
        [RewardFn("format", FormatReward(), 1.0, "format")], ["p"], ["<think>a</think><answer>1</answer>"], [[1]], {}
    )
    assert res.verdicts == [None]  # a well-formatted answer is not thereby a correct one


def test_metrics_jsonl_never_holds_nan_or_inf(tmp_path):
    from rlvr.diagnostics.sinks import MetricLogger
    from rlvr.config import load_config

    logger = MetricLogger(tmp_path, load_config(None, ["log.report_to=[]"]))
    logger.log(1, {"reward": 0.5, "rewards/f/mean": math.nan, "kl": math.inf, "loss": -math.inf})
    line = (tmp_path / "metrics.jsonl").read_text()
    assert json.loads(line) == {"step": 1, "reward": 0.5}
    assert "NaN" not in line and "Infinity" not in line
