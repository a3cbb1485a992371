"""``vllm``: vLLM as a rollout engine, colocated in-process or as a server (issue 8)."""

from __future__ import annotations

import importlib.util


def _require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "rollout engine 'vllm' needs vLLM, which is not installed in this environment. Install the "
            "extra with `pip install 'rlvr[vllm]'` (a CUDA machine is required), or choose "
            "rollout.engine=native, which samples from the live policy without vLLM."
        )


def make_vllm_engine(model, tokenizer, mode: str = "colocate", **options):
    _require_vllm()
    raise NotImplementedError("vLLM engines are not written yet")
