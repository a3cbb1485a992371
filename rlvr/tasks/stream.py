"""Where prompts come from during training: a built-in task's stream or a dataset file, resumable.

The stream's whole state is one integer, the number of rows handed out so far: a resumed run
rebuilds the same stream from the seed and skips that many rows, so data order is bitwise the same
as in a run that was never interrupted.

With several processes every rank builds the same seeded stream and keeps every world-th row,
starting at its rank: rows r, r+W, r+2W, ... The shards are disjoint and deterministic, and each
rank's position is its own, so a rank that draws more (DAPO refills, predictive skipping) never
shifts another rank's prompts.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Iterator

from rlvr.config import Config


def _file_rows(cfg: Config, path: str) -> list[dict]:
    from rlvr.tasks.loaders import load_gsm8k, load_rows

    d = cfg.data
    fmt = None if d.format in ("auto", "gsm8k") else d.format
    if d.format == "gsm8k":
        rows = load_gsm8k(path, split=d.split, fmt=fmt)
    else:
        rows = load_rows(path, split=d.split, prompt_column=d.prompt_column, answer_column=d.answer_column, fmt=fmt)
    return [format_row(cfg, r) for r in rows]


def format_row(cfg: Config, row: dict) -> dict:
    """Apply data.prompt_template, data.system_prompt and data.chat to one row's prompt."""
    d = cfg.data
    prompt = row["prompt"]
    if d.prompt_template is not None and isinstance(prompt, str):
        try:
            prompt = d.prompt_template.format(**row)
        except KeyError as e:
            raise ValueError(
                f"data.prompt_template names column {e} that the rows lack; columns: {sorted(row)}"
            ) from None
    if isinstance(prompt, str) and (d.chat or d.system_prompt is not None):
        prompt = [{"role": "user", "content": prompt}]
        if d.system_prompt is not None:
            prompt.insert(0, {"role": "system", "content": d.system_prompt})
    return {**row, "prompt": prompt}


class PromptStream:
    """An endless, seeded, resumable iterator of dataset rows (dicts with at least 'prompt'); with
    ``world > 1``, this rank's shard of it (every world-th row from ``rank``)."""

    def __init__(self, cfg: Config, rank: int = 0, world: int = 1):
        self.cfg, self.rank, self.world = cfg, rank, world
        self.position = 0  # rows this rank has handed out
        self.offset = 0  # where the shards start: > 0 after a resume at another number of processes
        self._rows: list[dict] | None = None
        if cfg.data.path is not None:
            self._rows = split_held_out(cfg, _file_rows(cfg, cfg.data.path))[0]
            if not self._rows:
                raise ValueError(f"dataset {cfg.data.path!r} has no rows")
            for i, row in enumerate(self._rows):
                row.setdefault("prompt_id", str(i))
            if len(self._rows) < world:
                raise ValueError(
                    f"dataset {cfg.data.path!r} has {len(self._rows)} rows but the run has {world} processes: "
                    "each process samples its own disjoint prompts, so some would have none. Launch at most "
                    f"{len(self._rows)} processes (torchrun --nproc_per_node) or use a larger dataset."
                )
        self._it = self._shard()

    def _shard(self) -> Iterator[dict]:
        return itertools.islice(self._iterate(), self.offset + self.rank, None, self.world)

    def _iterate(self) -> Iterator[dict]:
        seed = self.cfg.train.seed
        if self._rows is None:
            from rlvr.tasks import get_task

            for row in get_task(self.cfg.data.task, **self.cfg.data.task_options).train_rows(seed):
                yield format_row(self.cfg, row)
            return
        epoch = 0
        while True:  # epochs of a file dataset, each shuffled with its own seed
            order = list(range(len(self._rows)))
            if self.cfg.data.shuffle:
                random.Random(seed * 1_000_003 + epoch).shuffle(order)
            for i in order:
                yield dict(self._rows[i])
            epoch += 1

    def take(self, n: int) -> list[dict]:
        rows = [next(self._it) for _ in range(n)]
        self.position += n
        return rows

    def peek(self, n: int) -> list[dict]:
        """Without moving the stream: a task's first n rows (a fresh iterator), or every row of a file
        dataset whatever n is (a file is fingerprinted whole)."""
        if self._rows is not None:
            return [dict(r) for r in self._rows]
        it = self._iterate()
        return [next(it) for _ in range(n)]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offset = state.get("offset", 0)
        self._it = self._shard()
        self.position = 0
        for _ in range(state["position"]):
            next(self._it)
        self.position = state["position"]


def split_held_out(cfg: Config, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) of data.path. Without data.eval_path, a data.eval_fraction slice of
    the distinct prompts is held out: those whose stable hash of the prompt text is smallest, so the
    slice is the same in every run of the file whatever train.seed is, and every copy of a prompt lands
    on the same side. Fewer rows than one held-out prompt needs (e.g. 9 at 10%) hold out nothing."""
    if cfg.data.eval_path is not None or cfg.data.eval_fraction == 0:
        return rows, []
    import json

    from rlvr.tasks.base import problem_hash

    def key(row: dict) -> str:
        p = row["prompt"]
        return p if isinstance(p, str) else json.dumps(p, sort_keys=True)

    distinct = sorted({key(r) for r in rows}, key=lambda k: problem_hash("held-out:" + k))
    held = set(distinct[: int(len(distinct) * cfg.data.eval_fraction)])
    if len(held) == len(distinct):
        return rows, []
    return [r for r in rows if key(r) not in held], [r for r in rows if key(r) in held]


def describe_held_out(cfg: Config) -> str | None:
    """One line on what a file dataset's evaluation uses, for the console (None for a built-in task)."""
    if cfg.data.path is None:
        return None
    if cfg.data.eval_size == 0:
        return "no held-out evaluation (data.eval_size=0)"
    if cfg.data.eval_path is not None:
        return f"held-out evaluation on {cfg.data.eval_path} (its prompts are not trained on)"
    train_rows, held = split_held_out(cfg, _file_rows(cfg, cfg.data.path))
    if not held:
        return (
            f"no held-out evaluation: {len(train_rows)} rows are too few to hold out data.eval_fraction="
            f"{cfg.data.eval_fraction}; set data.eval_path to evaluate"
        )
    return (
        f"held out {len(held)} of {len(train_rows) + len(held)} rows of {cfg.data.path} for evaluation "
        f"(data.eval_fraction={cfg.data.eval_fraction}, chosen by prompt hash; evaluated: "
        f"{min(len(held), cfg.data.eval_size)}); they are never trained on"
    )


def eval_rows(cfg: Config) -> list[dict]:
    """Held-out rows: the task's disjoint eval split, data.eval_path, or the held-out slice of data.path."""
    if cfg.data.eval_size == 0:
        return []
    if cfg.data.eval_path is not None:
        rows = _file_rows(cfg, cfg.data.eval_path)
        return rows[: cfg.data.eval_size]
    if cfg.data.path is not None:  # a file dataset without eval_path: its held-out slice
        return split_held_out(cfg, _file_rows(cfg, cfg.data.path))[1][: cfg.data.eval_size]
    from rlvr.tasks import get_task

    rows = get_task(cfg.data.task, **cfg.data.task_options).eval_rows(cfg.data.eval_size, seed=0)
    return [format_row(cfg, r) for r in rows]
