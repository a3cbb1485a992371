"""``rlvr diagnose RUN_DIR_OR_RECORD [--json]``: re-run every monitor over a rollout record.

Recomputes the per-step summaries from the record with the same code the trainer used live
(``summarize_step`` and ``run_monitors``), prints whether the run could learn at all, a
group-outcome table, and for each monitor that fired the evidence a person needs: its statistic
over time against its threshold and three completions that were paid and are wrong. Returns an
exit code a pipeline can gate on: 0 = quiet, 1 = a monitor fired, 2 = the record could not be
read, 3 = the run could not learn (every group at zero reward spread, or a reward function
scoring nothing, on its last steps). Decoy re-checks and the shadow grade are not re-run (they
need the checkers); what the trainer stored in the record (``decoy``, ``shadow``, ``correct``) is used.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, deque
from pathlib import Path
from typing import Any, Sequence

from rlvr.diagnostics.health import no_learning, silent_rewards
from rlvr.diagnostics.monitors import MONITORS, MonitorConfig, run_monitors, thresholds
from rlvr.diagnostics.record import RECORD_NAME, read_record
from rlvr.diagnostics.signals import looks_like_code, tamper_signals
from rlvr.diagnostics.summary import OUTCOMES, group_outcome, is_truncated, source_key, split_groups, summarize_step

# Rows in the printed table: longer runs are shown in this many equal buckets of steps.
TABLE_ROWS = 12
EXAMPLES = 3
EXIT_QUIET, EXIT_FIRED, EXIT_UNREADABLE, EXIT_CANNOT_LEARN = 0, 1, 2, 3


def _paid(record: dict[str, Any]) -> bool:
    return float(record.get("reward") or 0.0) > 0


def _evidence_filter(monitor: str, roles: dict[str, str]):
    """Which completions show a monitor's hack (before "paid and wrong" is applied)."""
    formats = [n for n, r in roles.items() if r == "format"]
    return {
        "answer_spraying": lambda r: bool(r.get("decoy")),
        "format_farming": lambda r: any(((r.get("rewards") or {}).get(n) or 0) > 0 for n in formats),
        "length_inflation": lambda r: not is_truncated(r),
        "truncation_gaming": is_truncated,
        "test_tampering": lambda r: (
            looks_like_code(str(r.get("completion") or "")) and bool(tamper_signals(str(r.get("completion") or "")))
        ),
    }.get(monitor, lambda r: True)


def examples(
    monitor: str, steps: dict[int, list[dict[str, Any]]], fired: list[int], roles: dict[str, str], n: int = EXAMPLES
) -> list[dict[str, Any]]:
    """Up to ``n`` distinct completions that were paid and are wrong and show the monitor's hack, from
    the steps it fired on (newest first; the longest first for length inflation)."""
    keep = _evidence_filter(monitor, roles)
    chosen: list[dict[str, Any]] = []
    seen: set[str] = set()
    for step in sorted(set(fired), reverse=True):
        candidates = [r for r in steps.get(step, []) if _paid(r) and r.get("correct") is False and keep(r)]
        if monitor == "length_inflation":
            candidates.sort(key=lambda r: -int(r.get("n_tokens") or 0))
        for r in candidates:
            text = str(r.get("completion") or "")
            if text in seen:
                continue
            seen.add(text)
            chosen.append(
                {
                    k: r.get(k)
                    for k in (
                        "step",
                        "prompt_id",
                        "prompt",
                        "completion",
                        "n_tokens",
                        "finish_reason",
                        "rewards",
                        "reward",
                        "shadow",
                        "decoy",
                    )
                }
                | {
                    "gold": next(
                        (
                            v
                            for k, v in (r.get("columns") or {}).items()
                            if k in ("answer", "solution", "gold", "target", "ground_truth")
                        ),
                        None,
                    )
                }
            )
            if len(chosen) == n:
                return chosen
    return chosen


def resolve_record(path: str | Path) -> Path:
    path = Path(path)
    return path / RECORD_NAME if path.is_dir() else path


def step_summaries(path: str | Path, cfg: MonitorConfig | None = None) -> dict[int, dict[str, Any]]:
    """``{step: summarize_step(...)}`` for every step in a record, with the reward setup of its header."""
    return summarize_record(*read_record(resolve_record(path)), cfg or MonitorConfig())


def summarize_record(
    header: dict[str, Any], steps: dict[int, list[dict[str, Any]]], cfg: MonitorConfig
) -> dict[int, dict[str, Any]]:
    names = header.get("reward_names") or sorted(
        {k for recs in steps.values() for r in recs for k in r.get("rewards", {})}
    )
    weights = dict(zip(names, header.get("reward_weights") or [1.0] * len(names)))
    kinds = header.get("reward_kinds") or {}
    group_size = int(
        header.get("group_size") or max((len(g) for recs in steps.values() for g in split_groups(recs)), default=1)
    )
    out = {}
    for step, records in steps.items():
        out[step] = summarize_step(records, group_size, weights, kinds, cfg.spray_tail_numbers) | {"step": step}
    return out


def analyse_record(path: str | Path, cfg: MonitorConfig | None = None) -> dict[str, Any]:
    """Everything ``diagnose`` prints, as a JSON-able dict (also the ``--json`` output)."""
    cfg = cfg or MonitorConfig()
    record_path = resolve_record(path)
    header, steps = read_record(record_path)
    if not steps:
        raise ValueError(f"the rollout record {record_path} holds no completions yet; run at least one step first.")
    summaries = summarize_record(header, steps, cfg)

    window: deque[dict[str, Any]] = deque(maxlen=cfg.window + cfg.persist - 1)
    warnings = []
    last_warned: dict[str, int] = {}
    fired_steps: dict[str, list[int]] = {name: [] for name in MONITORS}
    statistic: dict[str, list[list[float]]] = {name: [] for name in MONITORS}
    source_outcomes: dict[str, Counter[str]] = {}
    for step, records in steps.items():
        window.append(summaries[step])
        for group in split_groups(records):
            source = source_key(group[0].get("data_source") or "all")
            source_outcomes.setdefault(source, Counter())[group_outcome(group)] += 1
        for result in run_monitors(list(window), cfg):
            if result.value is not None:
                statistic[result.name].append([step, result.value])
            if not result.fired:
                continue
            fired_steps[result.name].append(step)
            last = last_warned.get(result.name)
            if last is None or step - last >= cfg.window:
                last_warned[result.name] = step
                warnings.append(
                    {"step": step, "monitor": result.name, "value": result.value, "message": result.message}
                )
    roles = dict(header.get("reward_kinds") or {})
    limits = thresholds(cfg)
    cannot_learn = no_learning(list(summaries.values()), cfg.no_signal_steps, whole_run=True)
    silent = [reason for _, reason in silent_rewards(list(summaries.values()), cfg.window)]

    return {
        "record": str(record_path),
        "steps": len(steps),
        "first_step": min(steps),
        "last_step": max(steps),
        "completions": sum(len(r) for r in steps.values()),
        "reward_roles": roles,
        "roles_assumed": header.get("role_reasons") or {},
        "shadow": header.get("shadow"),
        "cannot_learn": cannot_learn,
        "silent_rewards": silent,
        "table": outcome_table(list(summaries.values())),
        "sources": {
            s: {o: c[o] / sum(c.values()) for o in OUTCOMES} | {"groups": sum(c.values())}
            for s, c in sorted(source_outcomes.items())
        },
        "monitors": {
            name: {
                "fired_steps": len(s),
                "first_fired": s[0] if s else None,
                "threshold": limits[name],
                "statistic": statistic[name] if s else [],
                "examples": examples(name, steps, s, roles) if s else [],
            }
            for name, s in fired_steps.items()
        },
        "warnings": warnings,
        "fired": any(fired_steps.values()),
    }


def outcome_table(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group outcomes per step, or per bucket of steps when there are more than ``TABLE_ROWS``."""
    n = len(summaries)
    size = max(1, -(-n // TABLE_ROWS))
    rows = []
    for start in range(0, n, size):
        chunk = summaries[start : start + size]
        row: dict[str, Any] = {
            "steps": f"{chunk[0]['step']}" if len(chunk) == 1 else f"{chunk[0]['step']}-{chunk[-1]['step']}"
        }
        for key in (
            "groups/all_fail",
            "groups/mixed",
            "groups/all_pass",
            "groups/pass_rate",
            "truncation/rate",
            "lengths/mean",
        ):
            values = [s[key] for s in chunk if s.get(key) is not None]
            row[key.split("/")[-1]] = sum(values) / len(values) if values else None
        rows.append(row)
    return rows


def _series_text(points: list[list[float]], rows: int = TABLE_ROWS) -> str:
    """``step:value`` pairs, thinned to about ``rows`` evenly spaced points."""
    every = max(1, -(-len(points) // rows))
    return "  ".join(f"{int(step)}:{value:.3g}" for step, value in points[::every])


def _short(text: Any, n: int = 160) -> str:
    text = str(text).replace("\n", "⏎")
    return text if len(text) <= n else text[: n // 2] + " […] " + text[-n // 2 :]


def render_text(result: dict[str, Any]) -> str:
    lines = []
    for reason in result["cannot_learn"]:
        lines.append(f"THIS RUN CANNOT LEARN: {reason}")
    if result["cannot_learn"]:
        lines.append("")
    roles = ", ".join(
        f"{n}={r}" + (" (assumed)" if n in result["roles_assumed"] else "") for n, r in result["reward_roles"].items()
    )
    shadow = result.get("shadow")
    lines += [
        f"rollout record {result['record']}: {result['completions']} completions, {result['steps']} steps "
        f"({result['first_step']}..{result['last_step']})",
        f"reward roles: {roles or 'unknown'}; correctness from "
        + (f"shadow grading with {shadow['checker']} ({shadow['source']})" if shadow else "the run's own checker"),
        "",
        f"{'steps':>11} {'all_fail':>9} {'mixed':>7} {'all_pass':>9} {'pass':>6} {'trunc':>6} {'length':>7}",
    ]
    fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
    for row in result["table"]:
        lines.append(
            f"{row['steps']:>11} {fmt(row['all_fail'], '9.1%')} {fmt(row['mixed'], '7.1%')} "
            f"{fmt(row['all_pass'], '9.1%')} "
            f"{fmt(row['pass_rate'], '6.1%')} {fmt(row['rate'], '6.1%')} {fmt(row['mean'], '7.1f')}"
        )
    if len(result["sources"]) > 1:
        lines += ["", "by data source (all steps):"]
        for source, row in result["sources"].items():
            lines.append(
                f"  {source:<20} groups={row['groups']:<6} all_fail={row['all_fail']:.1%} "
                f"mixed={row['mixed']:.1%} all_pass={row['all_pass']:.1%}"
            )
    lines.append("")
    lines += [f"WARNING {reason}" for reason in result["silent_rewards"]]
    if result["warnings"]:
        for w in result["warnings"]:
            lines.append(f"WARNING step {w['step']}: {w['message']}")
        fired = {n: m for n, m in result["monitors"].items() if m["fired_steps"]}
        lines.append(
            "fired: "
            + ", ".join(f"{n} ({m['fired_steps']} steps, first at {m['first_fired']})" for n, m in fired.items())
        )
        for name, m in fired.items():
            lines += [
                "",
                f"{name}: statistic by step (threshold {m['threshold']:.3g}):",
                "  " + _series_text(m["statistic"]),
            ]
            lines.append(f"  {len(m['examples'])} completions that were paid and are wrong:")
            for ex in m["examples"]:
                verdict = ex.get("shadow") or {}
                rewards = ", ".join(
                    f"{k}={v:.2f}" if v is not None else f"{k}=None" for k, v in (ex.get("rewards") or {}).items()
                )
                lines.append(
                    f"  - step {ex['step']} prompt {_short(ex['prompt'], 60)!r} gold {ex['gold']!r} ({rewards})"
                    + (f" strict: {verdict.get('reason')}" if verdict else "")
                    + (" decoy: paid for a wrong gold too" if ex.get("decoy") else "")
                )
                lines.append(f"      {_short(ex['completion'])}")
    else:
        lines.append("no reward-hacking monitor fired (" + ", ".join(MONITORS) + ").")
    return "\n".join(lines)


def diagnose(path: str | Path, as_json: bool = False) -> int:
    """Print the run's health, group-outcome table and monitor evidence; the exit code is in the module docstring."""
    try:
        result = analyse_record(path)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"rlvr diagnose: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    print(json.dumps(result, indent=2) if as_json else render_text(result))
    if result["cannot_learn"]:
        return EXIT_CANNOT_LEARN
    return EXIT_FIRED if result["fired"] else EXIT_QUIET
