"""The countdown task: reach a target with the given numbers, each used exactly once, with
``+ - * /`` and parentheses (the TinyZero / "Countdown" game used in R1-Zero replications).

The checker never evaluates model text (docs/checkers.md): it parses the completion with ``ast`` in
``eval`` mode, accepts only a tree of non-negative integer literals, the four binary operators and
parentheses (which ``ast`` folds away), and computes the value itself with exact ``Fraction``
arithmetic. Names, attributes, calls, lambdas, subscripts, ``**``, unary minus, floats, strings and
anything else are rejected before any arithmetic happens, and the text length is capped before
parsing so a pathological input cannot make the parser itself the attack.
"""

from __future__ import annotations

import ast
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from rlvr.rewards.base import REWARDS, CheckerReward, Verdict
from rlvr.tasks.base import TASKS, Row, is_held_out

#: Longest equation text the checker will parse. A 6-number countdown answer is ~30 characters.
MAX_EQUATION_CHARS = 200

_OPERATORS = {
    ast.Add: lambda x, y: x + y,
    ast.Sub: lambda x, y: x - y,
    ast.Mult: lambda x, y: x * y,
    ast.Div: lambda x, y: x / y,
}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class EquationError(ValueError):
    """The text is not an equation the checker accepts; ``reason`` is machine-readable."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def evaluate_equation(text: str) -> tuple[Fraction, list[int]]:
    """Value and the integer literals (in order) of an arithmetic expression, without ``eval``.

    An optional ``= <number>`` after the expression is allowed and ignored here (the caller
    compares the value with the target). Raises ``EquationError`` for anything else.
    """
    if len(text) > MAX_EQUATION_CHARS:
        raise EquationError("too_long", f"equation longer than {MAX_EQUATION_CHARS} characters")
    expression = text.split("=", 1)[0] if text.count("=") == 1 else text
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise EquationError("unparsable", "not a Python-syntax arithmetic expression") from None
    numbers: list[int] = []

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise EquationError("division_by_zero", "division by zero")
            return _OPERATORS[type(node.op)](left, right)
        # bool is an int subclass: ``True`` must not pass as 1.
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            numbers.append(node.value)
            return Fraction(node.value)
        raise EquationError("forbidden_syntax", f"{type(node).__name__} is not allowed")

    try:
        return value(tree.body), numbers
    except RecursionError:
        raise EquationError("too_deep", "expression nested too deeply") from None


def check_countdown(completion: str, numbers: list[int], target: int, truncated: bool = False) -> Verdict:
    """Verdict for one countdown completion: the whole completion (or the single
    ``<answer>...</answer>`` block in it) must be an equation that uses each given number exactly
    once and equals ``target``."""
    start = time.perf_counter()
    tags = _ANSWER_TAG.findall(completion)
    text, path = (tags[0], "answer_tag") if len(tags) == 1 else (completion, "whole")

    def verdict(correct: bool, reason: str, **extra: Any) -> Verdict:
        return Verdict(
            correct=correct,
            reward=float(correct),
            extracted=text.strip() or None,
            path=path,
            n_candidates=max(1, len(tags)) if text.strip() else 0,
            reason=reason,
            seconds=time.perf_counter() - start,
            extra=extra,
        )

    if truncated:
        return verdict(False, "truncated")
    if len(tags) > 1:
        return verdict(False, "multiple_answers")
    if not text.strip():
        return verdict(False, "no_answer")
    try:
        result, used = evaluate_equation(text)
    except EquationError as err:
        return verdict(False, err.reason, detail=str(err))
    if Counter(used) != Counter(int(x) for x in numbers):
        return verdict(False, "wrong_numbers", used=used)
    if "=" in text:
        stated = text.split("=", 1)[1].strip()
        if not re.fullmatch(r"-?\d+", stated) or int(stated) != result:
            return verdict(False, "wrong_stated_result", value=str(result))
    correct = result == int(target)
    return verdict(correct, "ok" if correct else "wrong", value=str(result))


class CountdownReward(CheckerReward):
    """TRL-signature reward for countdown rows (columns ``numbers`` and ``target``), on ``CheckerReward``."""

    kind = "correctness"
    gold_column = "answer"  # one valid equation, for diagnostics; correctness never looks at it
    gold_required = False

    def __init__(self, numbers_column: str = "numbers", target_column: str = "target"):
        super().__init__("countdown")
        self.numbers_column = numbers_column
        self.target_column = target_column
        self.required_columns = (numbers_column, target_column)

    def check(self, text: str, row: dict[str, Any]) -> Verdict:
        return check_countdown(
            text, row[self.numbers_column], row[self.target_column], bool(row.get("truncated", False))
        )


REWARDS.add("countdown", CountdownReward)


# ---------------------------------------------------------------------------------------------
# The task


def random_equation(numbers: list[int], rng: random.Random) -> tuple[str, Fraction]:
    """Combine ``numbers`` (in a random order and shape) with random operators; returns the
    fully parenthesised equation text and its value."""
    items: list[tuple[str, Fraction]] = [(str(x), Fraction(x)) for x in numbers]
    rng.shuffle(items)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (left_text, left), (right_text, right) = items[i], items[j]
        op = rng.choice([ast.Add, ast.Sub, ast.Mult, ast.Div])
        if op is ast.Div and right == 0:
            op = ast.Add
        combined = (f"({left_text}{_SYMBOL[op]}{right_text})", _OPERATORS[op](left, right))
        items = [it for k, it in enumerate(items) if k not in (i, j)] + [combined]
    text, result = items[0]
    return (text[1:-1] if text.startswith("(") else text), result


@dataclass
class CountdownTask:
    """Countdown with ``n_numbers`` numbers drawn from ``1..max_number`` and a positive integer
    target up to ``max_target`` that is reachable (a solution is built first, then its value is
    the target; the row's ``answer`` is that solution, one of possibly many).

    Rows carry ``numbers`` (list[int]) and ``target`` (int) for the checker.
    """

    n_numbers: int = 4
    max_number: int = 99
    max_target: int = 1000
    name: str = "countdown"
    default_rewards: list[tuple[str, float]] = field(default_factory=lambda: [("countdown", 1.0)])
    max_completion_length: int = 64

    def __post_init__(self) -> None:
        if not 2 <= self.n_numbers <= 6:
            raise ValueError(f"countdown: n_numbers must be 2-6, got {self.n_numbers}")
        if self.max_number < 2 or self.max_target < 1:
            raise ValueError("countdown: max_number must be >= 2 and max_target >= 1")

    @staticmethod
    def key(numbers: list[int], target: int) -> str:
        """The problem's identity: the multiset of numbers and the target (order does not matter)."""
        return f"{','.join(map(str, sorted(numbers)))}->{target}"

    def _draw(self, rng: random.Random) -> tuple[list[int], int, str]:
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            equation, value = random_equation(numbers, rng)
            if value.denominator == 1 and 0 < value <= self.max_target:
                return numbers, int(value), equation

    def _row(self, numbers: list[int], target: int, equation: str) -> Row:
        prompt = (
            f"Using the numbers {numbers}, create an equation that equals {target}. Use each number "
            "exactly once, with + - * / and parentheses. Answer with the equation only."
        )
        return {
            "prompt": prompt,
            "answer": equation,
            "data_source": self.name,
            "prompt_id": f"{self.name}/{self.key(numbers, target)}",
            "numbers": numbers,
            "target": target,
        }

    def train_rows(self, seed: int) -> Iterator[Row]:
        rng = random.Random(seed)
        while True:
            numbers, target, equation = self._draw(rng)
            if not is_held_out(self.key(numbers, target)):
                yield self._row(numbers, target, equation)

    def eval_rows(self, n: int, seed: int = 0) -> list[Row]:
        rng = random.Random(seed)
        picked: dict[str, Row] = {}
        for _ in range(10_000 * max(n, 1)):
            if len(picked) >= n:
                break
            numbers, target, equation = self._draw(rng)
            key = self.key(numbers, target)
            if is_held_out(key) and key not in picked:
                picked[key] = self._row(numbers, target, equation)
        if len(picked) < n:
            raise ValueError(f"countdown: found only {len(picked)} distinct held-out problems; ask for fewer")
        return list(picked.values())


TASKS.add("countdown", CountdownTask)
