"""Fixtures for the real llama.cpp tests: the shipped tiny model exported as GGUF, and SmolLM2-135M-Instruct's
own GGUF file, served by llama-cpp-python.

Optional extra: ``pip install gguf "llama-cpp-python[server]"``; without it these tests skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from llamacpp_server import free_port, start, stop

SHIPPED = Path(__file__).resolve().parents[2] / "rlvr" / "models" / "tiny-arith"


class LlamaCppServer:
    """A llama-cpp-python server on ``gguf``; ``pid_file`` always names the live one (restarts rewrite it)."""

    def __init__(self, gguf: Path, workdir: Path, **start_options):
        self.gguf, self.port = gguf, free_port()
        self.pid_file, self.log = workdir / "server.pid", workdir / "server.log"
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.pid_file.write_text(str(start(gguf, self.port, self.log, **start_options)))

    def close(self) -> None:
        stop(int(self.pid_file.read_text()))


@pytest.fixture(scope="session")
def shipped_dir() -> Path:
    return SHIPPED


@pytest.fixture(scope="session")
def shipped_gguf(tmp_path_factory) -> Path:
    pytest.importorskip("gguf")
    pytest.importorskip("llama_cpp")
    from rlvr.rollout.gguf_export import export_llama_gguf

    return export_llama_gguf(SHIPPED, tmp_path_factory.mktemp("gguf") / "tiny-arith.gguf")


@pytest.fixture
def llama_server(shipped_gguf, tmp_path):
    """A fresh server per test: the reload test restarts it on other weights."""
    gguf = tmp_path / "policy.gguf"
    gguf.write_bytes(shipped_gguf.read_bytes())
    server = LlamaCppServer(gguf, tmp_path)
    yield server
    server.close()


def build_byte_level_llama(path: Path) -> Path:
    """A random Llama (grouped-query attention: 4 query heads over 2 KV heads, untied head) with an
    ASCII byte-level BPE tokenizer trained here on arithmetic text: the exporter's other tokenizer path."""
    import torch
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    # ASCII only: every token is then valid UTF-8 on its own. A random model strings byte tokens into
    # invalid UTF-8, which llama-cpp-python's text drops (it returns no token ids), so only the
    # ASCII part of the byte-level path is comparable token for token.
    trainer = trainers.BpeTrainer(vocab_size=160, special_tokens=["<pad>", "<s>", "</s>"])
    corpus = [f"{a} + {b} = {a + b}. Sum {a * b}" for a in range(40) for b in range(40)]
    core.train_from_iterator(corpus, trainer)
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        # A wider init than the default 0.02 makes the random model's argmax margins far larger than
        # float32 rounding, so greedy equality cannot hinge on a near-tie.
        initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def byte_level_dir(tmp_path_factory) -> Path:
    return build_byte_level_llama(tmp_path_factory.mktemp("byte-level-llama"))


@pytest.fixture
def byte_level_server(byte_level_dir, tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("llama_cpp")
    from rlvr.rollout.gguf_export import export_llama_gguf

    server = LlamaCppServer(export_llama_gguf(byte_level_dir, tmp_path / "byte-level.gguf"), tmp_path)
    yield server
    server.close()


@pytest.fixture(scope="module")
def smollm2_server(smollm2_gguf, tmp_path_factory):
    """llama.cpp serving the GGUF file `rlvr models get smollm2` fetched, as shipped (Q4_1), with a float32
    KV cache; one server for the module. Best effort: a server that cannot start skips these tests."""
    pytest.importorskip("llama_cpp")
    try:
        server = LlamaCppServer(smollm2_gguf, tmp_path_factory.mktemp("smollm2-server"), alias="smollm2", n_ctx=1024)
    except (RuntimeError, TimeoutError) as e:
        pytest.skip(f"llama_cpp.server did not start on {smollm2_gguf.name}: {str(e)[:500]}")
    yield server
    server.close()
