"""``rlvr report RUN_DIR``: one self-contained HTML page with the run's curves, warnings and samples.

Reads what the trainer and ``Diagnostics`` wrote in the run folder (metrics.jsonl, samples.jsonl,
warnings.jsonl, header.json, the rollout record) and writes ``report.html`` with every PNG
embedded as base64 (the page can be mailed or attached to an issue on its own) plus the same PNGs
in ``report/`` beside it. Matplotlib draws through the Agg canvas directly, never pyplot, so it
needs no display and leaves no global figure state behind.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rlvr.diagnostics.record import RECORD_NAME
from rlvr.diagnostics.summary import loggable
from rlvr.diagnostics.tracker import SAMPLES_NAME, WARNINGS_NAME

REPORT_NAME = "report.html"
MAX_SAMPLES = 400  # the most recent ones; the full set stays in samples.jsonl
PHASES = ("rollout", "reward", "advantage", "logprobs", "update", "sync", "log")
OUTCOME_COLOURS = {"all_fail": "#d62728", "mixed": "#2ca02c", "all_pass": "#7f7f7f"}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """JSON lines of a file that may still be growing: a torn last line is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def metric_table(run_dir: Path) -> dict[int, dict[str, float]]:
    """``{step: {key: value}}`` from metrics.jsonl, completed from the rollout record.

    The trainer logs every ``logging_steps``; the record holds every step, so group outcomes,
    lengths and truncation are drawn for every step even when metrics.jsonl has fewer (and for a
    bare record with no metrics.jsonl at all). Logged values win where both exist.
    """
    table: dict[int, dict[str, float]] = {}
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        if "step" in row:
            table.setdefault(int(row["step"]), {}).update(
                {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            )
    record = run_dir / RECORD_NAME
    if record.is_file():
        from rlvr.diagnostics.diagnose import step_summaries  # local: diagnose is the heavier module

        for step, summary in step_summaries(record).items():
            row = table.setdefault(step, {"step": step})
            row.update({k: v for k, v in loggable(summary).items() if k not in row})
    return dict(sorted(table.items()))


def curve(table: dict[int, dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    points = [
        (s, row[key]) for s, row in table.items() if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])
    ]
    return [p[0] for p in points], [float(p[1]) for p in points]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


def _panel(title: str, ylabel: str) -> tuple[Figure, Any]:
    fig = Figure(figsize=(6.4, 3.0), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _mark_warnings(ax: Any, warning_steps: Iterable[int]) -> None:
    for i, step in enumerate(sorted(set(warning_steps))):
        ax.axvline(
            step, color="#d62728", linestyle="--", linewidth=1, alpha=0.7, label="monitor warning" if i == 0 else None
        )


def _legend(ax: Any) -> None:
    """Beside the axes, never over the data."""
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)


def line_panel(
    table, title, ylabel, keys: Sequence[tuple[str, str]], warning_steps, bold: str | None = None
) -> bytes | None:
    """One figure with a line per (key, label) that has data; None when none has."""
    fig, ax = _panel(title, ylabel)
    drawn = 0
    for key, label in keys:
        xs, ys = curve(table, key)
        if xs:
            ax.plot(xs, ys, label=label, linewidth=2.2 if key == bold else 1.3, marker="o" if len(xs) < 15 else None)
            drawn += 1
    if not drawn:
        return None
    _mark_warnings(ax, warning_steps)
    _legend(ax)
    return _png(fig)


def stacked_panel(table, title, ylabel, keys: Sequence[tuple[str, str]], warning_steps, colours=None) -> bytes | None:
    steps = [s for s, row in table.items() if any(k in row for k, _ in keys)]
    present = [(k, label) for k, label in keys if any(k in table[s] for s in steps)]
    if not steps or not present:
        return None
    fig, ax = _panel(title, ylabel)
    ys = [[float(table[s].get(k) or 0.0) for s in steps] for k, _ in present]
    colors = [(colours or {}).get(k.split("/")[-1]) for k, _ in present] if colours else [None] * len(present)
    if len(steps) == 1:  # an area of one step has no width: stacked bars say the same and can be seen
        bottom = 0.0
        for (_, label), y, colour in zip(present, ys, colors):
            ax.bar(steps, y, bottom=bottom, width=0.6, label=label, color=colour, alpha=0.85)
            bottom += y[0]
        ax.set_xticks(steps)
        _mark_warnings(ax, warning_steps)
        _legend(ax)
        return _png(fig)
    ax.stackplot(steps, ys, labels=[label for _, label in present], colors=colors if colours else None, alpha=0.85)
    _mark_warnings(ax, warning_steps)
    _legend(ax)
    ax.set_xlim(min(steps), max(steps) if max(steps) > min(steps) else min(steps) + 1)
    return _png(fig)


def eval_panel(table, warning_steps) -> bytes | None:
    """Held-out accuracy as points at the steps it was measured, never joined into a trend line; a run
    evaluated only before and after training is labelled so."""
    keys = sorted({k for row in table.values() for k in row if k.startswith("eval/") and "accuracy" in k})
    fig, ax = _panel("Held-out accuracy", "accuracy")
    drawn = 0
    for key in keys:
        xs, ys = curve(table, key)
        if not xs:
            continue
        ax.plot(xs, ys, linestyle="none", marker="o", markersize=7, label=key.split("/", 1)[1])
        drawn += 1
        if len(xs) == 2:
            for x, y, name in zip(xs, ys, ("before", "after")):
                ax.annotate(f"{name}: {y:.1%}", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
    if not drawn:
        return None
    ax.set_ylim(-0.02, 1.02)
    _mark_warnings(ax, warning_steps)
    _legend(ax)
    return _png(fig)


def monitor_panel(table, warning_steps) -> bytes | None:
    """Each monitor's statistic with its threshold as a dashed line of the same colour."""
    from rlvr.diagnostics.monitors import MonitorConfig, thresholds

    limits = thresholds(MonitorConfig())
    fig, ax = _panel("Hacking monitors", "statistic")
    drawn = 0
    for name, limit in limits.items():
        xs, ys = curve(table, f"hacking/{name}")
        if not xs:
            continue
        (line,) = ax.plot(xs, ys, label=name, linewidth=1.3, marker="o" if len(xs) < 15 else None)
        ax.axhline(limit, color=line.get_color(), linestyle=":", linewidth=1.2, label=f"{name} threshold")
        drawn += 1
    if not drawn:
        return None
    _mark_warnings(ax, warning_steps)
    _legend(ax)
    return _png(fig)


def build_panels(table: dict[int, dict[str, float]], warning_steps: list[int]) -> list[tuple[str, str, bytes]]:
    """(file stem, caption, PNG) for every panel that has data, in reading order."""
    keys = {k for row in table.values() for k in row}
    reward_names = sorted(k.split("/")[1] for k in keys if k.startswith("rewards/") and k.endswith("/mean"))
    # Only the trainer's phases are stacked: a logged total (timing/step) would count everything twice.
    timing = [k for k in (f"timing/{p}" for p in PHASES) if k in keys]
    specs = [
        (
            "reward",
            "Reward per function (mean over completions)",
            line_panel(
                table,
                "Reward",
                "reward",
                [("reward", "total (weighted)")] + [(f"rewards/{n}/mean", n) for n in reward_names],
                warning_steps,
                bold="reward",
            ),
        ),
        (
            "eval",
            "Held-out accuracy at the steps it was evaluated (points, not a trend; before/after when only those ran)",
            eval_panel(table, warning_steps),
        ),
        (
            "groups",
            "Group outcomes: all-fail and all-pass groups teach nothing (every advantage is 0)",
            stacked_panel(
                table,
                "Group outcomes",
                "fraction of groups",
                [("groups/all_fail", "all fail"), ("groups/mixed", "mixed"), ("groups/all_pass", "all pass")],
                warning_steps,
                OUTCOME_COLOURS,
            ),
        ),
        (
            "lengths",
            "Completion length, correct vs incorrect (tokens)",
            line_panel(
                table,
                "Completion length",
                "tokens",
                [
                    ("lengths/correct_mean", "correct"),
                    ("lengths/incorrect_mean", "incorrect"),
                    ("completions/mean_length", "all"),
                ],
                warning_steps,
            ),
        ),
        (
            "truncation",
            "Truncation: share of completions that hit max_completion_length",
            line_panel(
                table,
                "Truncation",
                "rate",
                [
                    ("truncation/rate", "all completions"),
                    ("truncation/rate_all_fail", "in all-fail groups"),
                    ("truncation/rewarded_rate", "truncated and passed"),
                ],
                warning_steps,
            ),
        ),
        (
            "clip",
            "Clip ratios: share of tokens where the clipped branch was active",
            line_panel(
                table,
                "Clip ratios",
                "fraction of tokens",
                [
                    ("clip_ratio/low_mean", "low"),
                    ("clip_ratio/high_mean", "high"),
                    ("clip_ratio/region_mean", "region"),
                ],
                warning_steps,
            ),
        ),
        (
            "entropy",
            "Policy entropy (nats per token)",
            line_panel(table, "Entropy", "nats/token", [("entropy", "entropy")], warning_steps),
        ),
        ("kl", "KL to the reference policy (k3)", line_panel(table, "KL", "nats/token", [("kl", "kl")], warning_steps)),
        (
            "timing",
            "Time per phase (seconds per step)",
            stacked_panel(table, "Time per phase", "seconds", [(k, k.split("/", 1)[1]) for k in timing], warning_steps),
        ),
        (
            "hacking",
            "Reward-hacking monitor statistics; each monitor's threshold is the dotted line of its colour "
            "(docs/diagnostics.md)",
            monitor_panel(table, warning_steps),
        ),
    ]
    return [(stem, caption, png) for stem, caption, png in specs if png is not None]


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def render_sample(sample: dict[str, Any], expanded: bool = False) -> str:
    rewards = " · ".join(
        f"{_esc(k)}={v:.2f}" if isinstance(v, (int, float)) else f"{_esc(k)}=None"
        for k, v in (sample.get("rewards") or {}).items()
    )
    flags = "".join(f'<span class="flag">{_esc(f)}</span>' for f in sample.get("flags") or [])
    verdict = sample.get("verdict")
    verdict_html = f"<pre class=meta>{_esc(json.dumps(verdict, indent=1, default=str))}</pre>" if verdict else ""
    columns = sample.get("columns") or {}
    columns_html = " · ".join(f"{_esc(k)}={_esc(v)}" for k, v in columns.items())
    search = _esc(
        " ".join(str(x) for x in (sample.get("prompt_id"), sample.get("class"), *(sample.get("flags") or []))).lower()
    )
    return (
        f'<details class="sample"{" open" if expanded else ""} data-class="{_esc(sample.get("class"))}" data-search="{search}">'
        f'<summary><b>step {_esc(sample.get("step"))}</b> · <span class="cls {_esc(sample.get("class"))}">{_esc(sample.get("class"))}</span>'
        f" · reward {float(sample.get('reward') or 0):.2f} ({rewards}) · adv {float(sample.get('advantage') or 0):+.2f}"
        f" · {_esc(sample.get('n_tokens'))} tokens, {_esc(sample.get('finish_reason'))} · prompt {_esc(sample.get('prompt_id'))} {flags}</summary>"
        f'<div class="meta">correct={_esc(sample.get("correct"))} · {columns_html}</div>{verdict_html}'
        f"<h4>prompt</h4><pre>{_esc(sample.get('prompt'))}</pre><h4>completion</h4><pre>{_esc(sample.get('completion'))}</pre></details>"
    )


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1400px;color:#222;padding:0 16px}
h1{margin-bottom:4px} .sub{color:#666;margin-top:0}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:16px 0}
.card{border:1px solid #ddd;border-radius:8px;padding:8px 14px;min-width:120px}
.card .v{font-size:22px;font-weight:600} .card .k{color:#666;font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(620px,1fr));gap:14px}
figure{margin:0;border:1px solid #eee;border-radius:8px;padding:6px} figure img{width:100%}
figcaption{font-size:12px;color:#555;padding:2px 6px}
.warn{background:#fff4f4;border-left:4px solid #d62728;padding:6px 10px;margin:6px 0}
.ok{background:#f3fbf3;border-left:4px solid #2ca02c;padding:6px 10px}
details.sample{border:1px solid #e4e4e4;border-radius:6px;margin:4px 0;padding:4px 8px}
details.sample summary{cursor:pointer;font-size:13px}
pre{white-space:pre-wrap;word-break:break-word;background:#fafafa;padding:8px;border-radius:4px;font-size:12px;max-height:420px;overflow:auto}
.meta{font-size:12px;color:#555} .flag{background:#d62728;color:#fff;border-radius:3px;padding:0 4px;margin-left:4px;font-size:11px}
.cls{font-weight:600} .cls.best{color:#2ca02c} .cls.worst{color:#d62728} .cls.truncated{color:#ff7f0e}
.controls{margin:8px 0;display:flex;gap:8px} h4{margin:6px 0 2px;font-size:12px}
"""

_JS = """
function filt(){const c=document.getElementById('cls').value,q=document.getElementById('q').value.toLowerCase();
let n=0;document.querySelectorAll('details.sample').forEach(d=>{const ok=(!c||d.dataset.class===c)&&(!q||d.dataset.search.includes(q)||d.textContent.toLowerCase().includes(q));d.style.display=ok?'':'none';n+=ok});
document.getElementById('count').textContent=n+' shown';}
filt();
"""


def unique_samples(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each (step, prompt, completion) once: a resumed run re-logs its steps, a group repeats texts."""
    seen: set[tuple[Any, str, str]] = set()
    out = []
    for sample in reversed(samples):  # the newest copy wins
        key = (sample.get("step"), str(sample.get("prompt")), str(sample.get("completion")))
        if key not in seen:
            seen.add(key)
            out.append(sample)
    return out[::-1]


def _card(key: str, value: str) -> str:
    return f'<div class="card"><div class="v">{_esc(value)}</div><div class="k">{_esc(key)}</div></div>'


def write_report(run_dir: str | Path) -> Path:
    """Write ``RUN_DIR/report.html`` (+ ``RUN_DIR/report/*.png``) and return the HTML path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"rlvr report: {run_dir} is not a run folder; pass the folder a training run wrote (it holds metrics.jsonl)."
        )
    table = metric_table(run_dir)
    samples = read_jsonl(run_dir / SAMPLES_NAME)
    warnings = read_jsonl(run_dir / WARNINGS_NAME)
    cannot_learn: list[str] = []
    if (run_dir / RECORD_NAME).is_file():
        from rlvr.diagnostics.diagnose import analyse_record

        try:
            analysis = analyse_record(run_dir)
        except ValueError:
            analysis = {"warnings": [], "cannot_learn": []}
        cannot_learn = analysis["cannot_learn"]
        warnings = warnings or analysis["warnings"]
    if not cannot_learn:  # a run without a record: what the trainer said live
        cannot_learn = list(dict.fromkeys(w["message"] for w in warnings if w.get("monitor") == "cannot_learn"))
    warnings = [w for w in warnings if w.get("monitor") != "cannot_learn"]
    samples = unique_samples(samples)
    if not table and not samples:
        raise FileNotFoundError(
            f"rlvr report: {run_dir} has no metrics.jsonl, rollout record or samples.jsonl yet; run at least one "
            "logged step, or point at the folder the trainer was given as output_dir."
        )
    header = json.loads((run_dir / "header.json").read_text()) if (run_dir / "header.json").is_file() else {}
    warning_steps = [int(w["step"]) for w in warnings]

    panels = build_panels(table, warning_steps)
    png_dir = run_dir / "report"
    png_dir.mkdir(exist_ok=True)
    figures = []
    for stem, caption, png in panels:
        (png_dir / f"{stem}.png").write_bytes(png)
        figures.append(
            f'<figure id="fig-{stem}"><img alt="{_esc(caption)}" src="data:image/png;base64,'
            f'{base64.b64encode(png).decode()}"><figcaption>{_esc(caption)}</figcaption></figure>'
        )

    def fmt(key: str, spec: str) -> str:
        """The key's value at the last step that has it."""
        xs, ys = curve(table, key)
        return format(ys[-1], spec) if xs else "—"

    evals = curve(table, "eval/accuracy")
    cards = [
        _card("last step", str(max(table)) if table else "—"),
        _card("reward (last step)", fmt("reward", ".3f")),
        _card("held-out accuracy (last eval)", f"{evals[1][-1]:.1%}" if evals[0] else "—"),
        _card("mixed groups (last step)", fmt("groups/mixed", ".0%")),
        _card("truncation (last step)", fmt("truncation/rate", ".1%")),
        _card("monitor warnings", str(len(warnings))),
    ]
    if warnings:
        timeline = "".join(
            f'<div class="warn"><b>step {_esc(w["step"])} · {_esc(w.get("monitor"))}</b>: {_esc(w.get("message"))}</div>'
            for w in warnings
        )
    else:
        timeline = '<div class="ok">No reward-hacking monitor fired on this run.</div>'
    blocked = "".join(
        f'<div class="warn" id="cannot-learn"><b>This run cannot learn:</b> {_esc(reason)}</div>'
        for reason in cannot_learn
    )
    shown = samples[-MAX_SAMPLES:]
    sample_html = "".join(render_sample(s, expanded=i < 2) for i, s in enumerate(reversed(shown)))
    title = header.get("run_name") or run_dir.resolve().name
    header_html = (
        f"<details><summary>run header (config, versions, fingerprints)</summary><pre>{_esc(json.dumps(header, indent=2, default=str))}</pre></details>"
        if header
        else ""
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rlvr report · {_esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>
<body>
<h1>rlvr run report</h1>
<p class="sub">{_esc(run_dir.resolve())} · generated {datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
{" · git " + _esc(header.get("git_revision")) if header.get("git_revision") else ""}</p>
{blocked}<div class="cards">{"".join(cards)}</div>
{header_html}
<h2>Monitor warnings</h2>{timeline}
<h2>Curves</h2><p class="meta">Red dashed lines mark steps where a monitor warned.</p>
<div class="grid">{"".join(figures) or "<p>No metrics logged yet.</p>"}</div>
<h2>Sample completions</h2>
<p class="meta">{len(shown)} of {len(samples)} samples (most recent first; all of them are in samples.jsonl).</p>
<div class="controls"><select id="cls" onchange="filt()"><option value="">all classes</option><option>best</option><option>worst</option><option>truncated</option></select>
<input id="q" placeholder="search text, prompt id or flag" oninput="filt()" size="40"><span id="count" class="meta"></span></div>
{sample_html or "<p>No samples yet.</p>"}
<script>{_JS}</script>
</body></html>
"""
    out = run_dir / REPORT_NAME
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out
