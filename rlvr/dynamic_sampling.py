"""Which groups a generation batch keeps: DAPO dynamic sampling and predictive prompt skipping.

This is the config's ``dapo:`` section (batch assembly), not the ``dapo`` loss preset
(``algo.loss_type``, an aggregation): either can be used without the other. The loop's ``collect``
phase uses a ``GroupFilter`` only when one of the two mechanisms is on.

A group whose rewards are all equal has zero advantage everywhere and teaches nothing. Two
mechanisms, both off by default:

- **Dynamic sampling** (DAPO, Yu et al. 2025, §3.2): drop zero-spread groups and sample more prompts
  until the batch holds the configured number of informative groups, for at most
  ``max_generation_rounds`` rounds; then train on what there is and warn once, with the numbers.
- **Predictive skipping** (beyond the paper): remember each prompt's recent outcomes and do not
  even sample a prompt that was all-pass (or all-fail) the last ``skip_after`` times it was seen,
  except with probability ``reprobe_fraction``, so a prompt the policy has forgotten can come back.
  It saves the generation that dynamic sampling would have thrown away. It only acts on prompts that
  recur (file datasets over several epochs, or a task with a small prompt space).

Accounting: ``dapo/groups_generated = dapo/groups_kept + dapo/dropped_all_pass + dapo/dropped_all_fail
+ dapo/dropped_surplus`` for every generation batch (a test checks it). The counters of one batch are
logged together; with ``logging_steps > 1`` the batches between logged steps are not summed in.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any, Callable

import torch

from rlvr import core
from rlvr.batch import Rollouts
from rlvr.config import DapoConfig


def group_outcomes(batch: Rollouts, weights_K: torch.Tensor | None = None) -> list[str]:
    """'all_pass' | 'all_fail' | 'mixed' per group, as dynamic sampling needs it: 'mixed' means the
    weighted reward has spread (some advantage is non-zero), whatever the verdicts say; a zero-spread
    group is all_pass / all_fail by its verdicts, or by the sign of its shared reward without them.
    (diagnostics' `group_outcome` classifies by verdicts first: it answers "was it solved", not
    "does it carry gradient".)"""
    g, out = batch.group_size, []
    if weights_K is None:
        weights_K = torch.ones(batch.rewards_NK.shape[1], dtype=torch.float64)
    total_N = core.total_reward(batch.rewards_NK, weights_K)
    zero_spread_B = core.zero_spread(total_N, g).tolist()
    for b in range(batch.num_groups):
        if not zero_spread_B[b]:
            out.append("mixed")
            continue
        verdicts = batch.verdicts[b * g : (b + 1) * g] if batch.verdicts else []
        if verdicts and all(v is not None for v in verdicts):
            out.append("all_pass" if all(v.correct for v in verdicts) else "all_fail")
        else:  # the shared reward's sign (an unscorable group, NaN throughout, is all_fail)
            out.append("all_pass" if float(total_N[b * g : (b + 1) * g].nan_to_num(0.0).max()) > 0 else "all_fail")
    return out


class GroupFilter:
    """Decides which prompts are drawn and which sampled groups are kept; counts every decision (``dapo/*``).
    ``warn`` is the console's warning channel."""

    def __init__(
        self,
        cfg: DapoConfig,
        group_size: int,
        seed: int,
        weights_K: torch.Tensor | None = None,
        warn: Callable[[str], None] = print,
    ):
        self.cfg, self.group_size, self.seed = cfg, group_size, seed
        self.weights_K, self.warn = weights_K, warn
        self.history: dict[str, list[str]] = defaultdict(list)  # prompt_id -> recent outcomes
        self.draws = 0  # for the re-probe coin, seeded per draw: resumable without RNG state
        self.warned_short = False
        self._m: dict[str, float] = defaultdict(float)

    # -------------------------------------------------------------- drawing prompts
    def prompts_to_draw(self, missing: int) -> int:
        if not self.cfg.dynamic_sampling:
            return missing
        return max(1, math.ceil(missing * self.cfg.oversample_factor))

    def _skippable(self, prompt_id: str) -> bool:
        recent = self.history.get(prompt_id, [])[-self.cfg.skip_after :]
        return len(recent) == self.cfg.skip_after and len(set(recent)) == 1 and recent[0] != "mixed"

    def draw(self, stream: Any, n: int) -> list[dict]:
        if not self.cfg.skip_solved_prompts:
            return stream.take(n)
        rows: list[dict] = []
        looked = 0
        while len(rows) < n:
            (row,) = stream.take(1)
            looked += 1
            pid = str(row.get("prompt_id"))
            self.draws += 1
            coin = random.Random(self.seed * 7_919 + self.draws).random()
            # Bounded: after 20·n looks, take prompts regardless (a fully solved dataset still trains).
            if self._skippable(pid) and coin >= self.cfg.reprobe_fraction and looked < 20 * n:
                self._m["dapo/skipped_prompts"] += 1
                continue
            if self._skippable(pid):
                self._m["dapo/reprobed_prompts"] += 1
            rows.append(row)
        return rows

    # -------------------------------------------------------------- keeping groups
    def keep(self, part: Rollouts) -> Rollouts:
        outcomes = group_outcomes(part, self.weights_K)
        for row, outcome in zip(part.rows, outcomes):
            hist = self.history[str(row.get("prompt_id"))]
            hist.append(outcome)
            del hist[: -max(self.cfg.skip_after, 4)]
        self._m["dapo/rounds"] += 1
        self._m["dapo/groups_generated"] += part.num_groups
        self._m["dapo/tokens_generated"] += sum(len(c.token_ids) for c in part.completions)
        self._m["dapo/informative_groups"] += sum(o == "mixed" for o in outcomes)
        if not self.cfg.dynamic_sampling:
            self._m["dapo/groups_kept"] += part.num_groups
            return part
        keep_B = [b for b, o in enumerate(outcomes) if o == "mixed"]
        g = self.group_size
        for b, o in enumerate(outcomes):
            if o != "mixed":
                self._m[f"dapo/dropped_{o}"] += 1
                self._m["dapo/dropped_tokens"] += sum(len(c.token_ids) for c in part.completions[b * g : (b + 1) * g])
        self._m["dapo/groups_kept"] += len(keep_B)
        return part.select_groups(keep_B)

    def finalize(self, batch: Rollouts, need: int, last_part: Rollouts | None = None) -> Rollouts:
        """Cut the kept groups to `need`. If no group had spread after every round, train on the last
        round's groups anyway: their advantages are all 0, so the step moves nothing but the KL term and
        the schedule, and the run cannot spin forever on data the policy always (or never) solves."""
        if batch.num_groups == 0 and last_part is not None and self.cfg.dynamic_sampling:
            self.warn(
                f"dynamic sampling: no group had reward spread in {self.cfg.max_generation_rounds} "
                "rounds; this step trains on zero-advantage groups (nothing to learn from this data now)."
            )
            self._m["dapo/fallback_steps"] += 1
            for o in group_outcomes(last_part, self.weights_K):  # keep() counted them dropped: undo
                self._m[f"dapo/dropped_{o}"] -= 1
            self._m["dapo/dropped_tokens"] -= sum(len(c.token_ids) for c in last_part.completions)
            self._m["dapo/groups_kept"] += last_part.num_groups
            batch = last_part
        if batch.num_groups > need:  # the last round over-delivered: extra groups are wasted generation
            surplus = batch.num_groups - need
            self._m["dapo/groups_kept"] -= surplus
            self._m["dapo/dropped_surplus"] += surplus
            batch = batch.select_groups(list(range(need)))
        elif batch.num_groups < need and self.cfg.dynamic_sampling and not self.warned_short:
            self.warned_short = True
            self.warn(
                f"dynamic sampling: only {batch.num_groups} of {need} groups had reward spread after "
                f"{self.cfg.max_generation_rounds} rounds; training on those. Raise dapo.max_generation_rounds "
                "or dapo.oversample_factor, or use easier/harder prompts. (Shown once.)"
            )
        self._m["dapo/effective_batch"] = float(batch.num_groups)
        return batch

    def pop_metrics(self) -> dict[str, float]:
        out, self._m = dict(self._m), defaultdict(float)
        return out

    # -------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {"history": dict(self.history), "draws": self.draws, "warned_short": self.warned_short}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = defaultdict(list, {k: list(v) for k, v in state["history"].items()})
        self.draws, self.warned_short = state["draws"], state["warned_short"]
