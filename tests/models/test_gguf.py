"""``model.path`` as a GGUF file: converted once with transformers into a cached Hugging Face folder
keyed by the file's hash, then loaded from the cache; and the errors a user can meet on the way.

The GGUF here is a small random byte-level BPE Llama (grouped-query attention) written by rlvr's own
float32 exporter, so the round trip is exact: same weights, same logits.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def byte_level_llama(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from rlvr.rollout.gguf_export import export_llama_gguf

    path = tmp_path_factory.mktemp("byte-level")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(
        [f"{a} + {b} = {a + b}" for a in range(30) for b in range(30)],
        trainers.BpeTrainer(vocab_size=140, special_tokens=["<pad>", "<s>", "</s>"]),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(path / "hf")
    tok.save_pretrained(path / "hf")
    return path / "hf", export_llama_gguf(path / "hf", path / "model.gguf")


def test_gguf_path_converts_once_and_loads_the_same_model(byte_level_llama, cache, monkeypatch):
    import transformers

    from rlvr.builders import load_model, load_tokenizer, resolve_model_path
    from rlvr.config import load_config

    hf_dir, gguf = byte_level_llama
    cfg = load_config(None, [f"model.path={gguf}"])
    model = load_model(cfg, torch.device("cpu"), trainable=False)
    folder = resolve_model_path(str(gguf))
    assert folder.startswith(str(cache / "gguf" / "model-")) and not hasattr(model.config, "quantization_config")
    # The same attention as load_model chose (rlvr.config.attention_implementation: eager for a small model on
    # CPU), so the comparison is of the weights alone, bitwise.
    attention = model.config._attn_implementation
    want = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation=attention).eval()
    ids = transformers.AutoTokenizer.from_pretrained(hf_dir)("12 + 30 = 42", add_special_tokens=False)["input_ids"]
    assert load_tokenizer(str(gguf))("12 + 30 = 42", add_special_tokens=False)["input_ids"] == ids
    with torch.no_grad():
        x = torch.tensor([ids])
        torch.testing.assert_close(model(x).logits, want(x).logits, atol=0, rtol=0)  # float32 in, float32 out

    # Second use: straight from the cache, transformers' GGUF reader is never called again.
    def no_conversion(*args, **kwargs):
        if "gguf_file" in kwargs:
            raise AssertionError("converted twice")
        return real(*args, **kwargs)

    real = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_conversion)
    assert resolve_model_path(str(gguf)) == folder


def test_cache_is_keyed_by_the_file_contents(byte_level_llama, cache, tmp_path):
    from rlvr.models.gguf import converted_dir

    _, gguf = byte_level_llama
    copy = tmp_path / "model.gguf"
    copy.write_bytes(gguf.read_bytes())
    assert converted_dir(copy) == converted_dir(gguf)  # same bytes, same conversion
    copy.write_bytes(gguf.read_bytes() + b"\0")
    assert converted_dir(copy) != converted_dir(gguf)  # changed file, converted again


def test_clear_errors(cache, tmp_path):
    from rlvr.builders import resolve_model_path
    from rlvr.models.gguf import fetch_gguf, get_model

    with pytest.raises(FileNotFoundError, match="GGUF file .*missing.gguf' does not exist"):
        resolve_model_path(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="rlvr models get smollm2"):
        resolve_model_path("smollm2")  # known but not fetched into this (empty) cache
    with pytest.raises(ValueError, match="unknown model 'gpt5'; rlvr can get: smollm2"):
        get_model("gpt5")
    with pytest.raises(ValueError, match="unknown model 'gpt5'; rlvr can get: smollm2"):
        fetch_gguf("gpt5")
