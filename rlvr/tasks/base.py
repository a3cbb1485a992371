"""What a task is, the TASKS registry, and the held-out split every built-in task shares.

A task is a source of prompt rows plus the reward functions that check them. Rows are plain dicts:
``prompt`` (a string, or a list of chat messages the trainer renders with the chat template),
``answer`` (the gold answer, as text), ``data_source`` and a stable ``prompt_id``. Any other key is
handed to the reward functions as a column, exactly as TRL passes dataset columns.

Held-out rows are chosen by a hash of the problem, not by position or by RNG state, so the split is
the same whichever seed, order or subset of the stream a caller draws: nothing ``train_rows`` can
produce is ever in ``eval_rows``.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from rlvr.registry import Registry

Row = dict[str, Any]

#: Share of the problem space kept for evaluation (per mille), by hash of the problem key.
HELD_OUT_PER_MILLE = 100


def problem_hash(key: str) -> int:
    """A stable 64-bit hash of ``key`` (Python's ``hash`` is salted per process, so not that)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")


def is_held_out(key: str) -> bool:
    """True when the problem identified by ``key`` belongs to the evaluation split."""
    return problem_hash(key) % 1000 < HELD_OUT_PER_MILLE


@runtime_checkable
class Task(Protocol):
    """The interface the trainer and ``rlvr eval`` rely on."""

    name: str
    #: ``(reward name in REWARDS, weight)`` pairs the task is meant to be trained with.
    default_rewards: list[tuple[str, float]]
    #: A completion budget (tokens) that fits every correct answer with room to spare.
    max_completion_length: int

    def train_rows(self, seed: int) -> Iterator[Row]:
        """An endless (or very long) stream of training rows, deterministic in ``seed``."""
        ...

    def eval_rows(self, n: int, seed: int = 0) -> list[Row]:
        """``n`` held-out rows, disjoint from anything ``train_rows`` yields."""
        ...


TaskFactory = Callable[..., Task]

TASKS: Registry[TaskFactory] = Registry("task")


def get_task(name: str, **options: Any) -> Task:
    """Build the registered task ``name`` with its options, e.g. ``get_task("arithmetic", digits=2)``.

    Unknown names fail with the list of valid ones; unknown options fail naming the valid ones.
    """
    factory = TASKS.get(name)
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as err:
        valid = ", ".join(p for p in inspect.signature(factory).parameters)
        raise TypeError(f"task {name!r}: {err}; its options are: {valid}") from None
    return factory(**options)
