"""Strict tag format reward: ``<think>…</think><answer>…</answer>`` or a configured tag sequence.

Exactly one opening and one closing tag of each name, in the configured order, each block
non-empty, only whitespace between blocks and nothing after the last. Format-only rewards are
what models farm first (docs/diagnostics.md), so loose patterns (a regex that accepts
two answer blocks, or text after the answer) are the bug this reward exists to avoid.

``pattern=`` replaces the tag rule with a regular expression that must match the whole
completion (``re.fullmatch`` with DOTALL). ``think_prefilled=True`` is for chat templates that
put ``<think>`` in the prompt (Qwen3, DeepSeek-R1): the completion then starts inside the block.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rlvr.rewards.base import REWARDS, CheckerReward, Verdict


def check_tags(text: str, tags: Sequence[str] = ("think", "answer"), think_prefilled: bool = False) -> Verdict:
    if think_prefilled and tags:
        text = f"<{tags[0]}>" + text
    spans = []
    for tag in tags:
        open_t, close_t = f"<{tag}>", f"</{tag}>"
        n_open, n_close = text.count(open_t), text.count(close_t)
        if n_open == 0 or n_close == 0:
            return Verdict(False, 0.0, reason=f"missing_tag:{tag}")
        if n_open > 1 or n_close > 1:
            return Verdict(False, 0.0, reason=f"duplicate_tag:{tag}", n_candidates=max(n_open, n_close))
        spans.append((tag, text.find(open_t), text.find(close_t)))
    pos = 0
    contents = []
    for tag, start, end in spans:
        if start < pos or end < start:
            return Verdict(False, 0.0, reason=f"out_of_order:{tag}")
        pos = end
    pos = 0
    for tag, start, end in spans:
        if text[pos:start].strip():
            return Verdict(False, 0.0, reason=f"text_before:{tag}")
        body = text[start + len(tag) + 2 : end]
        if not body.strip():
            return Verdict(False, 0.0, reason=f"empty:{tag}")
        contents.append(body)
        pos = end + len(tag) + 3
    if text[pos:].strip():
        return Verdict(False, 0.0, reason="text_after")
    return Verdict(
        True, 1.0, extracted=contents[-1].strip() if contents else None, path="tags", n_candidates=1, reason="ok"
    )


class FormatReward(CheckerReward):
    kind = "format"
    gold_column = None

    def __init__(
        self,
        tags: Sequence[str] = ("think", "answer"),
        pattern: str | None = None,
        think_prefilled: bool = False,
        name: str = "format",
    ):
        super().__init__(name)
        if not tags and pattern is None:
            raise ValueError(
                "format reward: give at least one tag name in tags=[...] or a regular expression in pattern=..."
            )
        for tag in tags:
            if not re.fullmatch(r"[A-Za-z_][\w.-]*", tag):
                raise ValueError(f"format reward: tag names are bare XML names like 'think' or 'answer', got {tag!r}")
        try:
            self.pattern = re.compile(pattern, re.DOTALL) if pattern is not None else None
        except re.error as exc:
            raise ValueError(f"format reward: pattern {pattern!r} is not a valid regular expression ({exc})") from None
        self.tags = tuple(tags)
        self.think_prefilled = think_prefilled

    def check(self, text: str, row: dict[str, Any]) -> Verdict:
        if self.pattern is not None:
            ok = self.pattern.fullmatch(text) is not None
            return Verdict(ok, float(ok), path="pattern", reason="ok" if ok else "pattern_mismatch")
        return check_tags(text, self.tags, self.think_prefilled)


REWARDS.add("format", lambda **options: FormatReward(**options))
