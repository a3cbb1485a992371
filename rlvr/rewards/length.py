"""DAPO's soft overlong punishment as a reward function (Yu et al. 2025, DAPO, §3.4, eq. 13).

With ``L_max`` the maximum completion length and ``L_cache`` the punishment buffer:

    R_length(y) = 0                                   if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                = -1                                  if |y| > L_max

added to the correctness reward, scaled by a penalty factor (the paper uses factor 1.0 with
L_max = 20480, L_cache = 4096). |y| is the number of completion tokens, read from
``completion_ids`` (what the policy actually produced), never from the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlvr.rewards.base import REWARDS


class OverlongPenalty:
    kind = "length"
    gold_column = None

    def __init__(
        self, max_completion_length: int, buffer: int | None = None, penalty: float = 1.0, name: str = "overlong"
    ):
        if not (isinstance(max_completion_length, int) and max_completion_length > 0):
            raise ValueError(
                f"overlong reward: max_completion_length must be a positive integer (L_max), got {max_completion_length!r}"
            )
        if buffer is None:
            buffer = max(1, max_completion_length // 5)  # DAPO's 4096 of 20480
        if not (0 < buffer <= max_completion_length):
            raise ValueError(
                f"overlong reward: buffer (L_cache) must be in 1..max_completion_length={max_completion_length}, got {buffer}; "
                "DAPO uses a buffer of 1/5 of the maximum length"
            )
        if penalty < 0:
            raise ValueError(f"overlong reward: penalty is a non-negative factor, got {penalty}")
        self.__name__ = name
        self.max_completion_length = max_completion_length
        self.buffer = buffer
        self.penalty = penalty

    def penalty_for(self, length: int) -> float:
        expected = self.max_completion_length - self.buffer
        if length <= expected:
            return 0.0
        if length <= self.max_completion_length:
            return self.penalty * (expected - length) / self.buffer
        return -self.penalty

    def __call__(
        self,
        prompts: Sequence[Any] | None,
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float]:
        if completion_ids is None:
            raise ValueError(
                "overlong reward: needs completion_ids (token ids of each completion) to measure length; "
                "TRL and rlvr pass them to every reward function — call it as f(prompts, completions, completion_ids)"
            )
        return [self.penalty_for(len(ids)) for ids in completion_ids]


REWARDS.add("overlong", lambda **options: OverlongPenalty(**options))
