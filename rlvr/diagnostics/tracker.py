"""``Diagnostics``: the one object the trainer talks to about group outcomes, hacking and samples.

Per step the trainer calls ``observe(step, records)`` and logs the metrics it returns; every
``logging_steps`` it calls ``samples(step, records)``. Everything else — the rollout record, the
per-prompt history, ``samples.jsonl``, ``warnings.jsonl`` — is written here, in the run folder.
``state_dict`` carries the monitor window, warning cooldowns and prompt history through a
checkpoint, so a resumed run warns exactly as an uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rlvr.diagnostics.history import history_table, update_history
from rlvr.diagnostics.monitors import MONITORS, MonitorConfig, MonitorResult, change, run_monitors, series
from rlvr.diagnostics.record import RECORD_NAME, append_lines, finite, record_header, to_json_line
from rlvr.diagnostics.samples import choose_samples, format_sample
from rlvr.diagnostics.signals import decoy_golds
from rlvr.diagnostics.summary import KINDS, group_outcome, loggable, split_groups, summarize_step

SAMPLES_NAME = "samples.jsonl"
WARNINGS_NAME = "warnings.jsonl"
HISTORY_NAME = "prompt_history.json"
# Columns that commonly hold the gold answer, tried when a checker does not name its own.
GOLD_COLUMNS = ("answer", "solution", "gold", "target", "ground_truth")


def write_json_atomic(path: Path, obj: Any) -> None:
    """Temp file + rename, so a reader (or a crash) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite(obj), ensure_ascii=False, allow_nan=False))
    os.replace(tmp, path)


def _append_jsonl(path: Path, objects: Sequence[Mapping[str, Any]]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(to_json_line(obj) for obj in objects)


def decoy_recheck(
    fn: Callable[..., Sequence[float | None]],
    records: Sequence[Mapping[str, Any]],
    reward_name: str,
    budget: int,
) -> tuple[dict[int, bool], str | None]:
    """Re-score up to ``budget`` rewarded completions against wrong golds (gold ± 1, gold × 100).

    Returns ``{record index: passed a decoy}`` and an error string when the reward function raised
    (the run goes on: a diagnostic must never stop training). One batched call per step: the cost
    is at most ``3 · budget`` extra checker evaluations. A completion that a checker rewards for
    the right gold *and* for a wrong one answers several things at once: it is spraying.
    """
    gold_column = getattr(fn, "gold_column", None)
    eligible: list[tuple[int, str, list[str]]] = []
    for i, record in enumerate(records):
        score = (record.get("rewards") or {}).get(reward_name)
        if score is None or score <= 0:
            continue
        columns = record.get("columns") or {}
        column = gold_column if gold_column in columns else next((c for c in GOLD_COLUMNS if c in columns), None)
        decoys = decoy_golds(columns.get(column)) if column else []
        if decoys:
            eligible.append((i, column, decoys))
    # One completion per group first, so the budget samples as many prompts as it can.
    first_of_group, rest, seen_groups = [], [], set()
    for item in eligible:
        group = records[item[0]].get("group")
        (rest if group in seen_groups else first_of_group).append(item)
        seen_groups.add(group)
    picked = (first_of_group + rest)[:budget]
    if not picked:
        return {}, None
    prompts, completions, truncated, columns_out, owners = [], [], [], {}, []
    column_names = sorted({k for i, _, _ in picked for k in (records[i].get("columns") or {})})
    for name in column_names:
        columns_out[name] = []
    for i, gold_column_used, decoys in picked:
        record = records[i]
        for decoy in decoys:
            prompts.append(record.get("prompt"))
            completions.append(record.get("completion"))
            truncated.append(bool(record.get("truncated")))
            for name in column_names:
                value = (record.get("columns") or {}).get(name)
                columns_out[name].append(decoy if name == gold_column_used else value)
            owners.append(i)
    try:
        scores = list(
            fn(
                prompts=prompts,
                completions=completions,
                completion_ids=[[] for _ in prompts],
                truncated=truncated,
                **columns_out,
            )
        )
    except Exception as exc:  # noqa: BLE001 - any checker failure is reported, never raised
        return {}, f"{type(exc).__name__}: {exc}"
    if len(scores) != len(prompts):
        return {}, f"returned {len(scores)} scores for {len(prompts)} completions"
    passed: dict[int, bool] = {i: False for i, _, _ in picked}
    for owner, score in zip(owners, scores):
        if score is not None and not (isinstance(score, float) and math.isnan(score)) and score > 0:
            passed[owner] = True
    return passed, None


class Diagnostics:
    """Group outcomes, length/truncation stats, hacking monitors, samples and the rollout record.

    ``run_dir=None`` keeps everything in memory (nothing is written). ``reward_kinds`` maps each
    reward name to ``"correctness" | "format" | "length" | "other"``; ``reward_funcs`` (optional) lets
    the correctness checkers be re-run against decoy golds. ``console`` receives warnings and
    printed samples (default ``print``).
    """

    def __init__(
        self,
        run_dir: Path | str | None,
        group_size: int,
        reward_names: list[str],
        reward_weights: list[float],
        reward_kinds: dict[str, str],
        reward_funcs: dict[str, Callable[..., Any]] | None = None,
        record_rollouts: bool = True,
        samples_per_class: int = 2,
        console: Callable[[str], None] | None = None,
        monitor_config: MonitorConfig | None = None,
        decoy_budget: int = 4,
    ):
        if len(reward_names) != len(reward_weights):
            raise ValueError(
                f"Diagnostics got {len(reward_names)} reward names but {len(reward_weights)} weights; "
                "pass one weight per reward function, in the same order."
            )
        bad = {n: k for n, k in reward_kinds.items() if k not in KINDS}
        if bad:
            raise ValueError(f"unknown reward kind(s) {bad}; valid kinds: {', '.join(KINDS)}.")
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1 (got {group_size}); it is num_generations.")
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.group_size = group_size
        self.reward_weights = dict(zip(reward_names, reward_weights))
        self.reward_kinds = {name: reward_kinds.get(name, "other") for name in reward_names}
        self.decoy_funcs = {
            name: fn for name, fn in (reward_funcs or {}).items() if self.reward_kinds.get(name) == "correctness"
        }
        self.record_rollouts = record_rollouts
        self.samples_per_class = samples_per_class
        self.console = console or print
        self.cfg = monitor_config or MonitorConfig()
        self.decoy_budget = decoy_budget
        self.window: deque[dict[str, Any]] = deque(maxlen=self.cfg.window + self.cfg.persist - 1)
        self.last_warned: dict[str, int] = {}
        self.warning_count: dict[str, int] = {name: 0 for name in MONITORS}
        self.history: dict[str, dict[str, Any]] = {}
        self.decoy_errors = 0
        # Decoy verdicts of the last observed step, so samples() of that step can show them.
        self._decoy_step: int | None = None
        self._decoy_flags: dict[tuple[Any, Any], bool] = {}
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if record_rollouts:
                header = record_header(group_size, reward_names, reward_weights, self.reward_kinds)
                append_lines(self.run_dir / RECORD_NAME, [header])

    def observe(self, step: int, records: list[dict[str, Any]]) -> tuple[dict[str, float], list[str]]:
        """Summarise one step, run the monitors, write the record; returns (metrics, new warnings)."""
        records = [dict(r) for r in records]
        for name, fn in self.decoy_funcs.items():
            passed, error = decoy_recheck(fn, records, name, self.decoy_budget)
            if error is not None:
                self.decoy_errors += 1
                if self.decoy_errors == 1:  # say it once; the count is logged every step
                    self.console(f"[diagnostics] decoy re-check of reward {name!r} failed and is skipped: {error}")
            for i, hit in passed.items():
                records[i]["decoy"] = hit or bool(records[i].get("decoy"))
        self._decoy_step = step
        self._decoy_flags = {(r.get("group"), r.get("index")): r["decoy"] for r in records if "decoy" in r}

        summary = summarize_step(
            records, self.group_size, self.reward_weights, self.reward_kinds, self.cfg.spray_tail_numbers
        )
        summary["step"] = step
        outcomes = {str(g[0].get("prompt_id", g[0].get("group"))): group_outcome(g) for g in split_groups(records)}
        seen_before = sum(pid in self.history for pid in outcomes)
        flipped = update_history(self.history, step, outcomes)
        self.window.append(summary)

        metrics = loggable(summary)
        del metrics["step"]  # the trainer logs the step itself
        metrics.update(history_table(self.history))
        if seen_before:
            metrics["groups/prompt_flips"] = flipped / seen_before
        ratio = series(list(self.window), "lengths/incorrect_to_correct")
        if len(ratio) >= 2:
            span = ratio[-1][0] - ratio[0][0]
            metrics["lengths/ratio_trend"] = change(ratio) / span if span else 0.0
        if self.decoy_funcs:
            metrics["hacking/decoy_errors"] = float(self.decoy_errors)

        warnings: list[str] = []
        warned: list[MonitorResult] = []
        for result in run_monitors(list(self.window), self.cfg):
            if result.value is not None:
                metrics[f"hacking/{result.name}"] = float(result.value)
            metrics[f"hacking/{result.name}/fired"] = float(result.fired)
            last = self.last_warned.get(result.name)
            if result.fired and (last is None or step - last >= self.cfg.window):
                self.last_warned[result.name] = step
                self.warning_count[result.name] += 1
                warnings.append(result.message or result.name)
                warned.append(result)
        metrics["hacking/warnings"] = float(sum(self.warning_count.values()))
        for message in warnings:
            self.console(f"[diagnostics] step {step}: WARNING {message}")

        if self.run_dir is not None:
            if self.record_rollouts:
                append_lines(self.run_dir / RECORD_NAME, records)
            if warned:
                _append_jsonl(
                    self.run_dir / WARNINGS_NAME,
                    [{"step": step, "monitor": r.name, "value": r.value, "message": r.message} for r in warned],
                )
            write_json_atomic(self.run_dir / HISTORY_NAME, {"step": step, "prompts": self.history})
        return metrics, warnings

    def samples(self, step: int, records: list[dict[str, Any]], echo: bool = True) -> list[dict[str, Any]]:
        """Best, worst and truncated completions of the step; printed and appended to samples.jsonl."""
        if step == self._decoy_step and self._decoy_flags:
            records = [
                dict(r, decoy=self._decoy_flags[(r.get("group"), r.get("index"))])
                if (r.get("group"), r.get("index")) in self._decoy_flags
                else r
                for r in records
            ]
        chosen = choose_samples(records, self.samples_per_class)
        for sample in chosen:
            sample["step"] = step
            if echo:
                self.console(format_sample(sample))
        if self.run_dir is not None and chosen:
            _append_jsonl(self.run_dir / SAMPLES_NAME, chosen)
        return chosen

    def state_dict(self) -> dict[str, Any]:
        """JSON-able snapshot (a deep copy: the trainer may serialise it later; no NaN)."""
        return finite(
            {
                "version": 1,
                "window": list(self.window),
                "last_warned": self.last_warned,
                "warning_count": self.warning_count,
                "history": self.history,
                "decoy_errors": self.decoy_errors,
            }
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != 1:
            raise ValueError(
                f"diagnostics state has version {state.get('version')!r}, this rlvr reads version 1; "
                "resume with the rlvr version that wrote the checkpoint."
            )
        self.window = deque((dict(s) for s in state["window"]), maxlen=self.cfg.window + self.cfg.persist - 1)
        self.last_warned = {k: int(v) for k, v in state["last_warned"].items()}
        self.warning_count = {name: int(state["warning_count"].get(name, 0)) for name in MONITORS}
        self.history = {k: dict(v) for k, v in state["history"].items()}
        self.decoy_errors = int(state.get("decoy_errors", 0))

    def close(self) -> None:
        """Nothing is held open between steps (each write opens and closes its file); kept for symmetry."""
