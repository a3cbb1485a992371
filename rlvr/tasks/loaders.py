"""Rows from files: JSONL / JSON, CSV, Parquet, a ``datasets`` dataset saved to disk, and GSM8K.

Every loader returns ``list[dict]`` rows in the shape tasks produce: ``prompt`` (a string or a list
of chat messages, kept as a list so the trainer applies the chat template), ``answer`` (text) when
an answer column is named, ``data_source`` and ``prompt_id`` (added when the file has none), and
every other column untouched, because the trainer passes them to the reward functions.

``FileTask`` (registered as ``"file"``) and ``gsm8k`` (registered as ``"gsm8k"``) turn such rows
into a ``Task``: an evaluation file when given, otherwise a hash split of the one file.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.tasks.base import TASKS, Row, is_held_out, problem_hash

FORMATS = ("jsonl", "json", "csv", "parquet", "datasets")
_SUFFIX_FORMAT = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def infer_format(path: Path) -> str:
    if path.is_dir():
        return "datasets"
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    if suffixes and suffixes[-1] in _SUFFIX_FORMAT:
        return _SUFFIX_FORMAT[suffixes[-1]]
    raise ValueError(f"cannot tell the format of {str(path)!r} from its name; pass fmt= one of {', '.join(FORMATS)}")


def _open_text(path: Path) -> io.TextIOBase:
    """A text handle on ``path``, decompressing ``.gz`` files."""
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def _read_json(path: Path) -> list[dict]:
    with _open_text(path) as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        return list(json.loads(stripped))
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}:{number}: not valid JSON ({err.msg}); JSONL needs one object per line"
                ) from None
    return rows


def _read_datasets(path: Path, split: str | None) -> list[dict]:
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if split is None:
            if len(data) != 1:
                raise ValueError(f"{path} holds the splits {sorted(data)}; pass split= to choose one")
            split = next(iter(data))
        if split not in data:
            raise ValueError(f"{path} has no split {split!r}; it has {sorted(data)}")
        data = data[split]
    return data.to_list()


def read_records(path: str | Path, split: str | None = None, fmt: str | None = None) -> list[dict]:
    """The raw records of a file, as dicts, with no renaming."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no dataset at {str(path)!r}")
    fmt = fmt or infer_format(path)
    if fmt in ("jsonl", "json"):
        return _read_json(path)
    if fmt == "csv":
        with _open_text(path) as f:
            return list(csv.DictReader(f))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if fmt == "datasets":
        return _read_datasets(path, split)
    raise ValueError(f"unknown dataset format {fmt!r}; valid formats: {', '.join(FORMATS)}")


def _check_prompt(prompt: Any, where: str) -> Any:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        return prompt
    raise ValueError(
        f"{where}: a prompt must be a string or a list of chat messages ({{'role': ..., 'content': ...}}), "
        f"got {type(prompt).__name__}"
    )


def _prompt_key(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def load_rows(
    path: str | Path,
    split: str | None = None,
    prompt_column: str = "prompt",
    answer_column: str | None = None,
    fmt: str | None = None,
) -> list[Row]:
    """Load prompt rows from a JSONL/JSON, CSV (either may be gzipped) or Parquet file, or a
    ``datasets.save_to_disk`` folder.

    ``prompt_column`` becomes ``prompt``; ``answer_column`` (when given) becomes ``answer`` as text.
    Missing ``data_source`` is filled with the file's name up to its first dot and missing ``prompt_id`` with a hash of
    the prompt. ``fmt`` overrides the format inferred from the name (one of ``FORMATS``); ``split``
    picks a split of a saved ``DatasetDict``.
    """
    path = Path(path)
    records = read_records(path, split=split, fmt=fmt)
    if not records:
        raise ValueError(f"{path} holds no rows")
    columns = sorted(records[0])
    for name, role, option in ((prompt_column, "prompt", "prompt_column"), (answer_column, "answer", "answer_column")):
        if name is not None and name not in records[0]:
            raise ValueError(
                f"{path} has no {role} column {name!r}; its columns are {columns}. Name the right one with {option}=..."
            )
    rows = []
    for i, record in enumerate(records):
        row = dict(record)
        row["prompt"] = _check_prompt(row.pop(prompt_column, None), f"{path} row {i}")
        if answer_column is not None:
            gold = row.pop(answer_column, None)
            if gold is None:
                raise ValueError(f"{path} row {i} has no value in the answer column {answer_column!r}")
            row["answer"] = str(gold)
        row.setdefault("data_source", path.name.split(".")[0])
        # From the prompt alone, so the same question gets the same id in a train and a test file.
        row.setdefault("prompt_id", f"{problem_hash(_prompt_key(row['prompt'])):016x}")
        rows.append(row)
    return rows


_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def gsm8k_final_answer(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after ``####``, thousands separators removed
    (``"#### 1,200"`` -> ``"1200"``)."""
    match = _GSM8K_FINAL.search(solution)
    if match is None:
        raise ValueError(f"a GSM8K answer must end with '#### <final answer>'; got {solution[-80:]!r}")
    return match.group(1).replace(",", "").strip()


def load_gsm8k(path: str | Path, split: str | None = None, fmt: str | None = None) -> list[Row]:
    """GSM8K-format rows (``question``, ``answer`` = worked solution ending ``#### <final>``) as
    ``prompt`` (the question), ``answer`` (the final answer only) and ``solution`` (the full text)."""
    rows = load_rows(path, split=split, prompt_column="question", answer_column="answer", fmt=fmt)
    for i, row in enumerate(rows):
        row["solution"] = row["answer"]
        try:
            row["answer"] = gsm8k_final_answer(row["solution"])
        except ValueError as err:
            raise ValueError(f"{path} row {i}: {err}") from None
    return rows


@dataclass
class FileTask:
    """A task over rows loaded from a file (see ``load_rows``).

    Evaluation rows come from ``eval_path`` when given (every train row whose prompt also appears
    there is dropped from training); otherwise ``eval_fraction`` of the file, chosen by hash
    of ``prompt_id``, is held out. ``rewards`` names the reward functions (default: ``math``, the
    general final-answer checker).
    """

    path: str
    eval_path: str | None = None
    prompt_column: str = "prompt"
    answer_column: str | None = "answer"
    split: str | None = None
    eval_split: str | None = None
    fmt: str | None = None
    rewards: list[tuple[str, float]] | list[str] = field(default_factory=lambda: [("math", 1.0)])
    max_completion_length: int = 512
    gsm8k: bool = False
    name: str = "file"

    def __post_init__(self) -> None:
        def load(path: str, split: str | None) -> list[Row]:
            if self.gsm8k:
                return load_gsm8k(path, split=split, fmt=self.fmt)
            return load_rows(path, split, self.prompt_column, self.answer_column, self.fmt)

        rows = load(self.path, self.split)
        if self.eval_path is not None:
            self._eval = load(self.eval_path, self.eval_split)
            held_out = {_prompt_key(r["prompt"]) for r in self._eval}
            self._train = [r for r in rows if _prompt_key(r["prompt"]) not in held_out]
        else:
            self._eval = [r for r in rows if is_held_out(r["prompt_id"])]
            self._train = [r for r in rows if not is_held_out(r["prompt_id"])]
        if not self._train:
            raise ValueError(f"{self.path}: no training rows left after holding out the evaluation rows")
        self.default_rewards = [(r, 1.0) if isinstance(r, str) else (r[0], float(r[1])) for r in self.rewards]

    def train_rows(self, seed: int) -> Iterator[Row]:
        """The training rows in a fresh shuffled order each epoch, forever."""
        rng = random.Random(seed)
        order = list(range(len(self._train)))
        while True:
            rng.shuffle(order)
            for i in order:
                yield dict(self._train[i])

    def eval_rows(self, n: int, seed: int = 0) -> list[Row]:
        """Up to ``n`` evaluation rows (all of them when the split is smaller), sampled by ``seed``."""
        if n >= len(self._eval):
            return [dict(r) for r in self._eval]
        return [dict(r) for r in random.Random(seed).sample(self._eval, n)]


def gsm8k_task(path: str, eval_path: str | None = None, **options: Any) -> FileTask:
    """GSM8K-format files as a task (``question`` / ``answer`` with ``####``), checked by ``math``."""
    options.setdefault("name", "gsm8k")
    return FileTask(path=path, eval_path=eval_path, gsm8k=True, **options)


TASKS.add("file", FileTask)
TASKS.add("gsm8k", gsm8k_task)
