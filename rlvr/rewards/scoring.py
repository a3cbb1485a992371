"""Turning completions into a rewards matrix: load reward functions, call them safely, check them.

A reward function has TRL's signature ``f(prompts, completions, completion_ids, **columns) ->
list[float | None]``. It is named in the config by a built-in name (``REWARDS`` registry) or a
dotted import path ``package.module:function``. This module:

- calls each function once per generation batch, with every dataset column plus ``truncated``;
- prefers ``f.verdicts(...)`` when the function is a checker, so diagnostics see why, not just what;
- reports a wrong-length return or a non-number with the function's name (a bug in the function:
  the run stops with a clear error);
- counts a *raising* function and scores that batch's completions ``None`` for it, so one flaky
  function never kills a long run (docs/architecture.md); ``None`` means "not scorable" and is ignored
  by the advantage computation, exactly as in TRL;
- turns NaN and ±inf into ``None`` with a counted warning (they would poison the group mean).
"""

from __future__ import annotations

import inspect
import math
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rlvr.errors import UserError
from rlvr.rewards.base import REWARDS, Verdict


class RewardFunctionError(UserError, RuntimeError):
    """A reward function broke its contract (wrong length, wrong type)."""


def _ensure_registered() -> None:
    # Importing these packages registers their reward functions.
    import rlvr.rewards  # noqa: F401
    import rlvr.tasks  # noqa: F401


def reward_names() -> list[str]:
    _ensure_registered()
    return REWARDS.names()


@dataclass
class RewardFn:
    name: str
    fn: Callable
    weight: float
    kind: str = "other"

    @property
    def gold_column(self) -> str | None:
        return getattr(self.fn, "gold_column", None)


def _import_dotted(path: str) -> Callable:
    from rlvr.reward_refs import import_reward

    return import_reward(path)


def reward_specs(cfg) -> list[tuple[str, float, dict[str, Any]]]:
    """The run's (name, weight, options): `rewards:` from the config, else the built-in task's defaults.
    The overlong penalty is about the generation limit, so it defaults to the rollout's own."""
    specs = [(s.name, s.weight, dict(s.options)) for s in cfg.rewards]
    if not specs:
        from rlvr.tasks import get_task

        specs = [(n, w, {}) for n, w in get_task(cfg.data.task, **cfg.data.task_options).default_rewards]
    return [
        (n, w, {"max_completion_length": cfg.rollout.max_completion_length, **o} if n == "overlong" else o)
        for n, w, o in specs
    ]


def load_reward_functions(specs: list[tuple[str, float, dict[str, Any]]]) -> list[RewardFn]:
    """[(name, weight, options)] -> RewardFn list. Unknown names list the valid ones."""
    _ensure_registered()
    out: list[RewardFn] = []
    seen: set[str] = set()
    for name, weight, options in specs:
        if ":" in name:
            fn = _import_dotted(name)
            if options:
                fn = fn(**options)  # a factory: 'pkg.mod:make_reward' with options
            label = getattr(fn, "__name__", name.split(":")[-1])
        else:
            fn = REWARDS.get(name)(**options)
            label = name
        base, i = label, 2
        while label in seen:  # the same function twice (different options) gets a suffix
            label, i = f"{base}_{i}", i + 1
        seen.add(label)
        out.append(RewardFn(label, fn, float(weight), getattr(fn, "kind", "other")))
    return out


@dataclass
class ScoreResult:
    rewards_NK: torch.Tensor  # float64, NaN = None (not scorable)
    verdicts: list[Verdict | None]  # verdict of the first checker function, per completion
    errors: dict[str, int] = field(default_factory=dict)  # function name -> raised batches
    nan_count: dict[str, int] = field(default_factory=dict)
    error_messages: list[str] = field(default_factory=list)


def _call(fn: Callable, prompts, completions, completion_ids, columns) -> Any:
    try:
        sig = inspect.signature(fn)
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    except (TypeError, ValueError):
        takes_kwargs = True
    kwargs = columns if takes_kwargs else {k: v for k, v in columns.items() if k in sig.parameters}
    return fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)


def score(
    reward_fns: list[RewardFn],
    prompts: list,
    completions: list,
    completion_ids: list[list[int]],
    columns: dict[str, list],
) -> ScoreResult:
    """Run every reward function on the N completions; returns rewards_NK (NaN for None)."""
    n, k = len(completions), len(reward_fns)
    rewards_NK = torch.full((n, k), float("nan"), dtype=torch.float64)
    verdicts: list[Verdict | None] = [None] * n
    result = ScoreResult(rewards_NK, verdicts)
    have_verdicts = False
    for j, rf in enumerate(reward_fns):
        try:
            if hasattr(rf.fn, "verdicts"):
                vs = _call(rf.fn.verdicts, prompts, completions, completion_ids, columns)
                _check_length(rf.name, vs, n)
                values = [v.reward for v in vs]
                if not have_verdicts and rf.kind == "correctness":  # a format checker's verdict is not "correct"
                    result.verdicts = list(vs)
                    have_verdicts = True
            else:
                values = _call(rf.fn, prompts, completions, completion_ids, columns)
                _check_length(rf.name, values, n)
        except RewardFunctionError:
            raise
        except Exception as e:  # noqa: BLE001 - a raising reward function is counted, not fatal
            result.errors[rf.name] = result.errors.get(rf.name, 0) + 1
            result.error_messages.append(
                f"reward function {rf.name!r} raised {type(e).__name__}: {e}; its rewards for this batch "
                f"are None (ignored).\n{traceback.format_exc(limit=3)}"
            )
            continue
        for i, v in enumerate(values):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                try:
                    if isinstance(v, (str, bytes)):  # "1.0" is a bug in the function, not a number
                        raise TypeError
                    v = float(v)  # numpy / torch scalars
                except (TypeError, ValueError):
                    raise RewardFunctionError(
                        f"reward function {rf.name!r} returned {type(v).__name__} {v!r} for completion {i}; "
                        "it must return a list of floats or None"
                    ) from None
            if not math.isfinite(v):  # inf would poison the group mean like NaN: not scorable
                result.nan_count[rf.name] = result.nan_count.get(rf.name, 0) + 1
                continue
            rewards_NK[i, j] = float(v)
    return result


def _check_length(name: str, values: Any, n: int) -> None:
    if not isinstance(values, (list, tuple)):
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(values).__name__}, expected a list of {n} floats "
            "(one per completion)"
        )
    if len(values) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} values for {n} completions; it must return "
            "exactly one float (or None) per completion, in order"
        )
