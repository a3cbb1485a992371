"""Verdicts: what a checker decided and why (docs/checkers.md).

Reward functions keep TRL's signature ``f(prompts, completions, completion_ids, **columns) ->
list[float | None]``. A *checker* reward function additionally exposes
``verdicts(prompts, completions, completion_ids, **columns) -> list[Verdict]``; the trainer calls
that when present, uses ``Verdict.reward`` as the float, and hands the verdicts to diagnostics.

The column the trainer always passes besides the dataset's own: ``truncated: list[bool]`` (the
completion hit ``max_completion_length``; strict checkers score those 0). ``rlvr.rewards.scoring``
loads reward functions from the config and calls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Verdict:
    correct: bool
    reward: float | None  # the float the reward function returns; None = not scorable
    extracted: str | None = None  # the final answer the checker read, as text
    path: str = ""  # how it was extracted: "boxed", "answer_anchor", "####", "whole", ...
    n_candidates: int = 0  # number of distinct final-answer candidates seen
    reason: str = (
        ""  # short machine-readable reason: "ok", "wrong", "no_answer", "truncated", "timeout", "multiple_answers", ...
    )
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # Every field by name; `extra` and its dict and list values copied (what checkers put there is flat,
        # JSON-able data). dataclasses.asdict deep-copies recursively, which was the largest cost of the shipped
        # task's log phase (256 verdicts a step).
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["extra"] = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                        for k, v in self.extra.items()}
        return out


# The registry of built-in reward functions. Each entry is a *factory*:
# ``REWARDS.get(name)(**options) -> reward_fn``. The returned callable has TRL's signature, a
# ``__name__`` used in logs (``rewards/<name>/mean``), and optionally:
#   ``verdicts(...) -> list[Verdict]``  (checkers; the trainer prefers this over __call__)
#   ``kind``: "correctness" | "format" | "length" | "other"  (diagnostics: format farming)
#   ``gold_column``: the dataset column holding the gold answer (diagnostics: decoy re-checks)
from rlvr.registry import Registry  # noqa: E402

REWARDS: Registry = Registry("reward function")


# ---------------------------------------------------------------------------------------------
# Helpers shared by the built-in checkers
# ---------------------------------------------------------------------------------------------

import threading
import time
from collections import Counter
from collections.abc import Sequence


def completion_text(completion: Any) -> str:
    """The text of one completion in either of TRL's formats.

    Standard format: a plain string. Conversational format: a list of messages
    ``[{"role": "assistant", "content": ...}]`` where ``content`` is a string or a list of parts
    ``[{"type": "text", "text": ...}]``. Only assistant turns are read (a tool or user turn is not
    the model's answer); several assistant turns are joined with newlines.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        parts: list[str] = []
        for message in completion:
            if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
                continue
            content = message.get("content", "")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"
                )
        return "\n".join(parts)
    raise TypeError(
        f"a completion must be a string or a list of chat messages, got {type(completion).__name__}; "
        "pass TRL's standard format (str) or conversational format ([{'role': 'assistant', 'content': ...}])"
    )


def row_columns(columns: dict[str, Any], n: int, i: int) -> dict[str, Any]:
    """Column values for completion ``i`` of ``n``: list columns of length n are indexed, others
    (scalars) are passed through unchanged."""
    return {k: (v[i] if isinstance(v, (list, tuple)) and len(v) == n else v) for k, v in columns.items()}


class CheckerReward:
    """A reward function built on verdicts: TRL's signature outside, ``Verdict`` inside.

    Subclasses implement ``check(text, row) -> Verdict``; this class adds the TRL call, the
    ``verdicts`` method the trainer prefers, timing, and ``stats`` (a Counter of verdict reasons
    since construction, so that timeouts and errors are counted, not silently scored 0).
    """

    kind: str = "correctness"
    gold_column: str | None = None
    #: False when the gold column is only shown to diagnostics and ``check`` never reads it.
    gold_required: bool = True
    #: Columns ``check`` reads from its row: each must be present with one value per completion.
    required_columns: tuple[str, ...] = ()

    def __init__(self, name: str):
        self.__name__ = name
        self.stats: Counter[str] = Counter()
        self._stats_lock = threading.Lock()  # checkers may run rows on a thread pool

    def check(self, text: str, row: dict[str, Any]) -> Verdict:  # pragma: no cover - abstract
        raise NotImplementedError

    def _checked(self, completion: Any, row: dict[str, Any]) -> Verdict:
        start = time.perf_counter()
        verdict = self.check(completion_text(completion), row)
        verdict.seconds = time.perf_counter() - start
        with self._stats_lock:
            self.stats[verdict.reason] += 1
        return verdict

    def verdicts(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[Verdict]:
        n = len(completions)
        if self.gold_required and self.gold_column is not None and self.gold_column not in columns:
            raise KeyError(
                f"reward {self.__name__!r} reads the gold answer from column {self.gold_column!r}, which the "
                f"dataset does not have (columns: {', '.join(sorted(columns)) or 'none'}); rename the column or "
                f"pass gold_column=<name> to the reward"
            )
        for name in self.required_columns:
            if columns.get(name) is None:
                raise KeyError(
                    f"reward {self.__name__!r} needs the column {name!r}, but the call only has "
                    f"{sorted(columns)}; keep that column in the dataset"
                )
            if not isinstance(columns[name], (list, tuple)) or len(columns[name]) != n:
                raise ValueError(
                    f"reward {self.__name__!r}: column {name!r} must hold one value per completion "
                    f"({n}), got {columns[name]!r:.80}"
                )
        return [self._checked(c, row_columns(columns, n, i)) for i, c in enumerate(completions)]

    def __call__(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        return [v.reward for v in self.verdicts(prompts, completions, completion_ids, **columns)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.__name__!r}, kind={self.kind!r})"
