"""Tiny models and a char-level tokenizer built locally (no hub), shaped like the default task:
~8-token arithmetic prompts ("37+45=") and short completions.

Test modules import these from here (``from rollout_models import tiny_model``), not from conftest:
several test folders have a conftest.py, and ``from conftest import`` picks whichever was loaded first.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = string.digits + string.ascii_letters + "+-*/=() .,:;!?<>[]{}#"


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def tiny_config(arch: str, vocab_size: int, **overrides):
    common = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # GQA, so the fast path's key/value head expansion is exercised
        "max_position_embeddings": 128,
        # A wide init makes the random model's next-token distribution peaked, so greedy paths and
        # stop conditions are meaningful rather than decided by float ties between ~uniform logits.
        "initializer_range": 0.2,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": None,
        "tie_word_embeddings": False,
    }
    common.update(overrides)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen3":
        return Qwen3Config(head_dim=16, **common)
    raise ValueError(arch)


def tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    tok = char_tokenizer()
    torch.manual_seed(seed)
    cls = {
        "llama": LlamaForCausalLM,
        "qwen2": Qwen2ForCausalLM,
        "qwen3": Qwen3ForCausalLM,
    }[arch]
    model = cls(tiny_config(arch, len(tok), **overrides)).float()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok
