import json
from pathlib import Path

import pytest
from diag_synthetic import HACKING_POLICIES, Policy, run_policy

from rlvr.diagnostics import diagnose, fingerprint_checker, fingerprint_rows
from rlvr.diagnostics.diagnose import analyse_record
from rlvr.diagnostics.record import RECORD_NAME


def test_healthy_run_exits_zero(tmp_path, capsys):
    run_policy(Policy(), 30, seed=0, run_dir=tmp_path)
    assert diagnose(tmp_path) == 0
    out = capsys.readouterr().out
    assert "1920 completions, 30 steps" in out  # 30 steps x 8 prompts x 8 completions
    assert "no reward-hacking monitor fired" in out


@pytest.mark.parametrize("monitor", ["format_farming", "truncation_gaming"])
def test_hacking_run_exits_one_and_matches_live_warnings(tmp_path, capsys, monitor):
    _, trace = run_policy(HACKING_POLICIES[monitor](), 25, seed=0, run_dir=tmp_path)
    live = [(step, w) for step, _, ws in trace for w in ws]
    assert diagnose(tmp_path / RECORD_NAME, as_json=True) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["monitors"][monitor]["first_fired"] is not None
    # Same code path as the trainer: the same warnings at the same steps.
    assert [(w["step"], w["message"]) for w in result["warnings"]] == live


def test_spraying_detected_offline_from_stored_decoy_verdicts(tmp_path):
    from diag_synthetic import lenient_numbers_checker

    run_policy(
        HACKING_POLICIES["answer_spraying"](),
        20,
        seed=0,
        run_dir=tmp_path,
        reward_funcs={"correct": lenient_numbers_checker},
    )
    result = analyse_record(tmp_path)
    assert result["fired"] and result["monitors"]["answer_spraying"]["first_fired"] is not None
    assert "re-checked" in result["warnings"][0]["message"]


def test_group_table_and_sources(tmp_path):
    run_policy(Policy(), 30, seed=0, run_dir=tmp_path)
    result = analyse_record(tmp_path)
    assert len(result["table"]) <= 12  # 30 steps shown in buckets
    for row in result["table"]:
        assert row["all_fail"] + row["mixed"] + row["all_pass"] == pytest.approx(1.0)
    assert set(result["sources"]) == {"easy", "hard"}
    assert sum(s["groups"] for s in result["sources"].values()) == 30 * 8


def test_missing_record_exits_two(tmp_path, capsys):
    assert diagnose(tmp_path) == 2
    assert "no rollout record" in capsys.readouterr().err


def test_module_entry_point(tmp_path, capsys):
    from rlvr.diagnostics.__main__ import main

    run_policy(HACKING_POLICIES["format_farming"](), 20, seed=0, run_dir=tmp_path)
    assert main(["diagnose", str(tmp_path)]) == 1
    assert "WARNING step" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_fingerprints():
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    fp = fingerprint_rows(rows)
    assert fp.startswith("sha256:") and fp.endswith("/2")
    assert fingerprint_rows([{"answer": "1", "prompt": "a"}, rows[1]]) == fp  # key order inside a row is irrelevant
    assert fingerprint_rows(rows[::-1]) != fp  # row order is part of the run
    assert fingerprint_rows([rows[0], {"prompt": "b", "answer": "3"}]) != fp

    def checker(prompts, completions, completion_ids, **kw):
        return [0.0] * len(completions)

    checker.gold_column = "answer"
    checker.tolerance = 1e-6
    fp_checker = fingerprint_checker(checker)
    assert fp_checker["name"] == "checker" and fp_checker["options"] == {"gold_column": "answer", "tolerance": 1e-6}
    assert fp_checker["source"].startswith("sha256:")


def test_run_fingerprints_for_the_header():
    from rlvr.diagnostics import run_fingerprints

    def checker(prompts, completions, completion_ids, **kw):
        return [0.0] * len(completions)

    fp = run_fingerprints([{"prompt": "1+1=", "answer": "2"}], {"math": checker})
    assert fp["dataset"] == fingerprint_rows([{"prompt": "1+1=", "answer": "2"}])
    assert fp["checkers"]["math"]["name"] == "checker"
    json.dumps(fp)  # goes straight into header.json


def test_importing_diagnostics_does_not_load_matplotlib():
    import subprocess
    import sys

    code = "import sys, rlvr.diagnostics; print('matplotlib' in sys.modules)"
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo).stdout
    assert out.strip() == "False"
