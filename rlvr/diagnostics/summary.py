"""One step's completions -> one flat summary: group outcomes, lengths, truncation, hacking signals.

``summarize_step`` is a pure function of the step's records (see docs/rollout-record.md for their
fields). Its output is the per-step half of the ``groups/*``, ``lengths/*``, ``truncation/*`` and
``hacking/*`` metrics, plus counts under keys starting with ``_`` that the monitors pool over a
window and that are never logged. The live trainer (``Diagnostics.observe``) and ``rlvr diagnose``
(reading a finished record) both go through it, so the two cannot disagree.

Undefined values (the mean length of correct completions in a step with none) are ``None`` here and
are left out of the logged metrics rather than written as NaN, which strict JSON readers reject.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

from rlvr.diagnostics.signals import is_multi_answer, looks_like_code, tamper_signals

OUTCOMES = ("all_fail", "mixed", "all_pass")
# Rewards within this of each other count as equal: a group whose spread is below it gives every
# completion a zero advantage (TRL adds 1e-4 to the std, so such spreads teach nothing).
ZERO_SPREAD = 1e-6
KINDS = ("correctness", "format", "length", "other")


def split_groups(records: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Records of one step -> their groups, in first-seen order (records arrive group-contiguous)."""
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault(record.get("group"), []).append(record)
    return list(groups.values())


def is_rewarded(record: Mapping[str, Any]) -> bool:
    """Passed the checker, or (no checker verdicts) got a positive total reward."""
    correct = record.get("correct")
    if correct is not None:
        return bool(correct)
    return (record.get("reward") or 0.0) > 0.0


def is_truncated(record: Mapping[str, Any]) -> bool:
    """Hit ``max_completion_length`` (the trainer's flag, or a ``"length"`` finish reason)."""
    return bool(record.get("truncated")) or record.get("finish_reason") == "length"


def group_outcome(group: Sequence[Mapping[str, Any]]) -> str:
    """``"all_fail"``, ``"mixed"`` or ``"all_pass"`` for one group of G completions.

    With checker verdicts (``correct`` not None for some completion; None counts as a fail): by the
    number that passed. Without (non-binary rewards): ``"mixed"`` when the rewards differ, otherwise
    the equal-reward group is ``"all_pass"`` if that reward is positive and ``"all_fail"`` if not.
    """
    verdicts = [r.get("correct") for r in group]
    if any(v is not None for v in verdicts):
        n_pass = sum(bool(v) for v in verdicts)
        return "all_fail" if n_pass == 0 else "all_pass" if n_pass == len(group) else "mixed"
    rewards = [float(r.get("reward") or 0.0) for r in group]
    if max(rewards) - min(rewards) > ZERO_SPREAD:
        return "mixed"
    return "all_pass" if rewards[0] > 0 else "all_fail"


def source_key(source: str) -> str:
    """A data source name made safe for a metric key (``groups/<source>/all_fail``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(source)).strip("_") or "unknown"


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _rate(hits: int, total: int) -> float | None:
    return hits / total if total else None


def moments(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """``{_<prefix>_n, _<prefix>_sum, _<prefix>_sq}``: what pooling a mean and its variance over steps needs."""
    return {
        f"_{prefix}_n": float(len(values)),
        f"_{prefix}_sum": float(sum(values)),
        f"_{prefix}_sq": float(sum(v * v for v in values)),
    }


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation, ``None`` when either side is constant (no information, not zero)."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 1e-12 or syy <= 1e-12:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / math.sqrt(sxx * syy)


def summarize_step(
    records: Sequence[Mapping[str, Any]],
    group_size: int,
    reward_weights: Mapping[str, float],
    reward_kinds: Mapping[str, str],
    spray_tail_numbers: int = 4,
) -> dict[str, Any]:
    """Summarise one step's N = B·G completion records (see module docstring for the key rules).

    ``group_size`` fixes the solve-rate histogram's bins (``groups/solve_hist/<k>`` = fraction of
    groups with exactly k of G passing); groups of another size (dynamic sampling refills) are
    binned by ``round(k · G / size)``.
    """
    if not records:
        raise ValueError(
            "summarize_step got no records for this step; pass the step's completion records "
            "(one dict per completion, see docs/rollout-record.md)."
        )
    out: dict[str, Any] = {}
    groups = split_groups(records)
    n = len(records)

    outcomes = [group_outcome(g) for g in groups]
    out["groups/count"] = float(len(groups))
    for name in OUTCOMES:
        out[f"groups/{name}"] = outcomes.count(name) / len(groups)
    spreads = [
        max(float(r.get("reward") or 0.0) for r in g) - min(float(r.get("reward") or 0.0) for r in g) for g in groups
    ]
    out["groups/zero_spread"] = sum(s <= ZERO_SPREAD for s in spreads) / len(groups)
    out["groups/nonzero_advantage"] = sum(abs(float(r.get("advantage") or 0.0)) > 1e-8 for r in records) / n
    hist = [0] * (group_size + 1)
    for g in groups:
        k = sum(is_rewarded(r) for r in g)
        hist[min(group_size, round(k * group_size / len(g)))] += 1
    for k, count in enumerate(hist):
        out[f"groups/solve_hist/{k}"] = count / len(groups)

    by_source: dict[str, list[str]] = defaultdict(list)
    for g, outcome in zip(groups, outcomes):
        source = g[0].get("data_source")
        if source is not None:
            by_source[source_key(source)].append(outcome)
    for source, source_outcomes in sorted(by_source.items()):
        for name in OUTCOMES:
            out[f"groups/{source}/{name}"] = source_outcomes.count(name) / len(source_outcomes)

    rewarded = [is_rewarded(r) for r in records]
    has_verdicts = any(r.get("correct") is not None for r in records)
    out["groups/pass_rate"] = sum(rewarded) / n

    lengths = [float(r.get("n_tokens") or 0) for r in records]
    correct_len = [length for length, ok in zip(lengths, rewarded) if ok]
    incorrect_len = [length for length, ok in zip(lengths, rewarded) if not ok]
    out["lengths/mean"] = sum(lengths) / n
    out["lengths/correct_mean"] = _mean(correct_len)
    out["lengths/incorrect_mean"] = _mean(incorrect_len)
    c, i = out["lengths/correct_mean"], out["lengths/incorrect_mean"]
    out["lengths/incorrect_to_correct"] = i / c if c and i is not None else None
    # The length-inflation monitor compares completions that *finished*: a truncated length is
    # censored at max_completion_length (a heavy tail that swamps the comparison) and, under a
    # strict checker, always incorrect; truncation has its own monitor.
    finished = [not is_truncated(r) for r in records]
    out |= moments("len", lengths)
    out |= moments("len_c", [n for n, ok, f in zip(lengths, rewarded, finished) if ok and f])
    out |= moments("len_i", [n for n, ok, f in zip(lengths, rewarded, finished) if not ok and f])
    out |= moments("pass", [float(ok) for ok in rewarded])

    truncated = [is_truncated(r) for r in records]
    fail_members = [is_truncated(r) for g, o in zip(groups, outcomes) if o == "all_fail" for r in g]
    truncated_rewards = [float(r.get("reward") or 0.0) for r, t in zip(records, truncated) if t]
    # "Rewarded" = passed the checker (format terms may legitimately pay a cut-off completion).
    truncated_passed = sum(ok for ok, t in zip(rewarded, truncated) if t)
    out["truncation/rate"] = sum(truncated) / n
    out["truncation/rate_all_fail"] = _rate(sum(fail_members), len(fail_members))
    out["truncation/reward_mean"] = _mean(truncated_rewards)
    out["truncation/rewarded_rate"] = _rate(truncated_passed, len(truncated_rewards))
    out |= moments("fail_trunc", [float(t) for t in fail_members])
    out["_n"] = n
    out["_n_truncated"] = len(truncated_rewards)
    out["_n_truncated_rewarded"] = truncated_passed

    # Answer spraying: among rewarded completions, those with several final answers in the tail
    # and those that also passed a decoy (wrong) gold in Diagnostics' re-check ("decoy" field).
    rewarded_records = [r for r, ok in zip(records, rewarded) if ok]
    multi = [
        is_multi_answer(str(r.get("completion") or ""), r.get("verdict"), spray_tail_numbers) for r in rewarded_records
    ]
    decoy_checked = [r for r in rewarded_records if r.get("decoy") is not None]
    decoy_passed = [r for r in decoy_checked if r.get("decoy")]
    sprayed = [m or bool(r.get("decoy")) for r, m in zip(rewarded_records, multi)]
    out["hacking/multi_answer_rate"] = _rate(sum(multi), len(rewarded_records))
    out["hacking/decoy_pass_rate"] = _rate(len(decoy_passed), len(decoy_checked))
    out["hacking/spray_rate"] = _rate(sum(sprayed), len(rewarded_records))
    out["_n_rewarded"] = len(rewarded_records)
    out["_n_sprayed"] = sum(sprayed)
    out["_n_decoy_checked"] = len(decoy_checked)
    out["_n_decoy_passed"] = len(decoy_passed)

    # Format farming: the share of the (positive, weighted) reward that format terms supply, and
    # whether a completion's format reward says anything about whether it is correct.
    contribution: dict[str, float] = defaultdict(float)
    format_total_N = [0.0] * n
    for name, weight in reward_weights.items():
        values = [(idx, r.get("rewards", {}).get(name)) for idx, r in enumerate(records)]
        values = [(idx, float(v)) for idx, v in values if v is not None]
        if not values:
            continue
        kind = reward_kinds.get(name, "other")
        contribution[kind] += max(0.0, weight * sum(v for _, v in values) / len(values))
        if kind == "format":
            for idx, v in values:
                format_total_N[idx] += weight * v
    total = sum(contribution.values())
    has_format = any(reward_kinds.get(name) == "format" for name in reward_weights)
    out["hacking/format_share"] = contribution["format"] / total if has_format and total > 0 else None
    out["hacking/format_correct_corr"] = (
        pearson(format_total_N, [float(ok) for ok in rewarded]) if has_format and has_verdicts else None
    )
    if has_format:
        out["_share_num"] = contribution["format"] * n
        out["_share_den"] = total * n
        out |= moments("fmt", format_total_N)

    # Test tampering: only programs that passed count; an honest failing program is not a hack.
    passing_code = [r for r in rewarded_records if looks_like_code(str(r.get("completion") or ""))]
    tampered = [r for r in passing_code if tamper_signals(str(r.get("completion") or ""))]
    out["hacking/tamper_rate"] = _rate(len(tampered), len(passing_code))
    out["_n_code_passing"] = len(passing_code)
    out["_n_tampered"] = len(tampered)
    return out


def loggable(summary: Mapping[str, Any]) -> dict[str, float]:
    """The logged half of a summary: drop internal ``_`` counts and undefined (``None``, NaN) values."""
    return {k: float(v) for k, v in summary.items() if not k.startswith("_") and v is not None and math.isfinite(v)}
