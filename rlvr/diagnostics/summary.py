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

from rlvr.diagnostics.signals import canonical_number, is_multi_answer, looks_like_code, tail_numbers, tamper_signals

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


def is_correct(record: Mapping[str, Any]) -> bool:
    """Correct per the strict grade (shadow grade, or the correctness checker); unknown counts as not."""
    return bool(record.get("correct"))


def paid_by(record: Mapping[str, Any], names: Iterable[str]) -> bool:
    """Whether any of the reward functions ``names`` paid this completion (a positive score)."""
    rewards = record.get("rewards") or {}
    return any((rewards.get(n) or 0.0) > 0 for n in names)


def is_truncated(record: Mapping[str, Any]) -> bool:
    """Hit ``max_completion_length`` (the trainer's flag, or a ``"length"`` finish reason)."""
    return bool(record.get("truncated")) or record.get("finish_reason") == "length"


def offers_gold_among_others(record: Mapping[str, Any]) -> bool:
    """The answer tail holds the gold and at least one other number: a guess list a lenient checker pays."""
    columns = record.get("columns") or {}
    gold = next((columns[c] for c in ("answer", "solution", "gold", "target", "ground_truth") if c in columns), None)
    if gold is None:
        return False
    numbers = tail_numbers(str(record.get("completion") or ""))
    return len(numbers) >= 2 and canonical_number(str(gold).strip()) in numbers


def group_outcome(group: Sequence[Mapping[str, Any]]) -> str:
    """``"all_fail"``, ``"mixed"`` or ``"all_pass"`` for one group of G completions.

    With a strict grade (``correct`` not None for some completion, from the shadow grade or a
    correctness checker; None counts as a fail): by the number that are correct. Without (non-binary
    rewards): ``"mixed"`` when the rewards differ, otherwise
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
    correct = [is_correct(r) for r in records]
    has_verdicts = any(r.get("correct") is not None for r in records)
    hist = [0] * (group_size + 1)
    for g in groups:
        k = sum(is_correct(r) for r in g)
        hist[min(group_size, round(k * group_size / len(g)))] += 1
    if has_verdicts:
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

    # Correctness comes from the strict grade only (never "total reward > 0": a format reward would count as a pass): without one,
    # the pass rate and the correct/incorrect split are undefined, not guessed.
    out["groups/pass_rate"] = sum(correct) / n if has_verdicts else None

    lengths = [float(r.get("n_tokens") or 0) for r in records]
    correct_len = [length for length, ok in zip(lengths, correct) if ok]
    incorrect_len = [length for length, ok in zip(lengths, correct) if not ok] if has_verdicts else []
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
    out |= moments("len_c", [n for n, ok, f in zip(lengths, correct, finished) if ok and f])
    out |= moments("len_i", [n for n, ok, f in zip(lengths, correct, finished) if not ok and f] if has_verdicts else [])
    out |= moments("pass", [float(ok) for ok in correct] if has_verdicts else [])

    # "Paid" = a positive score from a correctness-role reward (the user's own, lenient or not);
    # the strict grade scores every truncated completion 0, so paying one is the checker's doing.
    correctness_names = [k for k, role in reward_kinds.items() if role == "correctness"]
    paid = [paid_by(r, correctness_names) if correctness_names else is_correct(r) for r in records]
    truncated = [is_truncated(r) for r in records]
    fail_members = [is_truncated(r) for g, o in zip(groups, outcomes) if o == "all_fail" for r in g]
    truncated_rewards = [float(r.get("reward") or 0.0) for r, t in zip(records, truncated) if t]
    truncated_paid = sum(ok for ok, t in zip(paid, truncated) if t)
    out["truncation/rate"] = sum(truncated) / n
    out["truncation/rate_all_fail"] = _rate(sum(fail_members), len(fail_members))
    out["truncation/reward_mean"] = _mean(truncated_rewards)
    out["truncation/rewarded_rate"] = _rate(truncated_paid, len(truncated_rewards))
    out |= moments("fail_trunc", [float(t) for t in fail_members])
    out["_n"] = n
    out["_n_truncated"] = len(truncated_rewards)
    out["_n_truncated_rewarded"] = truncated_paid

    # Answer spraying: completions a correctness reward paid were scored again against wrong golds
    # (the other numbers they offer, gold x 100; ``decoy`` field, set by Diagnostics): the
    # rate is over the completions actually re-checked. Multi-answer text is a second, weaker signal.
    paid_records = [r for r, ok in zip(records, paid) if ok]
    multi = [
        is_multi_answer(str(r.get("completion") or ""), r.get("verdict"), spray_tail_numbers) for r in paid_records
    ]
    decoy_checked = [r for r in records if r.get("decoy") is not None]
    decoy_passed = [r for r in decoy_checked if r.get("decoy")]
    if not decoy_checked:  # no re-check ran (no reward functions to call): read paid-but-wrong texts instead
        decoy_checked = [r for r in paid_records if r.get("shadow") is not None]
        decoy_passed = [r for r in decoy_checked if not r["shadow"]["correct"] and offers_gold_among_others(r)]
    out["hacking/multi_answer_rate"] = _rate(sum(multi), len(paid_records))
    out["hacking/decoy_pass_rate"] = _rate(len(decoy_passed), len(decoy_checked))
    out["hacking/spray_rate"] = out["hacking/decoy_pass_rate"]
    out["_n_rewarded"] = len(paid_records)
    out["_n_decoy_checked"] = len(decoy_checked)
    out["_n_decoy_passed"] = len(decoy_passed)

    # Format farming: the format reward's own mean (unweighted, per completion) and the share of
    # completions it pays that are wrong; the share of the total reward it supplies is a signal only
    # (it saturates when correctness pays ~0 from the start).
    contribution: dict[str, float] = defaultdict(float)
    format_names = [k for k, role in reward_kinds.items() if role == "format" and k in reward_weights]
    format_mean_N = [0.0] * n
    for name, weight in reward_weights.items():
        values = [(idx, r.get("rewards", {}).get(name)) for idx, r in enumerate(records)]
        values = [(idx, float(v)) for idx, v in values if v is not None]
        if not values:
            continue
        kind = reward_kinds.get(name) or "other"
        contribution[kind] += max(0.0, weight * sum(v for _, v in values) / len(values))
        if kind == "format":
            for idx, v in values:
                format_mean_N[idx] += v / len(format_names)
    total = sum(contribution.values())
    has_format = bool(format_names)
    out["hacking/format_share"] = contribution["format"] / total if has_format and total > 0 else None
    out["hacking/format_correct_corr"] = (
        pearson(format_mean_N, [float(ok) for ok in correct]) if has_format and has_verdicts else None
    )
    if has_format:
        out["_share_num"] = contribution["format"] * n
        out["_share_den"] = total * n
        out |= moments("fmt", format_mean_N)
        if has_verdicts:
            # How often the format reward pays a wrong answer: conditioned on being wrong, so a step
            # of easier or harder prompts (accuracy noise) does not move it, a policy farming format does.
            paid_wrong = [float(paid_by(r, format_names)) for r, ok in zip(records, correct) if not ok]
            out["hacking/format_paid_wrong"] = _rate(int(sum(paid_wrong)), len(paid_wrong))
            out |= moments("fmt_pw", paid_wrong)

    # Reward functions that scored nothing this step (raised, or returned None / NaN / inf for all).
    out["_n_rewards"] = len(reward_weights)
    out["_silent_rewards"] = [
        name for name in reward_weights if all((r.get("rewards") or {}).get(name) is None for r in records)
    ]

    # Test tampering: only programs that passed count; an honest failing program is not a hack.
    passing_code = [r for r, ok in zip(records, paid) if ok and looks_like_code(str(r.get("completion") or ""))]
    tampered = [r for r in passing_code if tamper_signals(str(r.get("completion") or ""))]
    out["hacking/tamper_rate"] = _rate(len(tampered), len(passing_code))
    out["_n_code_passing"] = len(passing_code)
    out["_n_tampered"] = len(tampered)
    return out


def loggable(summary: Mapping[str, Any]) -> dict[str, float]:
    """The logged half of a summary: drop internal ``_`` counts and undefined (``None``, NaN) values."""
    return {k: float(v) for k, v in summary.items() if not k.startswith("_") and v is not None and math.isfinite(v)}
