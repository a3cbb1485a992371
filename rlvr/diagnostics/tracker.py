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
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from rlvr.diagnostics.health import health_metrics, no_learning, silent_rewards
from rlvr.diagnostics.history import history_table, update_history
from rlvr.diagnostics.monitors import MONITORS, MonitorConfig, MonitorResult, change, run_monitors, series
from rlvr.diagnostics.record import RECORD_NAME, append_lines, finite, record_header, to_json_line
from rlvr.diagnostics.roles import ROLES, describe_roles, infer_role
from rlvr.diagnostics.samples import choose_samples, format_sample
from rlvr.diagnostics.shadow import (
    ShadowGrader,
    call_reward,
    finite_or_none,
    gold_column_of,
    is_strict_builtin,
    paid_but_wrong,
    timed_grade,
)
from rlvr.diagnostics.signals import decoy_golds
from rlvr.diagnostics.summary import group_outcome, loggable, split_groups, summarize_step

SAMPLES_NAME = "samples.jsonl"
WARNINGS_NAME = "warnings.jsonl"
HISTORY_NAME = "prompt_history.json"
# prompt_history.json holds every prompt seen so far, so rewriting it is O(prompts) per write: every step, it
# was the largest part of the shipped task's log phase (~10 ms of a ~100 ms step). It is rewritten when this
# many seconds have passed since the last write, at every checkpoint and at the run's end (``flush``).
HISTORY_EVERY_S = 10.0


def write_json_atomic(path: Path, obj: Any) -> None:
    """Temp file + rename, so a reader (or a crash) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(finite(obj), ensure_ascii=False, allow_nan=False))
    os.replace(tmp, path)


def _append_jsonl(path: Path, objects: Sequence[Mapping[str, Any]]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(to_json_line(obj) for obj in objects)


def sanitize(record: Mapping[str, Any], weights: Mapping[str, float]) -> dict[str, Any]:
    """A copy with every reward finite or None (NaN and ±inf are "not scorable", as in the trainer's
    scoring) and the total recomputed from them, so live metrics and the record agree."""
    out = dict(record)
    rewards = {k: finite_or_none(v) for k, v in (record.get("rewards") or {}).items()}
    out["rewards"] = rewards
    out["reward"] = sum(weights.get(k, 1.0) * v for k, v in rewards.items() if v is not None)
    return out


def decoy_recheck(
    fn: Callable[..., Sequence[float | None]],
    records: Sequence[Mapping[str, Any]],
    reward_name: str,
    budget: int,
    gold_column: str | None = None,
) -> tuple[dict[int, bool], str | None]:
    """Re-score up to ``budget`` completions that ``reward_name`` paid, against wrong golds (``decoy_golds``:
    the other numbers a completion offers, gold x 100).

    Returns ``{record index: passed a decoy}`` and an error string when the reward function raised
    (the run goes on: a diagnostic must never stop training). One batched call per step, at most
    ``4 · budget`` extra evaluations of the function. A completion that a reward pays for the right
    gold *and* for a wrong one answers several things at once: it is spraying.
    """
    gold_column = getattr(fn, "gold_column", None) or gold_column
    eligible: list[tuple[int, str, list[str]]] = []
    for i, record in enumerate(records):
        score = (record.get("rewards") or {}).get(reward_name)
        if score is None or score <= 0:
            continue
        columns = record.get("columns") or {}
        column = gold_column_of(columns, gold_column)
        decoys = decoy_golds(columns.get(column), str(record.get("completion") or "")) if column else []
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
    column_names = sorted({k for i, _, _ in picked for k in (records[i].get("columns") or {})})
    prompts, completions, owners = [], [], []
    columns_out: dict[str, list] = {name: [] for name in column_names + ["truncated"]}
    for i, gold_column_used, decoys in picked:
        record = records[i]
        for decoy in decoys:
            prompts.append(record.get("prompt"))
            completions.append(str(record.get("completion") or ""))
            for name in column_names:
                value = (record.get("columns") or {}).get(name)
                columns_out[name].append(decoy if name == gold_column_used else value)
            columns_out["truncated"].append(bool(record.get("truncated")))
            owners.append(i)
    try:
        scores = call_reward(fn, prompts, completions, columns_out)
    except Exception as exc:  # noqa: BLE001 - any checker failure is reported, never raised
        return {}, f"{type(exc).__name__}: {exc}"
    if len(scores) != len(prompts):
        return {}, f"returned {len(scores)} scores for {len(prompts)} completions"
    passed: dict[int, bool] = {i: False for i, _, _ in picked}
    for owner, score in zip(owners, scores):
        if (finite_or_none(score) or 0.0) > 0:
            passed[owner] = True
    return passed, None


class Diagnostics:
    """Group outcomes, length/truncation stats, hacking monitors, samples and the rollout record.

    ``run_dir=None`` keeps everything in memory (nothing is written). ``reward_kinds`` maps each
    reward name to its role (``"correctness" | "format" | "length" | "other"``, docs/diagnostics.md)
    or ``None`` when none was declared: the role is then inferred from the first step (it needs
    ``reward_funcs``) and printed. ``reward_funcs`` also lets gold-dependent rewards be re-run against
    decoy golds. ``shadow`` is the strict grader (``rlvr.diagnostics.shadow``) every completion is
    graded by; without one, correctness comes from a correctness checker's verdicts or a
    correctness-role reward. ``console`` receives warnings and printed samples (default ``print``).
    """

    def __init__(
        self,
        run_dir: Path | str | None,
        group_size: int,
        reward_names: list[str],
        reward_weights: list[float],
        reward_kinds: Mapping[str, str | None],
        reward_funcs: dict[str, Callable[..., Any]] | None = None,
        record_rollouts: bool = True,
        samples_per_class: int = 2,
        console: Callable[[str], None] | None = None,
        monitor_config: MonitorConfig | None = None,
        decoy_budget: int | None = None,
        shadow: ShadowGrader | None = None,
    ):
        if len(reward_names) != len(reward_weights):
            raise ValueError(
                f"Diagnostics got {len(reward_names)} reward names but {len(reward_weights)} weights; "
                "pass one weight per reward function, in the same order."
            )
        bad = {n: k for n, k in reward_kinds.items() if k is not None and k not in ROLES}
        if bad:
            raise ValueError(f"unknown reward role(s) {bad}; valid roles: {', '.join(ROLES)}.")
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1 (got {group_size}); it is num_generations.")
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.group_size = group_size
        self.reward_names = list(reward_names)
        self.reward_weights = dict(zip(reward_names, reward_weights))
        self.reward_funcs = dict(reward_funcs or {})
        self.declared = {name: reward_kinds.get(name) for name in reward_names}
        self.reward_kinds: dict[str, str] = {n: r or "other" for n, r in self.declared.items()}
        self.role_reasons: dict[str, str] = {}
        self.roles_pending = any(r is None for r in self.declared.values())
        self.record_rollouts = record_rollouts
        self.samples_per_class = samples_per_class
        self.console = console or print
        self.cfg = monitor_config or MonitorConfig()
        self.decoy_budget = self.cfg.decoy_budget if decoy_budget is None else decoy_budget
        self.shadow = shadow
        self.window: deque[dict[str, Any]] = deque(maxlen=self.cfg.window + self.cfg.persist - 1)
        self.last_warned: dict[str, int] = {}
        self.warning_count: dict[str, int] = {name: 0 for name in MONITORS}
        self.history: dict[str, dict[str, Any]] = {}
        self._history_step: int | None = None  # the step of the history not yet written, if any
        self._history_written_at = -math.inf
        self.decoy_errors = 0
        self.shadow_errors = 0
        # Decoy verdicts of the last observed step, so samples() of that step can show them.
        self._decoy_step: int | None = None
        self._decoy_flags: dict[tuple[Any, Any], bool] = {}
        # The record's header names the roles: with roles still to infer it waits for the first step.
        self._header_written = False
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not self.roles_pending:
                self._write_record_header()
        if not self.roles_pending and self.shadow is not None:
            self._announce_roles()

    @property
    def decoy_funcs(self) -> dict[str, Callable[..., Any]]:
        """Gold-dependent rewards worth a decoy re-check (rlvr's own strict checkers are audited instead)."""
        return {
            name: fn
            for name, fn in self.reward_funcs.items()
            if self.reward_kinds.get(name) == "correctness" and not is_strict_builtin(fn)
        }

    def _write_record_header(self) -> None:
        if self.run_dir is None or not self.record_rollouts or self._header_written:
            return
        self._header_written = True
        header = record_header(
            self.group_size, self.reward_names, list(self.reward_weights.values()), self.reward_kinds
        )
        header["role_reasons"] = self.role_reasons
        header["shadow"] = None if self.shadow is None else {"checker": self.shadow.name, "source": self.shadow.source}
        append_lines(self.run_dir / RECORD_NAME, [header])

    def _announce_roles(self) -> None:
        shadow = (
            f"shadow grading with {self.shadow.name} ({self.shadow.source})"
            if self.shadow is not None
            else "no shadow grading (the run's own correctness checker, if any, is the strict grade)"
        )
        self.console(f"[diagnostics] {describe_roles(self.reward_kinds, self.role_reasons)}; {shadow}")

    def _infer_roles(self, records: list[dict[str, Any]]) -> None:
        """Roles of the functions that declared none, from this step's completions (once per run)."""
        gold_column = self.shadow.gold_column if self.shadow is not None else None
        for name, role in self.declared.items():
            if role is not None:
                continue
            fn = self.reward_funcs.get(name)
            inferred, why = (
                infer_role(fn, name, records, gold_column)
                if fn is not None
                else ("other", "the function was not given to diagnostics")
            )
            self.reward_kinds[name], self.role_reasons[name] = inferred, why
        self.roles_pending = False
        self._announce_roles()
        if self.run_dir is not None:
            header_path = self.run_dir / "header.json"
            if header_path.is_file():
                try:
                    header = json.loads(header_path.read_text())
                    header["reward_roles"] = {"roles": self.reward_kinds, "assumed": self.role_reasons}
                    write_json_atomic(header_path, header)
                except (OSError, ValueError):
                    pass  # a header another writer holds is not worth a failed step

    def _grade(self, records: list[dict[str, Any]], metrics: dict[str, float]) -> None:
        """Set ``shadow`` and ``correct`` on every record (in place)."""
        if self.shadow is not None:
            verdicts, seconds, error = timed_grade(self.shadow, records)
            metrics["timing/shadow"] = seconds
            if error is not None:
                self.shadow_errors += 1
                if self.shadow_errors == 1:
                    self.console(f"[diagnostics] shadow grading with {self.shadow.name} failed and is skipped: {error}")
            for record, verdict in zip(records, verdicts):
                record["shadow"] = verdict
                if verdict is not None:
                    record["correct"] = verdict["correct"]
        correctness = [n for n, role in self.reward_kinds.items() if role == "correctness"]
        for record in records:
            if record.get("shadow") is not None:
                continue
            if not correctness:  # a verdict from a format (or other) checker is never "correct"
                record["correct"] = None
            elif record.get("correct") is None:
                values = [(record.get("rewards") or {}).get(n) for n in correctness]
                known = [v for v in values if v is not None]
                record["correct"] = any(v > 0 for v in known) if known else None

    def observe(self, step: int, records: list[dict[str, Any]]) -> tuple[dict[str, float], list[str]]:
        """Summarise one step, run the monitors, write the record; returns (metrics, new warnings)."""
        records = [sanitize(r, self.reward_weights) for r in records]
        metrics: dict[str, float] = {}
        if self.roles_pending:
            self._infer_roles(records)
        self._write_record_header()  # once per start, now that the roles are known
        self._grade(records, metrics)
        for name, fn in self.decoy_funcs.items():
            passed, error = decoy_recheck(
                fn, records, name, self.decoy_budget, self.shadow.gold_column if self.shadow is not None else None
            )
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

        metrics.update(loggable(summary))
        del metrics["step"]  # the trainer logs the step itself
        metrics.update(paid_but_wrong(records, self.reward_names))
        metrics.update(history_table(self.history))
        if seen_before:
            metrics["groups/prompt_flips"] = flipped / seen_before
        ratio = series(list(self.window), "lengths/incorrect_to_correct")
        if len(ratio) >= 2:
            span = ratio[-1][0] - ratio[0][0]
            metrics["lengths/ratio_trend"] = change(ratio) / span if span else 0.0
        if self.decoy_funcs:
            metrics["hacking/decoy_errors"] = float(self.decoy_errors)
        metrics.update(health_metrics(list(self.window), self.cfg.no_signal_steps))

        warnings: list[str] = []
        warned: list[dict[str, Any]] = []
        for result in run_monitors(list(self.window), self.cfg):
            if result.value is not None:
                metrics[f"hacking/{result.name}"] = float(result.value)
            metrics[f"hacking/{result.name}/fired"] = float(result.fired)
            if result.fired and self._cooled(result.name, step):
                self.warning_count[result.name] += 1
                warnings.append(result.message or result.name)
                warned.append({"step": step, "monitor": result.name, "value": result.value, "message": result.message})
        metrics["hacking/warnings"] = float(sum(self.warning_count.values()))
        for reason in no_learning(list(self.window), self.cfg.no_signal_steps):
            if self._cooled("cannot_learn:" + reason[:40], step):
                warnings.append(f"THIS RUN CANNOT LEARN: {reason}")
                warned.append({"step": step, "monitor": "cannot_learn", "value": None, "message": reason})
        for name, reason in silent_rewards(list(self.window), self.cfg.window):
            if self._cooled("silent:" + name, step):
                warnings.append(reason)
                warned.append({"step": step, "monitor": "silent_reward", "value": None, "message": reason})
        for message in warnings:
            self.console(f"[diagnostics] step {step}: WARNING {message}")

        if self.run_dir is not None:
            if self.record_rollouts:
                append_lines(self.run_dir / RECORD_NAME, records)
            if warned:
                _append_jsonl(self.run_dir / WARNINGS_NAME, warned)
            self._history_step = step
            if time.monotonic() - self._history_written_at >= HISTORY_EVERY_S:
                self.flush()
        return metrics, warnings

    def flush(self) -> None:
        """Write the prompt history if a step since its last write changed it."""
        if self.run_dir is not None and self._history_step is not None:
            write_json_atomic(self.run_dir / HISTORY_NAME, {"step": self._history_step, "prompts": self.history})
            self._history_step, self._history_written_at = None, time.monotonic()

    def _cooled(self, key: str, step: int) -> bool:
        """True (and noted) when ``key`` last warned at least a window ago: one warning per window."""
        last = self.last_warned.get(key)
        if last is not None and step - last < self.cfg.window:
            return False
        self.last_warned[key] = step
        return True

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
                "shadow_errors": self.shadow_errors,
                "roles": None if self.roles_pending else {"roles": self.reward_kinds, "assumed": self.role_reasons},
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
        self.shadow_errors = int(state.get("shadow_errors", 0))
        if state.get("roles"):  # the roles the interrupted run assumed, not a fresh guess
            self.reward_kinds = dict(state["roles"]["roles"])
            self.role_reasons = dict(state["roles"]["assumed"])
            self.roles_pending = False  # the header (written at the next step) carries them

    def truncate_after(self, step: int) -> None:
        """Drop the samples and warnings a killed attempt wrote past ``step`` (the checkpoint a run resumes
        from): the resumed run writes those steps again. The rollout record needs nothing: its reader keeps
        the most recent copy of each step."""
        from rlvr.runfolder import truncate_jsonl

        if self.run_dir is not None:
            for name in (SAMPLES_NAME, WARNINGS_NAME):
                truncate_jsonl(self.run_dir / name, step)

    def close(self) -> None:
        """Writes what ``flush`` writes; nothing else is held open between steps (each write opens and closes
        its file)."""
        self.flush()
