"""DAPO dynamic sampling and predictive skipping: what is kept, what is counted, what resumes."""

from __future__ import annotations

import itertools

import pytest
import torch

import rlvr.train as train_mod
from rlvr.batch import Rollouts
from rlvr.config import DapoConfig, load_config
from rlvr.dynamic_sampling import GroupFilter, group_outcomes
from rlvr.rollout.base import Completion
from test_smoke import read_jsonl, smoke_overrides


def part(rewards_BG: list[list[float]], ids: list[str]) -> Rollouts:
    g = len(rewards_BG[0])
    comps = [Completion(b, [5] * (1 + j), "x", "stop") for b in range(len(rewards_BG)) for j in range(g)]
    return Rollouts(
        g,
        [{"prompt": "p", "prompt_id": i} for i in ids],
        [[1]] * len(ids),
        comps,
        torch.tensor([[r] for grp in rewards_BG for r in grp], dtype=torch.float64),
    )


def test_group_outcomes_by_spread_and_sign():
    p = part([[1, 1, 1], [0, 0, 0], [0, 1, 0]], ["a", "b", "c"])
    assert group_outcomes(p) == ["all_pass", "all_fail", "mixed"]


def test_keep_drops_zero_spread_groups_and_accounts_for_every_group():
    f = GroupFilter(DapoConfig(dynamic_sampling=True), 3, seed=0)
    kept = f.keep(part([[1, 1, 1], [0, 0, 0], [0, 1, 0], [2, 1, 2]], ["a", "b", "c", "d"]))
    assert [r["prompt_id"] for r in kept.rows] == ["c", "d"]
    assert kept.rewards_NK.view(-1, 3).tolist() == [[0, 1, 0], [2, 1, 2]]
    out = f.finalize(kept, need=1)
    m = f.pop_metrics()
    assert out.num_groups == 1
    assert m["dapo/groups_generated"] == 4
    assert (
        m["dapo/groups_kept"],
        m["dapo/dropped_all_pass"],
        m["dapo/dropped_all_fail"],
        m["dapo/dropped_surplus"],
    ) == (1, 1, 1, 1)
    assert m["dapo/dropped_tokens"] == 2 * (1 + 2 + 3)


def test_without_dynamic_sampling_everything_is_kept():
    f = GroupFilter(DapoConfig(), 2, seed=0)
    assert f.keep(part([[1, 1], [0, 0]], ["a", "b"])).num_groups == 2


class FakeStream:
    def __init__(self, ids):
        self.it = itertools.cycle(ids)

    def take(self, n):
        return [{"prompt": "p", "prompt_id": next(self.it)} for _ in range(n)]


def test_predictive_skipping_skips_solved_prompts_and_reprobes_some():
    cfg = DapoConfig(skip_solved_prompts=True, skip_after=2, reprobe_fraction=0.0)
    f = GroupFilter(cfg, 2, seed=0)
    for _ in range(2):  # 'a' all-pass twice, 'b' mixed twice
        f.keep(part([[1, 1], [0, 1]], ["a", "b"]))
    drawn = [r["prompt_id"] for r in f.draw(FakeStream(["a", "b"]), 4)]
    assert drawn == ["b", "b", "b", "b"]
    assert f.pop_metrics()["dapo/skipped_prompts"] == 4
    # With re-probing always on, the solved prompt comes back.
    f.cfg = DapoConfig(skip_solved_prompts=True, skip_after=2, reprobe_fraction=1.0)
    assert "a" in [r["prompt_id"] for r in f.draw(FakeStream(["a", "b"]), 4)]


def test_skip_history_survives_a_state_dict_round_trip():
    cfg = DapoConfig(skip_solved_prompts=True, skip_after=2, reprobe_fraction=0.0)
    f = GroupFilter(cfg, 2, seed=0)
    for _ in range(2):
        f.keep(part([[0, 0], [0, 1]], ["a", "b"]))
    g = GroupFilter(cfg, 2, seed=0)
    g.load_state_dict(f.state_dict())
    assert [r["prompt_id"] for r in g.draw(FakeStream(["a", "b"]), 2)] == ["b", "b"]
    fresh = GroupFilter(cfg, 2, seed=0)  # without the history nothing is skipped: the test can fail
    assert [r["prompt_id"] for r in fresh.draw(FakeStream(["a", "b"]), 2)] == ["a", "b"]


def _overrides(model, data, out, reward, *extra):
    over = [o for o in smoke_overrides(model, data, out, *extra) if not o.startswith("rewards=")]
    return over + [f"rewards=[{{name: 'smoke_rewards:{reward}'}}]", "dapo.dynamic_sampling=true"]


def test_no_update_batch_holds_a_zero_spread_group(monkeypatch, tiny_model_dir, sum_dataset, tmp_path):
    seen = []
    real = train_mod.advantage

    def spy(run, batch):
        seen.append(batch.rewards_NK.view(-1, batch.group_size).clone())
        return real(run, batch)

    monkeypatch.setattr(train_mod, "advantage", spy)
    out = tmp_path / "r"
    train_mod.train(
        load_config(
            None,
            _overrides(
                tiny_model_dir,
                sum_dataset,
                out,
                "spread_only_for_big_a",
                "train.max_steps=3",
                "dapo.max_generation_rounds=6",
                "dapo.oversample_factor=2",
            ),
        )
    )
    assert len(seen) == 3
    for rewards_BG in seen:
        assert (rewards_BG.max(dim=1).values - rewards_BG.min(dim=1).values > 0).all()
    for m, rewards_BG in zip(read_jsonl(out / "metrics.jsonl"), seen):
        assert m["dapo/groups_generated"] == m["dapo/groups_kept"] + m.get("dapo/dropped_all_pass", 0) + m.get(
            "dapo/dropped_all_fail", 0
        ) + m.get("dapo/dropped_surplus", 0)
        assert m["dapo/effective_batch"] == m["dapo/groups_kept"] == rewards_BG.shape[0] <= 4  # 16 / G=4
        assert m["dapo/dropped_all_pass"] > 0  # the a < 5 prompts were sampled and dropped


def test_refill_stops_at_the_bound(tiny_model_dir, sum_dataset, tmp_path):
    out = tmp_path / "r"
    result = train_mod.train(
        load_config(
            None,
            _overrides(
                tiny_model_dir, sum_dataset, out, "constant", "train.max_steps=2", "dapo.max_generation_rounds=3"
            ),
        )
    )
    assert result["step"] == 2  # no endless resampling
    for m in read_jsonl(out / "metrics.jsonl"):
        assert m["dapo/rounds"] == 3 and m["dapo/fallback_steps"] == 1
        assert m["dapo/groups_generated"] == 12 and m["dapo/groups_kept"] == 4
        assert m["dapo/dropped_all_pass"] == 8
