"""Verdict.to_dict: the record form of a checker's verdict (what samples.jsonl and the rollout record hold)."""

from __future__ import annotations

import dataclasses

from rlvr.rewards.base import Verdict


def test_to_dict_has_every_field_as_asdict_gives_it_and_does_not_share_extra():
    v = Verdict(
        correct=True, reward=1.0, extracted="42", path="boxed", n_candidates=2, reason="ok", seconds=0.5,
        extra={"candidates": ["41", "42"], "limits": {"n": 3}, "note": "x"},
    )  # fmt: skip
    d = v.to_dict()
    assert d == dataclasses.asdict(v)
    assert list(d) == [f.name for f in dataclasses.fields(Verdict)]
    d["extra"]["note"] = "changed"
    d["extra"]["candidates"].append("43")
    d["extra"]["limits"]["n"] = 4
    assert v.extra == {"candidates": ["41", "42"], "limits": {"n": 3}, "note": "x"}
