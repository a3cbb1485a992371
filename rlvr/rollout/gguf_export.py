"""Export a Hugging Face Llama folder to a float32 GGUF file that llama.cpp can serve.

This is what a stale ``openai`` sampler backed by llama.cpp needs to reload the live policy:
``engine.reload()`` writes ``save_pretrained`` folders, this turns one into ``policy.gguf``::

    python -m rlvr.rollout.gguf_export <hf_folder> <out.gguf>

Scope, kept small on purpose: ``LlamaForCausalLM`` only, every tensor in float32 (no quantization:
the point is a sampler whose log-probs match the trainer's), and tokenizers whose ``tokenizer.json``
is a BPE model that llama.cpp's ``gpt2`` tokenizer reproduces:

- byte-level BPE with GPT-2's ``ByteLevel`` pre-tokenizer (its regex, no prefix space), which
  llama.cpp's ``gpt-2`` pre-tokenizer reproduces: tokens and merges copied as-is;
- character-level BPE with no merges and no pre-tokenizer (the shipped ``tiny-arith`` model):
  every token is rewritten in GPT-2's byte-to-unicode alphabet (``" "`` becomes ``"Ġ"``, ``"\\n"`` becomes ``"Ċ"``), which is how
  llama.cpp's ``gpt2`` tokenizer spells bytes. With no merges both tokenizers map each character of
  in-vocabulary text to its own token, and llama.cpp decodes the pieces back to the same text.

Anything else is a clear error rather than a GGUF whose tokenizer silently differs. It matters:
llama-cpp-python's server takes prompts as text only, so the ``openai`` engine sends decoded prompts
and the server's tokenizer must give back the policy's ids (the engine checks the count per prompt).

Layout: tensor names come from ``gguf``'s own Hugging Face → GGUF name map. The q and k projections
are permuted per head from Hugging Face's rotate-half RoPE layout (dimension i paired with i + D/2)
to the adjacent-pair layout llama.cpp's ``llama`` architecture rotates (2i paired with 2i + 1), the
same transformation llama.cpp's ``convert_hf_to_gguf.py`` applies to Llama checkpoints.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

# GGUF token types (llama.cpp's llama_token_type): 1 normal, 2 unknown, 3 control.
_NORMAL, _UNKNOWN, _CONTROL = 1, 2, 3


@lru_cache(maxsize=1)
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character table, which llama.cpp's ``gpt2`` vocab uses.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, 0x7F-0xA0,
    0xAD) are shifted to code points 256.. in byte order, so space (0x20, the 33rd such byte) is
    chr(256 + 32) = "Ġ".
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(0xA1, 0xAC + 1),
        *range(0xAE, 0xFF + 1),
    ]
    table = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in table)
    for i, b in enumerate(shifted):
        table[b] = chr(256 + i)
    return table


def _byte_level(text: str) -> str:
    table = _byte_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


def _pre_tokenizer_kind(tok_json: dict) -> str:
    """ "gpt2" for GPT-2's byte-level pre-tokenizer (its regex, no prefix space), which llama.cpp's
    ``gpt-2`` pre-tokenizer reproduces; "none" for no pre-tokenizer; "other" for anything else."""
    pre = tok_json.get("pre_tokenizer")
    if pre is None:
        return "none"
    gpt2 = pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")
    return "gpt2" if gpt2 else "other"


def gguf_vocab(
    model_dir: str | Path,
) -> tuple[list[str], list[int], list[str], dict[str, int | None]]:
    """``(tokens, token_types, merges, special_ids)`` for llama.cpp's ``gpt2`` tokenizer model."""
    tok_json = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    model = tok_json["model"]
    if model.get("type") != "BPE" or tok_json.get("normalizer"):
        raise ValueError(
            f"gguf_export: {model_dir}/tokenizer.json is a {model.get('type')} tokenizer"
            f"{' with a normalizer' if tok_json.get('normalizer') else ''}; only BPE tokenizers without a "
            "normalizer (byte-level, or character-level with no merges) are exported. Convert other "
            "tokenizers with llama.cpp's convert_hf_to_gguf.py."
        )
    kind = _pre_tokenizer_kind(tok_json)
    if kind == "other":
        raise ValueError(
            f"gguf_export: {model_dir}/tokenizer.json pre-tokenizes with {tok_json['pre_tokenizer']}; only GPT-2's "
            "ByteLevel pre-tokenizer (use_regex=True, add_prefix_space=False) or none is exported, because "
            "llama.cpp's gpt-2 pre-tokenizer must split text the same way. Use convert_hf_to_gguf.py."
        )
    byte_level = kind == "gpt2"
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if not byte_level and merges:
        raise ValueError(
            f"gguf_export: {model_dir} has a character-level BPE with {len(merges)} merges; llama.cpp's gpt2 "
            "tokenizer applies merges within its own pre-tokenizer's words, so the result could differ. "
            "Use a byte-level BPE (tokenizers.ByteLevelBPETokenizer) or convert with convert_hf_to_gguf.py."
        )
    vocab: dict[str, int] = dict(model["vocab"])
    specials = {t["content"]: t["id"] for t in tok_json.get("added_tokens", [])}
    vocab.update(specials)
    V = max(vocab.values()) + 1
    if sorted(vocab.values()) != list(range(V)):
        raise ValueError(f"gguf_export: token ids in {model_dir}/tokenizer.json are not 0..{V - 1} without gaps.")
    tokens, types = [""] * V, [_NORMAL] * V
    unk = model.get("unk_token")
    for text, i in vocab.items():
        special = text in specials
        tokens[i] = text if special or byte_level else _byte_level(text)
        types[i] = _UNKNOWN if text == unk else _CONTROL if special else _NORMAL
    config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    special_ids = {role: vocab.get(config.get(f"{role}_token") or "") for role in ("bos", "eos", "pad", "unk")}
    return tokens, types, merges, special_ids


def _rope_pairs_adjacent(w_OI: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q/k projection reordered per head from rotate-half to adjacent-pair RoPE order.

    Within a head of size D, output row 2i takes input row i and row 2i+1 takes row i + D/2.
    """
    O, I = w_OI.shape
    D = O // n_heads
    return w_OI.reshape(n_heads, 2, D // 2, I).transpose(1, 2).reshape(O, I)


def export_llama_gguf(model_dir: str | Path, out_path: str | Path) -> Path:
    """Write ``model_dir`` (a Hugging Face ``LlamaForCausalLM`` folder) as float32 GGUF to ``out_path``."""
    import gguf
    from safetensors.torch import load_file

    model_dir, out_path = Path(model_dir), Path(out_path)
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise ValueError(
            f"gguf_export: {model_dir} holds a {cfg.get('model_type')!r} model; only 'llama' is exported. "
            "Use llama.cpp's convert_hf_to_gguf.py for other architectures."
        )
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"gguf_export: no *.safetensors in {model_dir} (save with safe_serialization).")
    state = {k: v for shard in shards for k, v in load_file(str(shard)).items()}
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    head_dim = cfg.get("head_dim") or H // n_head
    rope = cfg.get("rope_parameters") or {}
    rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise ValueError(f"gguf_export: {model_dir} uses RoPE scaling {rope or cfg.get('rope_scaling')}; not exported.")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError(f"gguf_export: {model_dir} has attention/MLP biases; llama.cpp's llama layout has none.")

    tokens, types, merges, special = gguf_vocab(model_dir)
    writer = gguf.GGUFWriter(str(out_path), arch="llama")
    writer.add_name(model_dir.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(len(tokens))
    writer.add_context_length(cfg.get("max_position_embeddings", 2048))
    writer.add_embedding_length(H)
    writer.add_block_count(L)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # GPT-2's regex, as HF's ByteLevel
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # llama.cpp refuses a gpt2 vocab without a merges key and gguf refuses an empty array, so a
    # character-level vocab gets one merge that can never fire: BPE starts from single characters and
    # no other merge builds the multi-character symbols it names.
    if not merges:
        long_tokens = [t for t in tokens if len(t) > 1 and " " not in t][:2]
        if len(long_tokens) < 2:
            raise ValueError(f"gguf_export: {model_dir} has no merges and fewer than two multi-character tokens.")
        merges = [" ".join(long_tokens)]
    writer.add_token_merges(merges)
    for role, add in (
        ("bos", writer.add_bos_token_id),
        ("eos", writer.add_eos_token_id),
        ("pad", writer.add_pad_token_id),
        ("unk", writer.add_unk_token_id),
    ):
        if special[role] is not None:
            add(special[role])
    # Prompts arrive as token ids that already carry BOS when the policy's tokenizer adds it.
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, L)
    if "lm_head.weight" not in state and cfg.get("tie_word_embeddings", False):
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    for hf_name, w in state.items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"gguf_export: no GGUF name for tensor {hf_name!r} of {model_dir}.")
        w = w.float()
        if hf_name.endswith("self_attn.q_proj.weight"):
            w = _rope_pairs_adjacent(w, n_head)
        elif hf_name.endswith("self_attn.k_proj.weight"):
            w = _rope_pairs_adjacent(w, n_kv)
        writer.add_tensor(name, w.contiguous().numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m rlvr.rollout.gguf_export <hf_llama_folder> <out.gguf>")
    print(export_llama_gguf(sys.argv[1], sys.argv[2]))
