"""Fixtures for trainer tests: a tiny random Llama with a character-level tokenizer, built locally."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

from rlvr.models.toy import char_tokenizer, save_toy, toy_model


def build_tiny_model(path: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    tok = char_tokenizer(
        string.digits + "+-*=() .", specials=("<pad>", "<s>", "</s>", "<unk>"), eos_token="</s>", bos_token="<s>"
    )
    model = toy_model(
        "llama",
        len(tok),
        seed=seed,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    return save_toy(path, model, tok)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def sum_dataset(tmp_path) -> Path:
    path = tmp_path / "sums.jsonl"
    with open(path, "w") as f:
        for a in range(10):
            for b in range(3):
                f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b), "data_source": "sums"}) + "\n")
    return path
