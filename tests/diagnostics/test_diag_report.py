import base64
import json
import re
import shutil
import subprocess

import pytest
from diag_synthetic import HACKING_POLICIES, write_fake_run

from rlvr.diagnostics import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    write_fake_run(run_dir, HACKING_POLICIES["answer_spraying"](), steps=30)
    # A completion that would break the page if it were not escaped.
    with open(run_dir / "samples.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "step": 29,
                    "class": "worst",
                    "prompt_id": "evil",
                    "completion": "</pre><script>document.body.innerHTML='pwned'</script>",
                    "reward": 0.0,
                    "rewards": {"correct": 0.0},
                    "flags": [],
                }
            )
            + "\n"
        )
    return run_dir, write_report(run_dir)


def test_report_is_self_contained(report):
    run_dir, path = report
    assert path == run_dir / "report.html"
    page = path.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    # reward, eval, groups, lengths, truncation, clip, entropy, kl, timing, hacking
    assert len(images) == 10
    assert all(base64.b64decode(img)[:8] == PNG_MAGIC for img in images)
    assert sorted(p.name for p in (run_dir / "report").glob("*.png")) == sorted(
        f"{s}.png"
        for s in ("reward", "eval", "groups", "lengths", "truncation", "clip", "entropy", "kl", "timing", "hacking")
    )
    assert not re.search(r'src="(?!data:)', page)  # nothing fetched from elsewhere
    assert 'class="warn"' in page and "answer_spraying" in page
    assert "<script>document.body" not in page and "&lt;script&gt;document.body" in page


def test_report_needs_a_run_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        write_report(tmp_path)


def chromium(*args, tmp_path):
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    from matplotlib.image import imread

    _, path = report
    shot = tmp_path / "report.png"
    chromium("--window-size=1400,2400", f"--screenshot={shot}", path.as_uri(), tmp_path=tmp_path)
    assert shot.is_file(), "chromium wrote no screenshot"
    pixels = imread(shot)[..., :3]  # H x W x RGB floats in [0, 1]
    assert pixels.shape[:2] == (2400, 1400)
    non_white = (pixels.min(axis=-1) < 0.9).mean()
    assert non_white > 0.05, "the page rendered (nearly) blank"
    # The warning banner's red border (#d62728) is on screen.
    red = (
        (abs(pixels[..., 0] - 0xD6 / 255) < 0.03)
        & (abs(pixels[..., 1] - 0x27 / 255) < 0.03)
        & (abs(pixels[..., 2] - 0x28 / 255) < 0.03)
    )
    assert red.sum() > 100

    dom = chromium("--dump-dom", path.as_uri(), tmp_path=tmp_path).stdout
    # The inline script ran on load and counted the browsable samples; the escaped script did not run.
    assert re.search(r'id="count"[^>]*>\d+ shown<', dom)
    assert "<h1>rlvr run report</h1>" in dom


def test_report_from_a_bare_record(tmp_path):
    # No metrics.jsonl (a run logged elsewhere): group outcomes, lengths and truncation come from the record.
    from diag_synthetic import Policy, run_policy

    run_policy(Policy(), 12, seed=0, run_dir=tmp_path)
    page = write_report(tmp_path).read_text()
    assert 'id="fig-groups"' in page and 'id="fig-lengths"' in page and 'id="fig-truncation"' in page
    assert 'id="fig-reward"' not in page  # the trainer's reward curve is not in the record's summaries
    assert '<div class="v">11</div><div class="k">last step</div>' in page  # steps 0..11


def figures_of(table, monkeypatch):
    """build_panels with the PNG step skipped: (stem, matplotlib Figure) pairs to inspect."""
    from rlvr.diagnostics import report as report_module

    monkeypatch.setattr(report_module, "_png", lambda fig: fig)
    return {stem: fig for stem, _, fig in report_module.build_panels(table, [])}


def test_one_step_run_has_no_empty_chart(tmp_path, monkeypatch):
    from rlvr.diagnostics.report import metric_table

    write_fake_run(tmp_path, steps=1, eval_every=1)
    figures = figures_of(metric_table(tmp_path), monkeypatch)
    assert figures
    for stem, fig in figures.items():
        ax = fig.axes[0]
        visible = [p for p in ax.patches if p.get_height() > 0] + [ln for ln in ax.lines if len(ln.get_xdata())]
        assert visible, f"panel {stem} draws nothing on a one-step run"
    assert figures["groups"].axes[0].patches  # stacked bars, not a zero-width area


def test_monitor_chart_draws_each_threshold_and_eval_is_points(tmp_path, monkeypatch):
    from rlvr.diagnostics.monitors import MonitorConfig, thresholds
    from rlvr.diagnostics.report import metric_table

    write_fake_run(tmp_path, HACKING_POLICIES["answer_spraying"](), steps=20)
    figures = figures_of(metric_table(tmp_path), monkeypatch)
    ax = figures["hacking"].axes[0]
    drawn = [ln for ln in ax.lines if not ln.get_label().endswith("threshold") and ln.get_linestyle() == "-"]
    limits = [ln for ln in ax.lines if ln.get_label().endswith("threshold")]
    assert len(limits) == len(drawn) >= 1
    for line in limits:
        name = line.get_label().removesuffix(" threshold")
        assert set(line.get_ydata()) == {thresholds(MonitorConfig())[name]}
        assert line.get_color() == next(d.get_color() for d in drawn if d.get_label() == name)
    eval_lines = figures["eval"].axes[0].lines
    assert eval_lines and all(ln.get_linestyle() == "None" for ln in eval_lines)  # points, no trend line


def test_the_same_sample_is_shown_once(tmp_path):
    write_fake_run(tmp_path, steps=5)
    samples = (tmp_path / "samples.jsonl").read_text().splitlines()
    with open(tmp_path / "samples.jsonl", "a") as f:  # a resumed run logs the same step again
        f.writelines(line + "\n" for line in samples)
    page = write_report(tmp_path).read_text()
    assert page.count('<details class="sample"') == len(samples)
