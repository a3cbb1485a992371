"""Start, stop and restart llama-cpp-python's OpenAI-compatible server for the tests.

The server cannot swap weights in place, so a "reload" is a restart on a new GGUF: this module is also
the ``reload_command`` the stale-sampler test hands to the ``openai`` engine::

    python llamacpp_server.py restart --hf <exported folder> --gguf <out.gguf> --port P --pid-file F

It converts the exported Hugging Face folder with ``rlvr.rollout.gguf_export``, stops the server whose
pid is in the pid file, starts a new one on the same port (its own session, so it outlives this
command) and returns once ``/v1/models`` answers. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(gguf: Path, port: int, log: Path, alias: str = "tiny-arith", n_ctx: int = 512, kv_f32: bool = True) -> int:
    """Start the server on ``gguf`` in its own session; return its pid once it answers /v1/models.
    ``kv_f32=False`` keeps llama.cpp's default float16 KV cache (to measure what it costs)."""
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # One thread: the machine is shared; 512 tokens is the tiny model's whole context.
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
        # A float32 KV cache (GGML type 0): the default f16 cache moved log-probs by up to 0.05 here.
        *(["--type_k", "0", "--type_v", "0"] if kv_f32 else []),
        "--verbose",
        "false",
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited with {proc.returncode}; log:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return proc.pid
        except OSError:
            time.sleep(0.2)
    stop(proc.pid)
    raise TimeoutError(f"llama_cpp.server not ready after {READY_TIMEOUT_S} s; log:\n{log.read_text()[-3000:]}")


def _exited(pid: int) -> bool:
    """True once ``pid`` is gone or a zombie (a server started by a previous restart command is not
    our child, so it cannot be reaped here; /proc says whether it still runs)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it
        return done == pid
    except ChildProcessError:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, ProcessLookupError):
            return True


def stop(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM the server started by ``start`` (and its session), SIGKILL after ``timeout_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            # start_new_session made the server its own process-group leader.
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _exited(pid):
                return
            time.sleep(0.05)


def restart(hf_dir: Path, gguf: Path, port: int, pid_file: Path, log: Path) -> int:
    sys.path.insert(0, str(REPO))
    from rlvr.rollout.gguf_export import export_llama_gguf

    tmp = gguf.with_suffix(".tmp.gguf")
    export_llama_gguf(hf_dir, tmp)
    if pid_file.exists():
        stop(int(pid_file.read_text()))
    os.replace(tmp, gguf)
    pid = start(gguf, port, log)
    pid_file.write_text(str(pid))
    return pid


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["restart"])
    parser.add_argument("--hf", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid-file", type=Path, required=True)
    args = parser.parse_args()
    restart(args.hf, args.gguf, args.port, args.pid_file, args.gguf.with_suffix(".log"))
