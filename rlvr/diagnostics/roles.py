"""Reward roles: what each reward function is for — ``correctness``, ``format``, ``length`` or ``other``.

The monitors need to know which reward says "right" and which says "looks right". A role comes from,
in order: the config (``rewards: [{name: ..., role: format}]``), the function's own ``role`` (or
``kind``) attribute (every built-in declares one), or inference from the first step's completions:

- **does its score follow the gold?** The function is called on the first step's completions with
  the real gold and with the gold set to what each completion itself answered (its stripped text,
  then the last number in it). A correctness function scores the two differently; a format or
  length function returns the same scores. A function whose signature does not take the gold column cannot depend on it.
- **gold-independent**: ``length`` when its scores track completion length (|Pearson| ≥ 0.8 with the
  token count) and take more than two values, else ``format`` (it judges the text's shape).
- **gold-dependent**: ``correctness``; the shadow grade then says how often it pays wrong answers.
- no gold column at all: ``other`` (nothing to compare with).

What was assumed is printed in the run header and written to ``header.json`` (``reward_roles``) and
the rollout record's header, so ``rlvr diagnose`` reads the same roles.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping, Sequence

from rlvr.diagnostics.shadow import call_reward, finite_or_none, gold_column_of, takes_column

ROLES = ("correctness", "format", "length", "other")
# Completions probed per inference call (up to four calls, once per run).
PROBE_SIZE = 64
LENGTH_CORR = 0.8
_LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?!.*\d)", re.DOTALL)


def declared_role(fn: Any, configured: str | None = None) -> str | None:
    """The config's role, else the function's own ``role``/``kind`` attribute, else ``None`` (infer it)."""
    role = configured or getattr(fn, "role", None) or getattr(fn, "kind", None)
    if role is not None and role not in ROLES:
        raise ValueError(f"unknown reward role {role!r}; valid roles: {', '.join(ROLES)}.")
    return role


def declared_roles(specs: Sequence[Any], reward_fns: Sequence[Any]) -> dict[str, str | None]:
    """``{reward name: role or None}`` for the run's reward functions (``specs`` = the config's
    ``rewards`` entries in the same order, or empty for a task's default rewards)."""
    configured = [getattr(s, "role", None) for s in specs] if len(specs) == len(reward_fns) else []
    configured += [None] * (len(reward_fns) - len(configured))
    return {rf.name: declared_role(rf.fn, role) for rf, role in zip(reward_fns, configured)}


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    if sxx <= 1e-12 or syy <= 1e-12:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.sqrt(sxx * syy)


def _self_answers(text: str) -> list[str]:
    stripped = text.strip()
    last = _LAST_NUMBER.search(stripped)
    return [stripped] + ([last.group()] if last and last.group() != stripped else [])


def infer_role(
    fn: Callable[..., Any], name: str, records: Sequence[Mapping[str, Any]], gold_column: str | None
) -> tuple[str, str]:
    """(role, reason in words) for a function with no declared role, from one step's records."""
    records = list(records)[:PROBE_SIZE]
    if not records:
        return "other", "no completions to look at"
    column = gold_column_of(records[0].get("columns") or {}, gold_column)
    depends: bool | None = False
    if column is not None and takes_column(fn, column):
        names = sorted({k for r in records for k in (r.get("columns") or {})})
        try:
            for probe in (0, 1):
                keep = [i for i, r in enumerate(records) if probe < len(_self_answers(str(r.get("completion") or "")))]
                if not keep:
                    continue
                prompts = [records[i].get("prompt") for i in keep]
                texts = [str(records[i].get("completion") or "") for i in keep]
                columns = {k: [(records[i].get("columns") or {}).get(k) for i in keep] for k in names}
                columns["truncated"] = [bool(records[i].get("truncated")) for i in keep]
                # The same call twice, once with the gold replaced by what each completion answered:
                # only a function that reads the gold can tell the two apart.
                before = call_reward(fn, prompts, texts, columns)
                columns[column] = [_self_answers(t)[probe] for t in texts]
                after = call_reward(fn, prompts, texts, columns)
                if [finite_or_none(v) for v in before] != [finite_or_none(v) for v in after]:
                    depends = True
                    break
        except Exception:  # noqa: BLE001 - a function that cannot take the probe is left undecided
            depends = None
    if column is None:
        return "other", "no gold column to compare it with"
    if depends is None:
        return "other", "it raised when called with a different gold answer"
    if depends:
        return "correctness", f"its score follows the gold column {column!r}"
    values = [(finite_or_none((r.get("rewards") or {}).get(name)), float(r.get("n_tokens") or 0)) for r in records]
    values = [(v, n) for v, n in values if v is not None]
    corr = _pearson([v for v, _ in values], [n for _, n in values])
    # A pass/fail shape check correlates with length too when the shape has a length: a length
    # reward takes more than two values.
    if corr is not None and abs(corr) >= LENGTH_CORR and len({v for v, _ in values}) > 2:
        return "length", f"it ignores the gold answer and tracks completion length (r = {corr:.2f})"
    return "format", "it ignores the gold answer (it judges the text, not the answer)"


def describe_roles(roles: Mapping[str, str], reasons: Mapping[str, str]) -> str:
    """One header line: ``exact=correctness (declared), shape=format (assumed: it ignores the gold ...)``."""
    parts = []
    for name, role in roles.items():
        why = reasons.get(name)
        parts.append(f"{name}={role} ({'assumed: ' + why if why else 'declared'})")
    return "reward roles: " + "; ".join(parts)
