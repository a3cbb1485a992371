"""Per-prompt history: how often each prompt was all-fail / mixed / all-pass, and when it flipped.

A prompt that is always all-fail never teaches anything (every advantage is 0); one that flips
from all-fail to mixed is where learning shows first. The history is a plain JSON-able dict so the
trainer can checkpoint it with the rest of ``Diagnostics.state_dict``.
"""

from __future__ import annotations

from typing import Any

# Flips kept per prompt: enough to see when a prompt started being solved, bounded so the file
# stays O(prompts) on long runs. The flip *count* is exact.
MAX_FLIPS_KEPT = 16


def update_history(history: dict[str, dict[str, Any]], step: int, outcomes: dict[str, str]) -> int:
    """Fold one step's ``{prompt_id: outcome}`` into ``history`` (in place); returns how many flipped.

    A flip is a change of outcome class since the prompt was last seen (first sightings never flip).
    """
    flipped = 0
    for prompt_id, outcome in outcomes.items():
        entry = history.get(prompt_id)
        if entry is None:
            entry = history[prompt_id] = {
                "all_fail": 0,
                "mixed": 0,
                "all_pass": 0,
                "first_step": step,
                "last_step": step,
                "last": outcome,
                "n_flips": 0,
                "flips": [],
            }
        elif entry["last"] != outcome:
            entry["n_flips"] += 1
            entry["flips"] = (entry["flips"] + [[step, entry["last"], outcome]])[-MAX_FLIPS_KEPT:]
            flipped += 1
        entry[outcome] += 1
        entry["last"] = outcome
        entry["last_step"] = step
    return flipped


def history_table(history: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Fractions of prompts seen that were never solved, always solved, or ever flipped."""
    n = len(history)
    if n == 0:
        return {}
    return {
        "groups/prompts_seen": float(n),
        "groups/prompts_never_solved": sum(e["mixed"] == 0 and e["all_pass"] == 0 for e in history.values()) / n,
        "groups/prompts_always_solved": sum(e["mixed"] == 0 and e["all_fail"] == 0 for e in history.values()) / n,
        "groups/prompts_ever_flipped": sum(e["n_flips"] > 0 for e in history.values()) / n,
    }
