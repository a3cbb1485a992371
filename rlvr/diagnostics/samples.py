"""Choosing and showing sample completions: the failures the reward curve hides are visible here.

``samples.jsonl`` holds one JSON object per chosen completion (format in docs/diagnostics.md):
the record's fields (docs/rollout-record.md) plus ``"class"`` (``best`` | ``worst`` | ``truncated``)
and ``"flags"`` (hacking signals found in it: ``multi_answer``, ``decoy``, tampering pattern names).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rlvr.diagnostics.signals import is_multi_answer, looks_like_code, tamper_signals
from rlvr.diagnostics.summary import is_truncated

SAMPLE_CLASSES = ("best", "worst", "truncated")


def sample_flags(record: Mapping[str, Any], spray_tail_numbers: int = 4) -> list[str]:
    """Hacking signals present in one completion (empty for an unremarkable one)."""
    text = str(record.get("completion") or "")
    paid = float(record.get("reward") or 0.0) > 0
    flags = []
    if paid and record.get("correct") is False:
        flags.append("paid_wrong")
    if paid and is_multi_answer(text, record.get("verdict"), spray_tail_numbers):
        flags.append("multi_answer")
    if record.get("decoy"):
        flags.append("decoy")
    if is_truncated(record) and paid:
        flags.append("truncated_rewarded")
    if looks_like_code(text):
        flags.extend(tamper_signals(text))
    return flags


def choose_samples(records: Sequence[Mapping[str, Any]], per_class: int) -> list[dict[str, Any]]:
    """Up to ``per_class`` completions each: highest reward, lowest reward, and truncated ones.

    Ties break towards the shortest best and the longest worst (the most telling of each). A
    completion is shown once, under the first class that picks it, and a text the group repeats
    (the same prompt and completion) once per step.
    """
    indexed = list(enumerate(records))
    reward = lambda item: float(item[1].get("reward") or 0.0)  # noqa: E731
    length = lambda item: int(item[1].get("n_tokens") or 0)  # noqa: E731
    ranked = {
        "best": sorted(indexed, key=lambda it: (-reward(it), length(it), it[0])),
        "worst": sorted(indexed, key=lambda it: (reward(it), -length(it), it[0])),
        "truncated": sorted((it for it in indexed if is_truncated(it[1])), key=lambda it: (-reward(it), it[0])),
    }
    chosen: list[dict[str, Any]] = []
    taken: set[int] = set()
    texts: set[tuple[str, str]] = set()
    text_of = lambda record: (str(record.get("prompt")), str(record.get("completion")))  # noqa: E731
    for cls in SAMPLE_CLASSES:
        picked = []
        for idx, record in ranked[cls]:
            if len(picked) == per_class:
                break
            if idx in taken or text_of(record) in texts:
                continue
            taken.add(idx)
            texts.add(text_of(record))
            picked.append((idx, record))
        for idx, record in picked:
            chosen.append({"class": cls, **dict(record), "flags": sample_flags(record)})
    return chosen


def format_sample(sample: Mapping[str, Any], max_chars: int = 400) -> str:
    """A compact console rendering: header line with rewards and verdict, then the (trimmed) completion."""
    rewards = ", ".join(
        f"{k}={v:.2f}" if v is not None else f"{k}=None" for k, v in (sample.get("rewards") or {}).items()
    )
    verdict = sample.get("verdict") or {}
    verdict_text = f" verdict={verdict.get('reason', '')}:{verdict.get('extracted')!r}" if verdict else ""
    flags = f" FLAGS={','.join(sample['flags'])}" if sample.get("flags") else ""
    text = str(sample.get("completion") or "")
    if len(text) > max_chars:
        text = text[: max_chars // 2] + " […] " + text[-max_chars // 2 :]
    head = (
        f"[step {sample.get('step')}] {sample.get('class', ''):<9} reward={float(sample.get('reward') or 0):.2f} "
        f"({rewards}) adv={float(sample.get('advantage') or 0):+.2f} tokens={sample.get('n_tokens')} "
        f"{sample.get('finish_reason')} prompt={sample.get('prompt_id')}{verdict_text}{flags}"
    )
    return head + "\n    " + text.replace("\n", "\n    ")
