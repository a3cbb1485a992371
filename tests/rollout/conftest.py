"""Tiny models and a char-level tokenizer built locally (no hub), shaped like the default task:
~8-token arithmetic prompts ("37+45=") and short completions."""

from __future__ import annotations

import pytest

from rollout_models import char_tokenizer, tiny_model  # noqa: F401  (re-exported for fixtures)


@pytest.fixture(scope="module")
def llama_and_tok():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def prompts(llama_and_tok):
    _, tok = llama_and_tok
    # Different lengths on purpose: left padding and per-row positions must not change any token.
    texts = ["37+45=", "8*9=", "123-77=", "(2+3)*4="]
    return [tok.encode(t) for t in texts]


@pytest.fixture(scope="session")
def completions_server():
    """A local OpenAI-compatible server over its own copy of the same tiny Llama (same seed, so the
    same weights as ``llama_and_tok`` until someone changes one of them)."""
    from completions_server import CompletionsServer

    model, tok = tiny_model("llama")
    server = CompletionsServer(model.eval(), tok)
    yield server
    server.close()
