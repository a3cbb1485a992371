"""What a person sees while a run trains: a progress bar, warnings, a few samples, a before/after table."""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

_PACKAGE_DIR = Path(__file__).resolve().parent  # rlvr/: whose warnings the console shows


class Console:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        # soft_wrap: a line longer than the terminal (or than 80 columns in a pipe) is not cut into two,
        # so a metric line stays one line for grep and for a log file.
        self.rich = RichConsole(stderr=False, highlight=False, soft_wrap=True)
        self._progress: Progress | None = None
        self._task = None
        self._warned: Counter[str] = Counter()

    def info(self, msg: str) -> None:
        self.rich.print(f"[bold cyan]rlvr[/] {msg}", markup=True)

    def warn(self, msg: str) -> None:
        key = msg.split(";")[0][:120]  # the same warning every step is noise: show each kind at most 3 times
        self._warned[key] += 1
        if self._warned[key] <= 3:
            self.rich.print("[bold yellow]warning[/]", msg)

    @contextlib.contextmanager
    def own_warnings(self) -> Iterator[None]:
        """While a run lasts, what rlvr's own modules raise with ``warnings.warn`` (checkers and workers,
        which hold no console) is shown here like the loop's warnings: one channel, deduplicated.
        Other libraries' warnings keep Python's default display."""
        original = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - Python's hook
            if Path(filename).resolve().is_relative_to(_PACKAGE_DIR):
                self.warn(str(message))
            else:
                original(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        try:
            yield
        finally:
            warnings.showwarning = original

    def raw(self, msg: str) -> None:
        """A line that is already formatted (diagnostics' warnings), shown in yellow."""
        self.rich.print(msg, style="yellow", markup=False, highlight=False)

    def start(self, total: int, done: int) -> None:
        if not self.enabled:
            return
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.rich,
            disable=not sys.stdout.isatty(),
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=total, completed=done, info="")

    def progress(self, step: int, m: dict[str, float]) -> None:
        if self._progress is None:
            return
        info = f"reward {m.get('reward', float('nan')):.3f}"
        if "groups/mixed" in m:
            info += f" | mixed {m['groups/mixed']:.0%}"
        self._progress.update(self._task, completed=step, info=info)

    def samples(self, step: int, samples: list[dict], m: dict[str, float]) -> None:
        line = (
            f"step {step}: reward {m.get('reward', float('nan')):.3f}  "
            f"len {m.get('completions/mean_length', float('nan')):.1f}  "
            f"truncated {m.get('completions/clipped_ratio', 0.0):.0%}  "
            f"all-fail/mixed/all-pass {m.get('groups/all_fail', float('nan')):.0%}/"
            f"{m.get('groups/mixed', float('nan')):.0%}/{m.get('groups/all_pass', float('nan')):.0%}  "
            f"loss {m.get('loss', float('nan')):.4f}"
        )
        self.rich.print(line, markup=False, highlight=False)
        if not samples:
            return
        table = Table(show_header=True, header_style="bold", show_lines=False, pad_edge=False)
        for col in ("class", "prompt", "completion", "gold", "reward", "adv"):
            table.add_column(col, overflow="fold", max_width=48 if col in ("prompt", "completion") else None)
        seen = set()
        for s in samples:
            key = (s.get("class"), s.get("prompt"), s.get("completion"))
            if key in seen:  # two identical completions of one group say nothing new
                continue
            seen.add(key)
            gold = (s.get("columns") or {}).get("answer", "")
            table.add_row(
                str(s.get("class", "")),
                _short(s.get("prompt", "")),
                _short(s.get("completion", "")),
                _short(gold, 24),
                _fmt(s.get("reward")),
                _fmt(s.get("advantage")),
            )
        self.rich.print(table)

    def finish(self, before: dict[str, Any], after: dict[str, Any], run_dir: Path) -> None:
        if self._progress is not None:
            self._progress.stop()
        if before or after:
            table = Table(title="held-out evaluation (greedy)", header_style="bold")
            table.add_column("metric")
            table.add_column("before", justify="right")
            table.add_column("after", justify="right")
            for key in ("accuracy", "mean_length", "truncation_rate"):
                b, a = before.get(key), after.get(key)
                pct = key != "mean_length"
                table.add_row(key, _fmt(b, pct), _fmt(a, pct))
            self.rich.print(table)
        self.info(f"run folder: {run_dir.resolve()}  (metrics.jsonl, samples.jsonl, checkpoints/, final/)")


def _short(x: Any, n: int = 120) -> str:
    s = str(x).replace("\n", "⏎")
    return s if len(s) <= n else s[: n - 1] + "…"


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if pct:
        return f"{v:.1%}"
    return f"{v:.3g}" if isinstance(v, float) else str(v)
