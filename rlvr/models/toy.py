"""Toy models built locally in milliseconds (no hub): a character-level tokenizer and a small random
Llama / Qwen2 / Qwen3 over it. The one factory that tests, benchmarks, examples and scripts use when
they need a model that is not the shipped ``tiny-arith`` (``rlvr.models.tiny_model_path``).

    tok = char_tokenizer()
    model = toy_model("llama", len(tok), hidden_size=64)
    save_toy(path, model, tok)  # a folder any from_pretrained (and rlvr's model.path) reads
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import torch

#: Characters of the default vocabulary: digits, letters and the punctuation of arithmetic and code.
CHARS = string.digits + string.ascii_letters + "+-*/=() .,:;!?<>[]{}#"
ARCHITECTURES = ("llama", "qwen2", "qwen3")


def char_tokenizer(
    chars: str = CHARS,
    specials: tuple[str, ...] = ("<pad>", "<eos>", "<unk>"),
    eos_token: str | None = None,
    bos_token: str | None = None,
) -> Any:
    """One token per character. ``specials`` come first (ids 0, 1, ...): the first is the pad token, the
    EOS token is ``eos_token`` (default: the second), and ``<unk>`` must be among them. With ``bos_token``
    (also in ``specials``) every encoded text starts with it, as Llama tokenizers do."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(list(specials) + list(chars))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    if bos_token is not None:
        core.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", special_tokens=[(bos_token, vocab[bos_token])]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=specials[0],
        eos_token=eos_token or specials[1],
        unk_token="<unk>",
        bos_token=bos_token,
    )


def toy_model(
    arch: str = "llama", vocab_size: int = len(CHARS) + 3, seed: int | None = 0, **config: Any
) -> torch.nn.Module:
    """A random float32 causal LM. Defaults: hidden 64, 2 layers, 4 heads (2 key/value heads: GQA), pad id
    0, EOS id 1, no BOS; any ``config`` key overrides them (e.g. ``hidden_size=512, num_hidden_layers=8``).
    ``seed`` seeds the initialisation (None: the caller's RNG state)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown toy architecture {arch!r}; valid: {', '.join(ARCHITECTURES)}")
    settings = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": None,
        "tie_word_embeddings": False,
    }
    if arch == "qwen3":
        settings["head_dim"] = 16
    settings.update(config)
    cfg_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    }[arch]
    if seed is not None:
        torch.manual_seed(seed)
    model = model_cls(cfg_cls(**settings)).float()
    model.generation_config.eos_token_id = settings["eos_token_id"]
    model.generation_config.pad_token_id = settings["pad_token_id"]
    return model


def save_toy(path: Path, model: torch.nn.Module, tokenizer: Any) -> Path:
    """Write model and tokenizer into ``path`` (created): a folder for ``model.path`` or from_pretrained."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
