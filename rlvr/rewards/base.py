"""Verdicts: what a checker decided and why (DESIGN.md §6).

Reward functions keep TRL's signature ``f(prompts, completions, completion_ids, **columns) ->
list[float | None]``. A *checker* reward function additionally exposes
``verdicts(prompts, completions, completion_ids, **columns) -> list[Verdict]``; the trainer calls
that when present, uses ``Verdict.reward`` as the float, and hands the verdicts to diagnostics.

Columns the trainer always passes besides the dataset's own: ``truncated: list[bool]`` (the
completion hit ``max_completion_length``; strict checkers score those 0) and ``trainer_state``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Verdict:
    correct: bool
    reward: float | None  # the float the reward function returns; None = not scorable
    extracted: str | None = None  # the final answer the checker read, as text
    path: str = ""  # how it was extracted: "boxed", "answer_anchor", "####", "whole", ...
    n_candidates: int = 0  # number of distinct final-answer candidates seen
    reason: str = ""  # short machine-readable reason: "ok", "wrong", "no_answer", "truncated", "timeout", "multiple_answers", ...
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The registry of built-in reward functions. Each entry is a *factory*:
# ``REWARDS.get(name)(**options) -> reward_fn``. The returned callable has TRL's signature, a
# ``__name__`` used in logs (``rewards/<name>/mean``), and optionally:
#   ``verdicts(...) -> list[Verdict]``  (checkers; the trainer prefers this over __call__)
#   ``kind``: "correctness" | "format" | "length" | "other"  (diagnostics: format farming)
#   ``gold_column``: the dataset column holding the gold answer (diagnostics: decoy re-checks)
from rlvr.registry import Registry  # noqa: E402

REWARDS: Registry = Registry("reward function")
