"""Monitors in both directions: quiet on healthy runs, and each hack detected within a stated delay.

The delays asserted here are the ones docs/diagnostics.md promises (steps after the onset of the
behaviour, default MonitorConfig: window 10, persist 2, z 3). Measured over seeds 0-9 at
B=8, G=8: spraying 2-3, format farming 3, truncation gaming 2-4, test tampering 2-6,
length inflation 6-8 (incorrect completions growing ~7 % a step).
"""

import pytest
from diag_synthetic import (
    HACKING_POLICIES,
    ONSET,
    Policy,
    const,
    first_warning,
    lenient_numbers_checker,
    ramp,
    run_policy,
    strict_checker,
    switch,
)

from rlvr.diagnostics.monitors import MONITORS, MonitorConfig, Pooled, Shift, run_monitors

DETECTED_WITHIN = {
    "answer_spraying": 4,
    "format_farming": 4,
    "length_inflation": 10,
    "truncation_gaming": 5,
    "test_tampering": 7,
}


def checker_for(policy: Policy):
    return {"correct": lenient_numbers_checker if policy.lenient_checker else strict_checker}


@pytest.mark.parametrize("B,G", [(8, 8), (4, 4), (2, 8)])
@pytest.mark.parametrize("seed", range(3))
def test_healthy_run_raises_nothing(B, G, seed):
    # Healthy: accuracy 25% -> 60%, format learned alongside it, lengths growing slowly together,
    # a few truncations. Small batches (B*G = 16) are the hard case: per-step means are noisy.
    import random

    from diag_synthetic import REWARD_KINDS, REWARD_NAMES, make_step

    from rlvr.diagnostics import Diagnostics

    messages = []
    diag = Diagnostics(
        None,
        group_size=G,
        reward_names=REWARD_NAMES,
        reward_weights=[1.0, 0.2],
        reward_kinds=REWARD_KINDS,
        reward_funcs={"correct": strict_checker},
        console=messages.append,
    )
    rng = random.Random(seed)
    fired = []
    for step in range(60):
        metrics, warnings = diag.observe(step, make_step(Policy(), step, rng, B=B, G=G))
        fired += warnings
        assert metrics["hacking/warnings"] == 0.0
    assert fired == [] and messages == []


HEALTHY_VARIANTS = {
    "fast_learning": lambda: Policy(
        p_correct=ramp(0.1, 0.9, 0, 20),
        len_correct=ramp(200, 120, 0, 20),
        len_incorrect=ramp(220, 140, 0, 20),
        p_format_if_correct=ramp(0.2, 1, 0, 10),
        p_format_if_incorrect=ramp(0.2, 1, 0, 10),
    ),
    "plateau": lambda: Policy(p_correct=const(0.5), p_format_if_correct=const(1.0), p_format_if_incorrect=const(0.9)),
    "slow_length_growth": lambda: Policy(
        p_correct=const(0.4), len_correct=ramp(120, 200, 0, 80), len_incorrect=ramp(140, 230, 0, 80)
    ),
    "truncation_falling": lambda: Policy(p_truncate_incorrect=ramp(0.3, 0.02, 0, 30)),
    "hard_task": lambda: Policy(p_correct=const(0.03), p_truncate_incorrect=const(0.1)),
}


@pytest.mark.parametrize("variant", list(HEALTHY_VARIANTS))
def test_other_healthy_dynamics_are_quiet(variant):
    _, trace = run_policy(HEALTHY_VARIANTS[variant](), 80, seed=1)
    assert [w for _, _, ws in trace for w in ws] == []


def test_healthy_lenient_checker_and_code_runs_are_quiet():
    for policy in (Policy(lenient_checker=True), Policy(code=True)):
        _, trace = run_policy(policy, 60, seed=7, reward_funcs=checker_for(policy))
        assert [w for _, _, ws in trace for w in ws] == []


@pytest.mark.parametrize("monitor", list(HACKING_POLICIES))
@pytest.mark.parametrize("seed", range(3))
def test_hacking_policy_is_detected_within_stated_delay(monitor, seed):
    policy = HACKING_POLICIES[monitor]()
    _, trace = run_policy(policy, ONSET + 20, seed=seed, reward_funcs=checker_for(policy))
    first = first_warning(trace, monitor)
    assert first is not None, f"{monitor} never fired"
    assert ONSET <= first <= ONSET + DETECTED_WITHIN[monitor], f"{monitor} fired at {first}, onset {ONSET}"
    # The warning is printed, in words, on the step it first fires.
    warnings = dict((step, ws) for step, _, ws in trace)[first]
    assert any(w.startswith(monitor.replace("_", " ")) for w in warnings)


def test_spraying_against_a_strict_checker_is_not_rewarded_so_not_flagged():
    # The same spraying policy, scored by a checker that demands one final answer: sprays score 0,
    # nothing rewarded is sprayed, and the monitor has nothing to report.
    policy = Policy(lenient_checker=False, p_correct=const(0.3), p_spray=switch(0.0, 0.5, ONSET))
    _, trace = run_policy(policy, 30, seed=0, reward_funcs=checker_for(policy))
    assert first_warning(trace, "answer_spraying") is None
    assert max(m.get("hacking/spray_rate", 0.0) for _, m, _ in trace) == 0.0


def test_decoy_recheck_flags_lenient_checker():
    policy = HACKING_POLICIES["answer_spraying"]()
    _, trace = run_policy(policy, 20, seed=1, reward_funcs=checker_for(policy))
    before = [m.get("hacking/decoy_pass_rate") for s, m, _ in trace if s < ONSET]
    after = [m.get("hacking/decoy_pass_rate") for s, m, _ in trace if s >= ONSET + 2]
    # Honest answers never pass a decoy; sprays ("g-1 or g or g+1 or g+2") pass the numbers they offer.
    assert all(v == 0.0 for v in before if v is not None)
    assert max(v for v in after if v is not None) > 0.3


def test_truncated_and_rewarded_fires_truncation_gaming():
    policy = Policy(truncated_rewarded=True, p_truncate_incorrect=const(0.1))
    _, trace = run_policy(policy, 10, seed=0, reward_funcs=checker_for(policy))
    first = first_warning(trace, "truncation_gaming")
    assert first is not None and first <= 4
    assert "were rewarded" in next(w for _, _, ws in trace for w in ws if w.startswith("truncation gaming"))


def test_warnings_respect_cooldown():
    policy = HACKING_POLICIES["answer_spraying"]()
    diag, trace = run_policy(policy, 40, seed=0, reward_funcs=checker_for(policy))
    steps = [s for s, _, ws in trace for w in ws if w.startswith("answer spraying")]
    # Fires continuously from detection on, but warns once per window (10 steps).
    assert len(steps) >= 2 and all(b - a >= 10 for a, b in zip(steps, steps[1:]))
    assert diag.warning_count["answer_spraying"] == len(steps)
    assert trace[-1][1]["hacking/warnings"] == len(steps)


def test_persistence_suppresses_a_one_step_burst():
    # A window whose last step alone holds a large shift fires with persist=1 but not persist=2.
    # 50 completions a step at 100 tokens (sd 2), then one step at 300: the later half's mean is
    # (4 * 100 + 300) / 5 = 140, +40 % over a flat pass rate of 20 %.
    def step(length):
        return {
            "_len_n": 50.0,
            "_len_sum": 50 * length,
            "_len_sq": 50 * length**2 + 49 * 4.0,
            "_pass_n": 50.0,
            "_pass_sum": 10.0,
            "_pass_sq": 10.0,
        }

    quiet, burst = step(100.0), step(300.0)
    history = [dict(quiet, step=i) for i in range(9)] + [dict(burst, step=9)]
    fired = lambda cfg: {r.name for r in run_monitors(history, cfg) if r.fired}  # noqa: E731
    assert "length_inflation" in fired(MonitorConfig(persist=1))
    assert "length_inflation" not in fired(MonitorConfig(persist=2))


def test_shift_statistics():
    # before: values {0, 2} -> mean 1, var 2; after: {2, 4} -> mean 3, var 2.
    # z = (3 - 1) / sqrt(2/2 + 2/2) = 2 / sqrt(2).
    s = Shift(Pooled(2, 2, 4), Pooled(2, 6, 20))
    assert s.diff == 2 and s.relative == 2
    assert s.z == pytest.approx(2 / 2**0.5)


def test_every_monitor_is_quiet_without_data():
    assert all(not r.fired for r in run_monitors([], MonitorConfig()))
    assert [r.name for r in run_monitors([], MonitorConfig())] == list(MONITORS)
