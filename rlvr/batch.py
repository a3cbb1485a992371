"""The data one generation batch carries from rollout to update.

``Rollouts`` holds python lists while groups are still being sampled, scored and (with DAPO's
dynamic sampling) filtered; ``pack`` turns the kept groups into tensors once, for the log-prob and
update phases. Suffixes: B prompts, G group size, N = B·G completions, P prompt tokens (left-padded),
T completion tokens (right-padded), K reward functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rlvr import core
from rlvr.rewards.base import Verdict
from rlvr.rollout.base import Completion


@dataclass
class Rollouts:
    group_size: int
    rows: list[dict] = field(default_factory=list)  # B dataset rows
    prompt_ids: list[list[int]] = field(default_factory=list)  # B
    completions: list[Completion] = field(default_factory=list)  # N, grouped contiguously
    rewards_NK: torch.Tensor | None = None  # float64, NaN = not scorable
    verdicts: list[Verdict | None] = field(default_factory=list)  # N
    policy_lag: int = 0  # optimizer steps the sampling weights were behind the policy (stale samplers)

    @property
    def num_groups(self) -> int:
        return len(self.rows)

    def __len__(self) -> int:
        return len(self.completions)

    def extend(self, other: "Rollouts") -> None:
        self.rows += other.rows
        self.prompt_ids += other.prompt_ids
        self.completions += other.completions
        self.verdicts += other.verdicts
        self.policy_lag = max(self.policy_lag, other.policy_lag)
        if other.rewards_NK is not None:
            self.rewards_NK = (
                other.rewards_NK if self.rewards_NK is None else torch.cat([self.rewards_NK, other.rewards_NK])
            )

    def select_groups(self, keep_B: list[int]) -> "Rollouts":
        g = self.group_size
        idx_N = [b * g + j for b in keep_B for j in range(g)]
        return Rollouts(
            group_size=g,
            rows=[self.rows[b] for b in keep_B],
            prompt_ids=[self.prompt_ids[b] for b in keep_B],
            completions=[self.completions[i] for i in idx_N],
            rewards_NK=None if self.rewards_NK is None else self.rewards_NK[idx_N],
            verdicts=[self.verdicts[i] for i in idx_N] if self.verdicts else [],
            policy_lag=self.policy_lag,
        )

    def truncated_N(self) -> list[bool]:
        return [c.truncated for c in self.completions]

    def total_reward_N(self, weights_K: list[float]) -> torch.Tensor:
        """Weighted reward per completion; NaN where no reward function could score it."""
        return core.total_reward(self.rewards_NK, torch.tensor(weights_K, dtype=torch.float64))


@dataclass
class PackedBatch:
    """Tensors for the trainer's forward passes over [prompt | completion]."""

    input_ids_NL: torch.Tensor  # L = P + T
    attention_mask_NL: torch.Tensor
    position_ids_NL: torch.Tensor
    completion_ids_NT: torch.Tensor
    mask_NT: torch.Tensor  # 1 on real completion tokens (incl. the first EOS), float
    prompt_len: int  # P
    sampler_logp_NT: torch.Tensor | None  # NaN on the rows of completions the engine reported no log-probs for

    @property
    def num_completion_tokens(self) -> int:
        return self.completion_ids_NT.shape[1]

    def micro_batches(self, size: int) -> list[slice]:
        """Row slices of ``size`` completions (the last may be shorter)."""
        return [slice(i, i + size) for i in range(0, self.input_ids_NL.shape[0], size)]

    def rows(self, idx: slice) -> "PackedBatch":
        return PackedBatch(
            self.input_ids_NL[idx],
            self.attention_mask_NL[idx],
            self.position_ids_NL[idx],
            self.completion_ids_NT[idx],
            self.mask_NT[idx],
            self.prompt_len,
            None if self.sampler_logp_NT is None else self.sampler_logp_NT[idx],
        )


@dataclass
class LogProbs:
    """What the log-prob phase hands the update: per-token tensors over the whole generation batch."""

    old_NT: torch.Tensor | None  # sampling-time policy; None when the ratio is exactly 1 (no pass needed)
    ref_NT: torch.Tensor | None  # frozen reference; None when beta = 0
    loss_mask_NT: torch.Tensor  # completion tokens that carry loss (truncated rows out with DAPO's overlong filter)
    sampler_weight_NT: torch.Tensor | None  # truncated importance weights pi_old / pi_sampler, or None
    sampler_metrics: dict[str, torch.Tensor]


def pack(rollouts: Rollouts, pad_token_id: int, device: torch.device) -> PackedBatch:
    g = rollouts.group_size
    prompts = [rollouts.prompt_ids[i // g] for i in range(len(rollouts))]
    comps = [c.token_ids for c in rollouts.completions]
    n, P = len(comps), max(len(p) for p in prompts)
    T = max(1, max(len(c) for c in comps))
    # Rows built as Python lists and converted once: per-row tensor writes cost ~8 ops x a few microseconds each,
    # which for the shipped task's 256 short rows was ~10% of its whole step.
    ids, attn = [], []
    for p, c in zip(prompts, comps):
        ids.append([pad_token_id] * (P - len(p)) + list(p) + list(c) + [pad_token_id] * (T - len(c)))
        attn.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (T - len(c)))
    ids_NL, attn_NL = torch.tensor(ids, dtype=torch.long), torch.tensor(attn, dtype=torch.long)
    mask_NT = attn_NL[:, P:].float()  # prompt left-padded, completion right-padded
    # An engine may report log-probs for some completions only (a server that dropped misaligned ones):
    # those rows are NaN, which the mismatch metrics and the importance weights read as "not scored".
    sampler_NT = None
    if any(c.logprobs is not None for c in rollouts.completions):
        nan = float("nan")
        sampler_NT = torch.tensor(
            [
                [nan] * T if c.logprobs is None else list(c.logprobs) + [0.0] * (T - len(c.logprobs))
                for c in rollouts.completions
            ],
            dtype=torch.float32,
        )
    # Positions count real tokens only, as generation does: a left-padded prompt must see the same
    # rotary positions in training as when it was sampled, or trainer and sampler log-probs drift.
    pos_NL = (attn_NL.cumsum(-1) - 1).clamp(min=0)
    return PackedBatch(
        ids_NL.to(device),
        attn_NL.to(device),
        pos_NL.to(device),
        ids_NL[:, P:].to(device),
        mask_NT.to(device),
        P,
        None if sampler_NT is None else sampler_NT.to(device),
    )


def batch_metrics(batch: Rollouts, reward_fns: list, reward_errors: dict[str, int]) -> dict[str, float]:
    """TRL's reward and completion metrics for one generation batch (docs/metrics.md)."""
    rewards_NK, g = batch.rewards_NK, batch.group_size
    total_N = batch.total_reward_N([rf.weight for rf in reward_fns])  # unscorable rows NaN: left out of means
    lengths = torch.tensor([len(c.token_ids) for c in batch.completions], dtype=torch.float64)
    trunc = torch.tensor(batch.truncated_N())
    m: dict[str, float] = {
        "reward": total_N.nanmean().item(),
        "reward_std": core.nanstd(total_N.view(-1, g), dim=1).nanmean().item(),
        "frac_reward_zero_std": core.zero_spread(total_N, g).double().mean().item(),
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": trunc.double().mean().item(),
        "completions/mean_terminated_length": lengths[~trunc].mean().item() if (~trunc).any() else 0.0,
        "num_tokens": lengths.sum().item(),
        "policy_lag": float(batch.policy_lag),
    }
    for j, rf in enumerate(reward_fns):
        col = rewards_NK[:, j]
        ok = ~torch.isnan(col)
        m[f"rewards/{rf.name}/mean"] = col[ok].mean().item() if ok.any() else float("nan")
        m[f"rewards/{rf.name}/std"] = col[ok].std().item() if ok.sum() > 1 else 0.0
        m[f"rewards/{rf.name}/errors"] = float(reward_errors.get(rf.name, 0))
        stats = getattr(rf.fn, "stats", None)  # checkers count their verdict reasons since the run began
        if stats is not None:
            m[f"rewards/{rf.name}/timeouts"] = float(stats.get("timeout", 0))
    return m


def completion_records(batch: Rollouts, reward_fns: list, adv_N: torch.Tensor, step: int) -> list[dict]:
    """One JSON-able dict per completion: what diagnostics and the rollout record read
    (docs/rollout-record.md)."""
    g, out = batch.group_size, []
    total_N = batch.total_reward_N([rf.weight for rf in reward_fns]).tolist()
    rewards_NK, adv_N = batch.rewards_NK.tolist(), adv_N.tolist()  # one conversion, not two tensor reads per row
    for i, c in enumerate(batch.completions):
        row, rw = batch.rows[i // g], rewards_NK[i]
        v = batch.verdicts[i] if batch.verdicts else None
        out.append(
            {
                "step": step,
                "prompt_id": str(row.get("prompt_id", i // g)),
                "group": i // g,
                "index": i % g,
                "prompt": row["prompt"] if isinstance(row["prompt"], str) else str(row["prompt"]),
                "completion": c.text,
                "n_tokens": len(c.token_ids),
                "finish_reason": c.finish_reason,
                "truncated": c.truncated,
                "rewards": {rf.name: (None if math.isnan(x) else x) for rf, x in zip(reward_fns, rw)},
                "reward": None if math.isnan(total_N[i]) else total_N[i],
                "advantage": float(adv_N[i]),
                "correct": None if v is None else bool(v.correct),
                "verdict": None if v is None else v.to_dict(),
                "data_source": row.get("data_source"),
                "columns": {k: val for k, val in row.items() if k not in ("prompt", "prompt_id", "data_source")},
            }
        )
    return out
