"""Fixtures for the real llama.cpp tests: the shipped tiny model as GGUF, served by llama-cpp-python.

Optional extra (issue 8): ``pip install gguf "llama-cpp-python[server]"``; without it these tests skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from llamacpp_server import free_port, start, stop

SHIPPED = Path(__file__).resolve().parents[2] / "rlvr" / "models" / "tiny-arith"


class LlamaCppServer:
    """A llama-cpp-python server on ``gguf``; ``pid_file`` always names the live one (restarts rewrite it)."""

    def __init__(self, gguf: Path, workdir: Path):
        self.gguf, self.port = gguf, free_port()
        self.pid_file, self.log = workdir / "server.pid", workdir / "server.log"
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.pid_file.write_text(str(start(gguf, self.port, self.log)))

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

    return export_llama_gguf(
        SHIPPED, tmp_path_factory.mktemp("gguf") / "tiny-arith.gguf"
    )


@pytest.fixture
def llama_server(shipped_gguf, tmp_path):
    """A fresh server per test: the reload test restarts it on other weights."""
    gguf = tmp_path / "policy.gguf"
    gguf.write_bytes(shipped_gguf.read_bytes())
    server = LlamaCppServer(gguf, tmp_path)
    yield server
    server.close()
