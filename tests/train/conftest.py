"""Fixtures for trainer tests: a tiny random Llama with a character-level tokenizer, built locally."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch


def build_tiny_model(path: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + list(string.digits + "+-*=() ."))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


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
