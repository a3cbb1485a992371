"""Generated one-step word problems: ``"Sam has 7 apples. He buys 5 more. How many apples does Sam have
now?"`` -> ``12``, checked by the strict math checker on the final answer.

A step up from bare arithmetic for instruct models: the numbers sit in a sentence and the model
has to pick the operation. Each problem is one of a few templates per operation (``+``: buying
more, ``-``: giving away, ``*``: equal groups) filled with a name, an item and two operands from
``1..max_number`` (a difference never goes below zero). The prompt ends with ``instruction``
(default: put the final answer in ``\\boxed{}``), which is what the math checker reads first.

Rows carry ``a``, ``b``, ``op`` and ``answer``; the held-out split is by a hash of the whole problem
text, as for every built-in task.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from rlvr.tasks.base import TASKS, Row, is_held_out

NAMES = [("Sam", "he"), ("Mia", "she"), ("Leo", "he"), ("Ava", "she"), ("Ben", "he"), ("Zoe", "she")]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books"]
TEMPLATES = {
    "+": [
        "{name} has {a} {item}. {Pron} buys {b} more. How many {item} does {name} have now?",
        "There are {a} {item} in a box. {name} puts {b} more {item} in the box. How many {item} are in the box now?",
    ],
    "-": [
        "{name} has {a} {item}. {Pron} gives {b} of them to a friend. How many {item} does {name} have left?",
        "There are {a} {item} on a table. {name} takes {b} of them. How many {item} are left on the table?",
    ],
    "*": [
        "{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} have in total?",
        "{name} buys {a} packs of {item}. Each pack holds {b} {item}. How many {item} does {name} buy?",
    ],
}
INSTRUCTION = "Put the final answer in \\boxed{}."


@dataclass
class WordProblemTask:
    """Options: ``max_number`` (operands from 1 to it; default 20), ``operations`` (a non-empty subset
    of ``"+-*"``; default ``"+-"``), ``instruction`` (appended to every question; default asks for
    ``\\boxed{}``)."""

    max_number: int = 20
    operations: str = "+-"
    instruction: str = INSTRUCTION
    name: str = "word_problems"
    default_rewards: list[tuple[str, float]] = field(default_factory=lambda: [("math", 1.0)])
    max_completion_length: int = 96

    def __post_init__(self) -> None:
        if not isinstance(self.max_number, int) or self.max_number < 2:
            raise ValueError(f"word_problems: max_number must be an integer >= 2, got {self.max_number!r}")
        bad = sorted(set(self.operations) - set(TEMPLATES))
        if not self.operations or bad:
            raise ValueError(
                f"word_problems: operations must be a non-empty string over '+-*' (e.g. '+-'), got {self.operations!r}"
            )
        self._ops = sorted(set(self.operations), key="+-*".index)

    def _draw(self, rng: random.Random) -> Row:
        op = rng.choice(self._ops)
        a, b = rng.randint(1, self.max_number), rng.randint(1, self.max_number)
        if op == "-" and b > a:
            a, b = b, a
        (name, pron), item = rng.choice(NAMES), rng.choice(ITEMS)
        question = rng.choice(TEMPLATES[op]).format(name=name, Pron=pron.capitalize(), item=item, a=a, b=b)
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        prompt = f"{question} {self.instruction}".strip()
        return {
            "prompt": prompt,
            "answer": str(answer),
            "data_source": self.name,
            "prompt_id": f"{self.name}/{question}",
            "a": a,
            "b": b,
            "op": op,
            "question": question,
        }

    def train_rows(self, seed: int) -> Iterator[Row]:
        rng = random.Random(seed)
        while True:
            row = self._draw(rng)
            if not is_held_out(row["question"]):
                yield row

    def eval_rows(self, n: int, seed: int = 0) -> list[Row]:
        rng = random.Random(seed)
        picked: dict[str, Row] = {}
        for _ in range(1000 * max(n, 1)):
            if len(picked) >= n:
                break
            row = self._draw(rng)
            if is_held_out(row["question"]):
                picked.setdefault(row["question"], row)
        if len(picked) < n:
            raise ValueError(
                f"word_problems: found only {len(picked)} distinct held-out problems; ask for fewer or raise max_number"
            )
        return list(picked.values())


TASKS.add("word_problems", WordProblemTask)
