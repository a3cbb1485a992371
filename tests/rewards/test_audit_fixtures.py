"""The fixture suites as CI tests, and the ``rlvr audit`` runner's report and exit codes."""

from __future__ import annotations

import json

import pytest

from rlvr.rewards.audit import audit, load_cases, run_audit


@pytest.mark.parametrize("checker", ["math", "json"])  # code's suite runs in test_code_sandbox.py
def test_builtin_suite_has_no_disagreement(checker):
    report = audit(checker, load_cases(checker))
    assert report["disagreements"] == []
    assert report["false_positives"] == 0 and report["false_negatives"] == 0 and report["errors"] == 0


def test_math_suite_is_big_and_covers_every_attack_family():
    rows = load_cases("math")
    categories = {r["category"] for r in rows}
    assert len(rows) >= 300
    assert {
        "correct_form",
        "wrong_close",
        "sprayed",
        "hedged",
        "truncated",
        "no_anchor",
        "code_injection",
        "hang",
        "approx_exact",
        "hedge_interval",
        "value_words",
        "two_answers",
        "well_formed",
    } <= categories
    assert sum(r["expected"] for r in rows) >= 100 and sum(not r["expected"] for r in rows) >= 100


def test_exit_codes_and_json_report(tmp_path, capsys):
    cases = tmp_path / "cases.jsonl"
    lines = [
        {"completion": "\\boxed{18}", "gold": "18", "expected": True},
        {
            "completion": "\\boxed{17}",
            "gold": "18",
            "expected": True,
            "name": "mislabeled",
        },  # the checker rightly rejects: a disagreement
    ]
    cases.write_text("\n".join(json.dumps(x) for x in lines))
    assert run_audit("math", str(cases), as_json=True) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["false_negatives"] == 1 and report["true_positives"] == 1
    assert report["disagreements"][0]["name"] == "mislabeled"
    cases.write_text(json.dumps(lines[0]))
    assert run_audit("math", str(cases)) == 0
    assert "no disagreements" in capsys.readouterr().out


def test_bad_case_files_are_explained(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"completion": "x"}\n')
    assert run_audit("math", str(bad)) == 2
    assert "gold" in capsys.readouterr().err
    assert run_audit("math", str(tmp_path / "missing.jsonl")) == 2
    assert run_audit("lean", None) == 2


def test_audit_accepts_a_custom_checker():
    # A checker that accepts everything: the audit must expose it through false positives.
    from rlvr.rewards.base import Verdict

    def gullible(row):
        return Verdict(True, 1.0, reason="ok")

    report = audit(gullible, load_cases("json"))
    assert report["checker"] == "gullible"
    assert report["false_positives"] == sum(not r["expected"] for r in load_cases("json")) > 0


def test_report_has_rates_slowest_case_isolation_and_tamper_proofing(tmp_path, capsys):
    report = audit("math", [r for r in load_cases("math") if r["category"] in ("well_formed", "approx_exact")])
    assert report["well_formed_cases"] >= 60
    assert report["well_formed_false_negative_rate"] < 0.05  # the bar; the suite itself is at 0
    assert report["slowest_case"]["name"] is not None and report["slowest_case"]["seconds"] > 0
    cases = tmp_path / "code.jsonl"
    rows = [
        {"name": "kept", "completion": "def f(x):\n    return x\n", "tests": ["assert f(1) == 1"], "expected": True},
        {
            "name": "inside",
            "completion": "def f(x):\n    return x\n",
            "tests": ["def ref(x):\n    return x\nassert f(2) == ref(2)"],
            "expected": True,
        },
    ]
    cases.write_text("\n".join(json.dumps(r) for r in rows))
    assert run_audit("code", str(cases)) == 0
    out = capsys.readouterr().out
    assert "sandbox isolation:" in out and "not tamper-proof: 1 case(s)" in out and "inside: tests [0]" in out
    assert run_audit("code", str(cases), as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert [x["name"] for x in report["not_tamper_proof"]] == ["inside"] and report["isolation"]


def test_docs_state_the_real_fixture_counts():
    import re
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "checkers.md").read_text()
    for checker in ("math", "code", "json"):
        stated = re.search(rf"rlvr audit --checker {checker}\b[^\n]*\((\d+) cases\)", docs)
        assert stated, f"docs/checkers.md should state the size of the {checker} suite"
        assert int(stated.group(1)) == len(load_cases(checker)), checker
