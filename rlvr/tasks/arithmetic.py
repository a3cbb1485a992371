"""The arithmetic task: ``"367+458="`` -> ``"825"``, checked by exact integer comparison.

The default (2-digit addition, operands 10-99) is what the shipped tiny model was trained on
(scripts/make_tiny_model.py). About 76% of these additions carry (into the tens, into the
hundreds, or both), which is where the shipped model's greedy answer goes wrong.

The checker is strict on purpose (docs/checkers.md): the stripped completion must be exactly one integer
(``-?\\d+``), so ``"825 826"`` (answer spraying), ``"825.0"``, ``"eight hundred"`` and text around
the number all score 0, and a truncated completion scores 0 whatever it holds.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rlvr.rewards.base import REWARDS, CheckerReward, Verdict
from rlvr.tasks.base import TASKS, Row, is_held_out

OPERATIONS = "+-*"

_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def operand_range(digits: int) -> tuple[int, int]:
    """Operands have exactly ``digits`` digits (no leading zero); 1 digit means 0-9."""
    return (0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def format_prompt(a: int, op: str, b: int) -> str:
    return f"{a}{op}{b}="


def solve(a: int, op: str, b: int) -> int:
    return _APPLY[op](a, b)


@dataclass
class ArithmeticTask:
    """Integer arithmetic on two operands of ``digits`` digits.

    Options: ``digits`` (1-9, default 2), ``operations`` (any non-empty subset of ``"+-*"``, each
    problem draws one uniformly; default ``"+"``). Subtraction may go negative (``"12-57="`` ->
    ``"-45"``). Rows carry the operands and operator as extra columns (``a``, ``op``, ``b``).
    """

    digits: int = 2
    operations: str = "+"
    name: str = "arithmetic"
    default_rewards: list[tuple[str, float]] = field(default_factory=lambda: [("arithmetic", 1.0)])

    def __post_init__(self) -> None:
        if not isinstance(self.digits, int) or not 1 <= self.digits <= 9:
            raise ValueError(f"arithmetic: digits must be an integer from 1 to 9, got {self.digits!r}")
        bad = sorted(set(self.operations) - set(OPERATIONS))
        if not self.operations or bad:
            raise ValueError(
                f"arithmetic: operations must be a non-empty string over {OPERATIONS!r} "
                f"(e.g. '+' or '+-*'), got {self.operations!r}"
            )
        self._ops = sorted(set(self.operations), key=OPERATIONS.index)

    @property
    def max_completion_length(self) -> int:
        """Longest possible answer in characters (one token each) + EOS + a little slack."""
        lo, hi = operand_range(self.digits)
        longest = max(len(str(solve(x, op, y))) for op in self._ops for x in (lo, hi) for y in (lo, hi))
        return longest + 4

    def _row(self, a: int, op: str, b: int) -> Row:
        prompt = format_prompt(a, op, b)
        return {
            "prompt": prompt,
            "answer": str(solve(a, op, b)),
            "data_source": self.name,
            "prompt_id": f"{self.name}/{prompt}",
            "a": a,
            "op": op,
            "b": b,
        }

    def _draw(self, rng: random.Random) -> tuple[int, str, int]:
        lo, hi = operand_range(self.digits)
        return rng.randint(lo, hi), rng.choice(self._ops), rng.randint(lo, hi)

    def train_rows(self, seed: int) -> Iterator[Row]:
        """Uniform random problems from the training split, forever (repeats are expected)."""
        rng = random.Random(seed)
        while True:
            a, op, b = self._draw(rng)
            if not is_held_out(format_prompt(a, op, b)):
                yield self._row(a, op, b)

    def eval_rows(self, n: int, seed: int = 0) -> list[Row]:
        """``n`` distinct held-out problems. Small problem spaces are enumerated; a request larger
        than the held-out pool is an error that says how large the pool is."""
        lo, hi = operand_range(self.digits)
        space = (hi - lo + 1) ** 2 * len(self._ops)
        rng = random.Random(seed)
        if space <= 200_000:
            pool = [
                (a, op, b)
                for op in self._ops
                for a in range(lo, hi + 1)
                for b in range(lo, hi + 1)
                if is_held_out(format_prompt(a, op, b))
            ]
            if n > len(pool):
                raise ValueError(
                    f"arithmetic(digits={self.digits}, operations={self.operations!r}) has only "
                    f"{len(pool)} held-out problems; ask for at most that many (or use more digits)"
                )
            return [self._row(*p) for p in rng.sample(pool, n)]
        picked: dict[str, tuple[int, str, int]] = {}
        while len(picked) < n:
            a, op, b = self._draw(rng)
            prompt = format_prompt(a, op, b)
            if is_held_out(prompt):
                picked.setdefault(prompt, (a, op, b))
        return [self._row(*p) for p in picked.values()]


TASKS.add("arithmetic", ArithmeticTask)


# ---------------------------------------------------------------------------------------------
# The checker


_INTEGER = re.compile(r"-?\d+")
# Anything that looks like a number, to count candidates ("82 83" has two; "82.5" has one).
_NUMBER_LIKE = re.compile(r"[-+]?\d+(?:[.,]\d+)*")


def check_integer(completion: str, gold: str, truncated: bool = False) -> Verdict:
    """Verdict for one completion against an integer gold answer (see the module docstring)."""
    start = time.perf_counter()
    text = completion.strip()
    candidates = _NUMBER_LIKE.findall(text)
    extracted = text if _INTEGER.fullmatch(text) else None

    def verdict(correct: bool, reason: str) -> Verdict:
        return Verdict(
            correct=correct,
            reward=None if reason == "bad_gold" else float(correct),
            extracted=extracted,
            path="whole",
            n_candidates=len(set(candidates)),
            reason=reason,
            seconds=time.perf_counter() - start,
        )

    gold_text = str(gold).strip()
    if not _INTEGER.fullmatch(gold_text):
        return verdict(False, "bad_gold")
    if truncated:
        return verdict(False, "truncated")
    if not candidates:
        return verdict(False, "no_answer")
    if len(candidates) > 1:
        return verdict(False, "multiple_answers")
    if extracted is None:
        return verdict(False, "malformed")
    correct = int(extracted) == int(gold_text)
    return verdict(correct, "ok" if correct else "wrong")


class ExactIntegerReward(CheckerReward):
    """TRL-signature reward: 1.0 when the completion is exactly the gold integer, else 0.0.

    A gold value that is not an integer makes the completion unscorable (``None``): that is a data
    bug, and a 0 would silently teach the model to avoid the prompt. Built on ``CheckerReward``:
    verdicts, timing and ``stats`` (counted reasons) like every other checker.
    """

    kind = "correctness"

    def __init__(self, gold_column: str = "answer", name: str = "arithmetic"):
        super().__init__(name)
        self.gold_column = gold_column
        self.required_columns = (gold_column,)

    def check(self, text: str, row: dict[str, Any]) -> Verdict:
        return check_integer(text, row[self.gold_column], bool(row.get("truncated", False)))


REWARDS.add("arithmetic", ExactIntegerReward)
