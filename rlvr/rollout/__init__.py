"""Rollout engines behind one protocol (``rlvr.rollout.base.RolloutEngine``; docs/rollout.md).

``make_engine(name, model, tokenizer, **options)`` is the only constructor the trainer needs:

- ``hf``      transformers ``generate``; the reference. Live policy.
- ``native``  rlvr's batched sampler over the policy model itself (prompt prefilled once per group,
              preallocated KV cache, finished rows dropped). Live policy. The default.
- ``openai``  any OpenAI-compatible ``/v1/completions`` server (llama.cpp, vLLM, SGLang, ...). Holds
              its own weights: a *stale* sampler unless it is told to reload (see docs/rollout.md).
- ``vllm``    vLLM colocated in-process (``mode="colocate"``, the default) or as a server
              (``mode="server"``); needs ``pip install 'rlvr[vllm]'``.
- ``vllm-server``  the same as ``vllm`` with ``mode="server"``.

Engines are plain classes, not a registry: there are four and the trainer never extends them. Each
declares its capabilities (``samples_live_policy``, ``receives_weights``, ``reports_logprobs``,
``policy_lag``) on the class; ``engine_class`` lets the config read them before anything is built.
"""

from __future__ import annotations

from rlvr.rollout.base import Completion, FinishReason, RolloutEngine, SamplingParams
from rlvr.rollout.mismatch import check_mismatch, logprob_mismatch_metrics

ENGINE_NAMES: tuple[str, ...] = ("hf", "native", "openai", "vllm", "vllm-server")


def engine_class(name: str, options: dict | None = None) -> type:
    """The class ``make_engine(name, ..., **options)`` builds; imports no optional dependency (vLLM)."""
    options = options or {}
    if name == "hf":
        from rlvr.rollout.hf import HFEngine as cls
    elif name == "native":
        from rlvr.rollout.native import NativeEngine as cls
    elif name == "openai":
        from rlvr.rollout.openai import OpenAICompletionsEngine as cls
    elif name in ("vllm", "vllm-server"):
        from rlvr.rollout.vllm import VLLMColocateEngine, VLLMServerEngine

        mode = "server" if name == "vllm-server" else options.get("mode", "colocate")
        cls = VLLMServerEngine if mode == "server" else VLLMColocateEngine
    else:
        raise ValueError(
            f"unknown rollout engine {name!r}; valid choices: {', '.join(ENGINE_NAMES)}. "
            "Set rollout.backend to one of them (native is the fast default for the live policy)."
        )
    return cls


def make_engine(name: str, model, tokenizer, **options) -> RolloutEngine:
    """Build the rollout engine called ``name`` over ``model`` / ``tokenizer``.

    ``options`` go to the engine's constructor (e.g. ``eos_token_ids`` for every engine; ``base_url``
    for ``openai``; ``mode`` for ``vllm``); an option the engine does not take is a TypeError that
    names it.
    """
    if name in ("vllm", "vllm-server"):
        from rlvr.rollout.vllm import make_vllm_engine

        if name == "vllm-server":
            options = {"mode": "server", **options}
        return make_vllm_engine(model, tokenizer, **options)
    return engine_class(name)(model, tokenizer, **options)


__all__ = [
    "ENGINE_NAMES",
    "Completion",
    "FinishReason",
    "RolloutEngine",
    "SamplingParams",
    "check_mismatch",
    "engine_class",
    "logprob_mismatch_metrics",
    "make_engine",
]
