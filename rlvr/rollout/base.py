"""The RolloutEngine protocol (DESIGN.md §5): every backend samples through this one interface.

Ordering contract: ``generate(prompt_ids, n, sampling)`` returns ``len(prompt_ids) * n``
completions, grouped contiguously: completions ``i*n .. i*n+n-1`` belong to prompt ``i``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch

#: "stop": EOS or a stop string; "length": max_tokens; "abort" / "error": a server engine (vLLM) ended the
#: request early, so the completion is broken rather than long.
FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class SamplingParams:
    """What to sample. Names follow TRL's GRPOConfig / vLLM's SamplingParams."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0  # 0 = disabled
    repetition_penalty: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class Completion:
    """One sampled completion.

    ``token_ids`` include the EOS token when the model emitted one (finish_reason "stop"), exactly
    as TRL's completion mask keeps the first EOS. ``logprobs`` are the sampler's own per-token
    log-probs of ``token_ids`` under the distribution they were drawn from (temperature, penalty and
    filters applied; rlvr.rollout.common), ``sampler_logp`` in the trainer, or None when the backend
    cannot report them.
    """

    prompt_index: int
    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    logprobs: list[float] | None = None
    extra: dict = field(default_factory=dict)


@runtime_checkable
class RolloutEngine(Protocol):
    #: True when the engine samples from the live policy (hf, native); False when it holds its own
    #: weights that must be pushed (vLLM) or cannot be updated at all (a stale server).
    samples_live_policy: bool

    def generate(
        self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams
    ) -> list[Completion]: ...

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> None: ...

    def close(self) -> None: ...
