"""Runs that cannot learn: no group carries a learning signal, or a reward function scores nothing.

A GRPO step learns only from groups whose rewards differ: with every group at zero spread (greedy
sampling at ``temperature=0``, a constant reward, a reward that returns ``inf`` and is dropped) every
advantage is 0 and the gradient is exactly 0, yet the run "succeeds". The same holds when a reward
function raises (or returns None / NaN / inf) on every batch. ``no_learning`` reads the step summaries
(``summarize_step``) and says, in words, why a run cannot learn; the trainer's ``Diagnostics`` warns
with it live, and ``rlvr diagnose`` / ``rlvr report`` say it at the top for a finished run.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

Summary = Mapping[str, Any]


def zero_signal(summary: Summary) -> bool:
    """Every group of the step had zero reward spread: every advantage is 0, nothing is learned."""
    return float(summary.get("groups/zero_spread") or 0.0) >= 1.0


def trailing(summaries: Sequence[Summary], condition) -> int:
    """How many of the last summaries, counting back from the newest, meet ``condition``."""
    count = 0
    for summary in reversed(summaries):
        if not condition(summary):
            break
        count += 1
    return count


def silent_for(summaries: Sequence[Summary], name: str) -> int:
    return trailing(summaries, lambda s: name in (s.get("_silent_rewards") or []))


def no_learning(summaries: Sequence[Summary], steps: int, whole_run: bool = False) -> list[str]:
    """Reasons the run cannot learn, given its step summaries (oldest first); empty when it can.

    Live (``whole_run=False``) a condition must hold on the last ``steps`` steps in a row. For a
    finished run (``whole_run=True``) it must hold on its last ``steps`` steps, or on every step of a
    run shorter than that.
    """
    if not summaries:
        return []
    need = min(steps, len(summaries)) if whole_run else steps
    reasons = []
    flat = trailing(summaries, zero_signal)
    silent = list(summaries[-1].get("_silent_rewards") or [])
    everything_silent = bool(silent) and len(silent) == int(summaries[-1].get("_n_rewards") or 0)
    if everything_silent and min(silent_for(summaries, n) for n in silent) >= need:
        reasons.append(
            f"no reward function scored anything on the last {min(silent_for(summaries, n) for n in silent)} steps "
            f"({', '.join(silent)}: each raised, or returned None, NaN or inf for every completion): fix them."
        )
    elif flat >= need:
        reasons.append(
            f"every group had zero reward spread on the last {flat} steps: every advantage is 0 and the gradient "
            "is 0, so the run learns nothing. Usual causes: temperature=0 (greedy, all completions alike), a "
            "reward that is constant or scores nothing, a task far too hard or too easy for the model."
        )
    return reasons


def silent_rewards(summaries: Sequence[Summary], steps: int) -> list[tuple[str, str]]:
    """Warnings for reward functions that scored nothing on the last ``steps`` steps while others did
    (the run still learns from the others; a reward that is None by design on some data is not an error
    unless it lasts)."""
    if not summaries:
        return []
    out = []
    for name in summaries[-1].get("_silent_rewards") or []:
        count = silent_for(summaries, name)
        if count >= steps:
            out.append(
                (
                    name,
                    f"reward function {name!r} scored nothing on the last {count} steps (it raised, or returned None, "
                    "NaN or inf for every completion): fix it, or remove it from rewards.",
                )
            )
    return out


def health_metrics(summaries: Sequence[Summary], steps: int) -> dict[str, float]:
    """``health/*`` metrics for the newest step (docs/metrics.md)."""
    last = summaries[-1]
    return {
        "health/zero_signal_steps": float(trailing(summaries, zero_signal)),
        "health/silent_rewards": float(len(last.get("_silent_rewards") or [])),
        "health/cannot_learn": float(bool(no_learning(summaries, steps))),
    }
