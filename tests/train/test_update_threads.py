"""train.update_threads: a fixed setting, or for `auto` on a small CPU model a choice by measurement."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlvr.builders import UpdateThreads, update_threads
from rlvr.config import load_config


def _run(chooser: UpdateThreads, seconds_by_threads: dict, steps: int, monkeypatch) -> list:
    """Drive `steps` update phases whose duration depends only on the threads they ran on (a fake clock)."""
    clock = {"t": 0.0}
    monkeypatch.setattr("rlvr.builders.time.perf_counter", lambda: clock["t"])
    seen = []
    for _ in range(steps):
        with chooser.applied():  # the log-prob phase: same threads as the step's update, not timed
            inner = torch.get_num_threads()
        with chooser.applied(measure=True):
            seen.append(chooser.current())
            assert torch.get_num_threads() == inner
            clock["t"] += seconds_by_threads[seen[-1]]
    return seen


def test_probes_both_then_keeps_the_faster_and_measures_again_each_window(monkeypatch):
    chooser = UpdateThreads([1, None])
    window, probe = UpdateThreads.WINDOW, UpdateThreads.PROBE
    seen = _run(chooser, {1: 0.05, None: 0.04}, window, monkeypatch)
    assert seen[: 2 * probe] == [1, None] * probe  # taking turns
    assert set(seen[2 * probe :]) == {None}  # two threads were faster
    # the machine got busy: two threads now slower; the next window's probes see it
    seen = _run(chooser, {1: 0.05, None: 0.5}, window, monkeypatch)
    assert seen[: 2 * probe] == [1, None] * probe
    assert set(seen[2 * probe :]) == {1}


def test_one_slow_probe_does_not_decide(monkeypatch):
    chooser = UpdateThreads([1, None])
    times = iter([0.9, 0.04, 0.03, 0.04, 0.03, 0.04])  # turns: 1, 2, 1, 2, 1, 2; the very first is slow (warm-up)
    clock = {"t": 0.0}
    monkeypatch.setattr("rlvr.builders.time.perf_counter", lambda: clock["t"])
    for _ in range(2 * UpdateThreads.PROBE):
        with chooser.applied(measure=True):
            clock["t"] += next(times)
    assert chooser.chosen == 1  # medians: 0.03 for 1 thread, 0.04 for two (a mean would pick two threads)


def test_a_load_that_comes_and_goes_hits_both_candidates_alike(monkeypatch):
    """The machine is busy for two updates in the middle of the probes, whichever ran them. Probing one candidate's
    uses after the other's, both would fall on two threads' probes and keep the slower one thread; taking turns
    gives each candidate one busy probe, which its median ignores."""
    chooser = UpdateThreads([1, None])
    clock, costs = {"t": 0.0}, {1: 0.05, None: 0.04}
    monkeypatch.setattr("rlvr.builders.time.perf_counter", lambda: clock["t"])
    for use in range(2 * UpdateThreads.PROBE):
        with chooser.applied(measure=True):
            clock["t"] += costs[chooser.current()] * (10 if use in (3, 4) else 1)
    assert chooser.chosen is None  # two threads: 0.04 quiet, the faster


def _tiny(hidden):
    cfg = LlamaConfig(vocab_size=32, hidden_size=hidden, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4)  # fmt: skip
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize(
    ("setting", "hidden", "threads", "want"),
    [
        ("auto", 64, 2, [1, None]),
        ("auto", 64, 1, [None]),
        ("auto", 512, 2, [None]),
        (3, 64, 2, [3]),
        (None, 64, 2, [None]),
    ],
)
def test_candidates(setting, hidden, threads, want):
    cfg = load_config(None, [f"train.update_threads={'null' if setting is None else setting}"])
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert update_threads(cfg, _tiny(hidden), torch.device("cpu")).candidates == want
    finally:
        torch.set_num_threads(previous)
