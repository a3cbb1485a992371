"""Checks with a timeout enforced from outside: small pools of killable worker processes (math-verify, JSON Schema).

Why a process and not ``signal.alarm``: the alarm only works on the main thread (TRL and rlvr
call reward functions from wherever they like, including thread pools), and some sympy calls —
``str()`` of a huge object, a pathological simplification — do not return to the interpreter
for the alarm to fire at all. A worker process can always be killed.

Cost: one Python process per worker (about 150 MB once sympy and math-verify are imported,
~1-2 s to start, paid once and in the background of the first call, not against its timeout).
A timed-out worker is SIGKILLed and replaced lazily. Works from many threads (requests queue
for a free worker) and from process pools (each process owns its own workers: the pool is keyed
by pid, so a forked child never talks to its parent's pipes).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

WORKER_PATH = Path(__file__).with_name("_symbolic_worker.py")
STARTUP_TIMEOUT_S = 120.0  # imports on a loaded 2-core machine; not a per-comparison budget

Outcome = Literal["equal", "not_equal", "unparsed", "timeout", "error"]


@dataclass
class _Worker:
    proc: subprocess.Popen
    buffer: bytes = b""

    def read_line(self, deadline: float) -> bytes | None:
        """One line from the worker, or None when the deadline passes or the worker died."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc.wait()


class WorkerPool:
    """``request(payload, timeout_s)`` on up to ``size`` processes running ``script``: one JSON
    line in, one JSON line out; a worker past its deadline is killed and replaced lazily."""

    def __init__(self, script: Path, size: int = 2, install_hint: str = ""):
        self.script = script
        self.install_hint = install_hint
        self.size = size
        self.owner_pid = os.getpid()
        self._idle: list[_Worker] = []
        self._live = 0
        self._cond = threading.Condition()
        self._closed = False
        self.timeouts = 0  # comparisons killed at their deadline since the pool started
        self.restarts = 0

    def _spawn(self) -> _Worker:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(self.script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # killpg reaches anything sympy might spawn
            close_fds=True,
        )
        worker = _Worker(proc)
        line = worker.read_line(time.monotonic() + STARTUP_TIMEOUT_S)
        if line is None or not json.loads(line).get("ready"):
            worker.kill()
            raise RuntimeError(
                f"the {self.script.stem} worker did not start; {self.install_hint} in {sys.executable}'s environment"
            )
        return worker

    def _acquire(self) -> _Worker:
        with self._cond:
            while not self._idle and self._live >= self.size:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._live += 1
        try:
            return self._spawn()
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def _replace(self) -> None:
        """Start the killed worker's successor in the background (its slot stays counted), so the
        next request waits for it only if it arrives before the imports are done, and a timeout
        is never followed by one caller paying seconds of start-up."""

        def spawn() -> None:
            try:
                worker = self._spawn()
            except BaseException:  # noqa: BLE001 - the next request retries and reports the start failure
                self._release(None)
                return
            if self._closed:
                worker.kill()
                self._release(None)
                return
            self._release(worker)

        threading.Thread(target=spawn, name=f"{self.script.stem}-respawn", daemon=True).start()

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None:
                self._live -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def request(self, payload: dict, timeout_s: float) -> tuple[str, dict | None]:
        """("ok", reply) | ("timeout", None) | ("error", None): the worker died or answered garbage."""
        worker = self._acquire()
        try:
            worker.proc.stdin.write((json.dumps(payload) + "\n").encode())
            worker.proc.stdin.flush()
            line = worker.read_line(time.monotonic() + timeout_s)
        except (BrokenPipeError, OSError):
            line = None
        if line is None:
            timed_out = worker.proc.poll() is None
            worker.kill()
            with self._cond:
                if timed_out:
                    self.timeouts += 1
                self.restarts += 1
            self._replace()
            return ("timeout" if timed_out else "error"), None
        self._release(worker)
        try:
            return "ok", json.loads(line)
        except ValueError:
            return "error", None

    def close(self) -> None:
        self._closed = True
        with self._cond:
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for worker in idle:
            worker.kill()


class SymbolicPool(WorkerPool):
    """``compare(gold, pred, timeout_s)`` on math-verify workers."""

    def __init__(self, size: int = 2):
        super().__init__(WORKER_PATH, size, "check that math-verify is installed (pip install math-verify)")

    def compare(self, gold: str, pred: str, timeout_s: float, gold_decimals: int | None = None) -> Outcome:
        """``gold_decimals``: the gold is a decimal with this many places, and a prediction that
        rounds to it is the same answer; None: the gold is exact and so must the prediction be."""
        status, reply = self.request({"gold": gold, "pred": pred, "decimals": gold_decimals}, timeout_s)
        if reply is None:
            return status  # type: ignore[return-value]
        if "error" in reply:
            return "error"
        if not reply.get("parsed", True):
            return "unparsed"
        return "equal" if reply["equal"] else "not_equal"


_POOLS: dict[str, WorkerPool] = {}
_POOL_LOCK = threading.Lock()


def _get(name: str, make) -> WorkerPool:
    # This process's pool (a forked child gets a fresh one; it must not share its parent's pipes).
    with _POOL_LOCK:
        pool = _POOLS.get(name)
        if pool is None or pool.owner_pid != os.getpid():
            pool = _POOLS[name] = make()
        return pool


def get_pool() -> SymbolicPool:
    """This process's math-verify pool."""
    return _get("math", SymbolicPool)  # type: ignore[return-value]


def get_json_pool() -> WorkerPool:
    """This process's JSON-validation pool (``_json_worker.py``)."""
    return _get(
        "json",
        lambda: WorkerPool(
            Path(__file__).with_name("_json_worker.py"),
            2,
            "check that jsonschema, regress and email-validator are installed",
        ),
    )


def _forget_parent_pool() -> None:
    # A forked child inherits the parent's pool objects (and possibly a held lock) but not its
    # worker processes' ownership; start from nothing.
    global _POOLS, _POOL_LOCK
    _POOLS, _POOL_LOCK = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_pool)


@atexit.register
def _close_pool() -> None:
    for pool in list(_POOLS.values()):
        if pool.owner_pid == os.getpid():
            pool.close()
