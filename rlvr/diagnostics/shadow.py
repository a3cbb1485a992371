"""Shadow grading: every completion graded a second time by a strict checker, beside the run's own rewards.

A lenient reward is how hacking starts. When a row has a gold answer and rlvr has a strict checker for
it, re-grading every completion with that checker measures what each reward function paid to answers
the strict grader rejects ("paid but wrong"). That one number caught every learned hack (format
farming, spraying, truncation, length) in an outside test where share-based monitors missed two of
four. The strict grade is also what the monitors call "correct": never "total reward > 0".

Which strict checker (``shadow_checker``):

- the run already rewards with one of rlvr's own correctness checkers (math, arithmetic, countdown,
  json_schema, code): its verdicts *are* the strict grade, nothing is re-run (cost 0);
- a built-in task (``data.task``): that task's checker (arithmetic, countdown);
- a dataset with a gold column (``answer``, ``solution``, ``gold``, ``target``, ``ground_truth``): the
  math checker, or the JSON checker when the gold is a JSON object or list.

Cost: checker time only, never generation (``timing/shadow``, seconds per step; docs/diagnostics.md has
the measured figures). A shadow checker that raises is reported once and skipped; it never stops a run.
"""

from __future__ import annotations

import inspect
import math
import time
from typing import Any, Callable, Mapping, Sequence

# Columns that commonly hold the gold answer, tried when a checker does not name its own.
GOLD_COLUMNS = ("answer", "solution", "gold", "target", "ground_truth")
# A completion in which the strict checker finds no answer at all ("So we get 42" has no final-answer
# marker for the math checker) is left ungraded, to the run's own correctness reward: a strict grader
# that cannot read a run's answer format must not turn a learning run into an all-fail one.
UNGRADED_REASONS = ("no_answer", "no_gold", "bad_gold")
# Built-in correctness checkers whose verdicts are already strict (held to it by `rlvr audit`).
STRICT_BUILTINS = ("rlvr.rewards.", "rlvr.tasks.")


def is_strict_builtin(fn: Any) -> bool:
    """One of rlvr's own correctness checkers (verdicts, strict extraction, audited)."""
    module = getattr(type(fn), "__module__", "") or ""
    role = getattr(fn, "role", None) or getattr(fn, "kind", None)
    return role == "correctness" and hasattr(fn, "verdicts") and module.startswith(STRICT_BUILTINS)


def call_reward(fn: Callable[..., Any], prompts: list, completions: list, columns: Mapping[str, list]) -> list:
    """Call a TRL-signature reward function the way the trainer does: every column it can take."""
    try:
        params = inspect.signature(fn).parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        params, takes_kwargs = {}, True
    kwargs = {k: v for k, v in columns.items() if takes_kwargs or k in params}
    return list(fn(prompts=prompts, completions=completions, completion_ids=[[] for _ in completions], **kwargs))


def takes_column(fn: Callable[..., Any], column: str) -> bool:
    """Whether a call passes ``column`` to ``fn`` at all (a function without it cannot depend on it)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return column in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def gold_column_of(columns: Mapping[str, Any], preferred: str | None = None) -> str | None:
    if preferred and preferred in columns:
        return preferred
    return next((c for c in GOLD_COLUMNS if columns.get(c) is not None), None)


class ShadowGrader:
    """A strict checker and the gold column it reads; ``grade(records)`` -> per-record verdict dicts."""

    def __init__(self, checker: Any, gold_column: str | None, source: str):
        self.checker = checker
        self.gold_column = gold_column
        self.source = source  # what picked it, for the run header: "task arithmetic", "gold column 'answer'"
        self.name = getattr(checker, "__name__", type(checker).__name__)

    def grade(self, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any] | None]:
        """Verdicts (``{"correct", "reason", "extracted"}``) in record order; ``None`` where a row has no gold
        or the checker found no answer to judge (``UNGRADED_REASONS``)."""
        idx = [
            i
            for i, r in enumerate(records)
            if self.gold_column is None or (r.get("columns") or {}).get(self.gold_column) is not None
        ]
        out: list[dict[str, Any] | None] = [None] * len(records)
        if not idx:
            return out
        names = sorted({k for i in idx for k in (records[i].get("columns") or {})})
        columns = {k: [(records[i].get("columns") or {}).get(k) for i in idx] for k in names}
        columns["truncated"] = [bool(records[i].get("truncated")) for i in idx]
        verdicts = self.checker.verdicts(
            [records[i].get("prompt") for i in idx],
            [str(records[i].get("completion") or "") for i in idx],
            None,
            **columns,
        )
        for i, v in zip(idx, verdicts):
            if v.reward is not None and v.reason not in UNGRADED_REASONS:
                out[i] = {"correct": bool(v.correct), "reason": v.reason, "extracted": v.extracted}
        return out


def shadow_checker(
    task: str | None,
    task_options: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    reward_funcs: Mapping[str, Any],
) -> ShadowGrader | None:
    """The strict checker for this run's data, or ``None`` when the run's own checker is already strict
    (its verdicts are the grade) or there is no gold to grade against (see the module docstring)."""
    from rlvr.rewards.base import REWARDS

    if any(is_strict_builtin(fn) for fn in reward_funcs.values()):
        return None
    if task is not None:
        from rlvr.tasks import get_task

        name = get_task(task, **task_options).default_rewards[0][0]
        checker = REWARDS.get(name)()
        return ShadowGrader(checker, getattr(checker, "gold_column", None), f"task {task}")
    sample = next(iter(rows), None)
    column = gold_column_of(sample or {})
    if column is None:
        return None
    if isinstance(sample[column], (dict, list)):
        return ShadowGrader(
            REWARDS.get("json_schema")(schema={}, gold_column=column), column, f"JSON gold column {column!r}"
        )
    return ShadowGrader(REWARDS.get("math")(gold_column=column), column, f"gold column {column!r}")


def shadow_grader_for(
    cfg: Any, rows: Sequence[Mapping[str, Any]], reward_funcs: Mapping[str, Any]
) -> ShadowGrader | None:
    """``shadow_checker`` for a run config (``log.shadow_grading`` off -> None)."""
    if not getattr(cfg.log, "shadow_grading", True):
        return None
    task = cfg.data.task if cfg.data.path is None else None
    return shadow_checker(task, cfg.data.task_options, rows, reward_funcs)


def finite_or_none(value: Any) -> float | None:
    """A reward as a float, or ``None`` for None, NaN and ±inf (all "not scorable")."""
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def paid_but_wrong(records: Sequence[Mapping[str, Any]], reward_names: Sequence[str]) -> dict[str, float]:
    """Per reward function, over the step's shadow-graded completions (``correct`` from the strict grade):

    ``shadow/<name>/paid_wrong``: share of strict-wrong completions this function paid (> 0);
    ``shadow/<name>/paid_wrong_share``: share of what it paid in total (positive values) that went to
    strict-wrong completions. A strict checker scores 0 on both; a format or length reward pays wrong
    answers by design, a correctness reward that does is lenient.
    """
    graded = [r for r in records if r.get("shadow") is not None]
    out: dict[str, float] = {}
    if not graded:
        return out
    wrong = [r for r in graded if not r["shadow"]["correct"]]
    out["shadow/accuracy"] = 1.0 - len(wrong) / len(graded)
    out["shadow/graded"] = len(graded) / len(records)
    for name in reward_names:
        values = [(finite_or_none((r.get("rewards") or {}).get(name)) or 0.0, r["shadow"]["correct"]) for r in graded]
        paid_total = sum(v for v, _ in values if v > 0)
        paid_wrong = sum(v for v, ok in values if v > 0 and not ok)
        if wrong:
            out[f"shadow/{name}/paid_wrong"] = sum(v > 0 for v, ok in values if not ok) / len(wrong)
        if paid_total > 0:
            out[f"shadow/{name}/paid_wrong_share"] = paid_wrong / paid_total
    return out


def timed_grade(grader: ShadowGrader, records: Sequence[Mapping[str, Any]]) -> tuple[list, float, str | None]:
    """(verdicts, seconds, error): a diagnostic must never stop training, so a raising checker is reported."""
    start = time.perf_counter()
    try:
        verdicts = grader.grade(records)
    except Exception as exc:  # noqa: BLE001 - reported once by the caller, never raised
        return [None] * len(records), time.perf_counter() - start, f"{type(exc).__name__}: {exc}"
    return verdicts, time.perf_counter() - start, None
