"""The RolloutEngine protocol: every backend samples through this one interface (docs/architecture.md).

Ordering contract: ``generate(prompt_ids, n, sampling)`` returns ``len(prompt_ids) * n``
completions, grouped contiguously: completions ``i*n .. i*n+n-1`` belong to prompt ``i``.

Capabilities: every engine declares, as plain attributes, each property the trainer relies on; the
config (``rollout.allow_stale_sampler``) and the loop (old log-prob pass, weight sync, importance
sampling, ``policy_lag``) read these and nothing else, never the backend's name.
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

    @property
    def truncated(self) -> bool:
        """Hit ``max_tokens`` before an EOS or stop string: the one definition of truncation."""
        return self.finish_reason == "length"


@runtime_checkable
class RolloutEngine(Protocol):
    #: True when the engine samples with the trainer's own model object (hf, native): nothing to sync,
    #: and its log-probs are the trainer's. False when it holds its own copy of the weights (vLLM, a server).
    samples_live_policy: bool
    #: True when ``load_weights`` makes the engine sample the newest policy at once (live engines trivially,
    #: vLLM by a push). False for a server that keeps its own weights: it samples a stale policy, which the
    #: config must allow (``rollout.allow_stale_sampler``). Declared on the class, so the config can read it
    #: before any engine is built.
    receives_weights: bool
    #: True when completions carry the sampler's own per-token log-probs (``Completion.logprobs``); the
    #: trainer then measures sampler/trainer mismatch and, for a non-live engine, corrects by importance
    #: sampling. A completion may still come back without them (``None``): that row is simply not compared.
    reports_logprobs: bool

    @property
    def policy_lag(self) -> int:
        """Optimizer steps the weights the engine samples from are behind the last ``load_weights``:
        always 0 for an engine that ``receives_weights``; grows for a stale server until it reloads."""
        ...

    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams) -> list[Completion]: ...

    def describe(self, sampling: SamplingParams) -> str:
        """One line: what will sample ``sampling`` (which decoder or server) and why; the trainer shows it
        once and records it in header.json, since runs on different decoders draw different samples."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def close(self) -> None: ...
