"""Symbolic equivalence with a timeout enforced from outside: a small pool of killable workers.

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


class SymbolicPool:
    """``compare(gold, pred, timeout_s)`` on up to ``size`` worker processes."""

    def __init__(self, size: int = 2):
        self.size = size
        self.owner_pid = os.getpid()
        self._idle: list[_Worker] = []
        self._live = 0
        self._cond = threading.Condition()
        self.timeouts = 0  # comparisons killed at their deadline since the pool started
        self.restarts = 0

    def _spawn(self) -> _Worker:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(WORKER_PATH)],
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
                "the math-verify worker did not start; check that math-verify is installed in "
                f"{sys.executable}'s environment (pip install math-verify)"
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

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None:
                self._live -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def compare(self, gold: str, pred: str, timeout_s: float, gold_decimals: int | None = None) -> Outcome:
        """``gold_decimals``: the gold is a decimal with this many places, and a prediction that
        rounds to it is the same answer; None: the gold is exact and so must the prediction be."""
        worker = self._acquire()
        try:
            request = {"gold": gold, "pred": pred, "decimals": gold_decimals}
            worker.proc.stdin.write((json.dumps(request) + "\n").encode())
            worker.proc.stdin.flush()
            line = worker.read_line(time.monotonic() + timeout_s)
        except (BrokenPipeError, OSError):
            line = None
        if line is None:
            timed_out = worker.proc.poll() is None
            worker.kill()
            self._release(None)
            with self._cond:
                if timed_out:
                    self.timeouts += 1
                self.restarts += 1
            return "timeout" if timed_out else "error"
        self._release(worker)
        reply = json.loads(line)
        if "error" in reply:
            return "error"
        if not reply.get("parsed", True):
            return "unparsed"
        return "equal" if reply["equal"] else "not_equal"

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for worker in idle:
            worker.kill()


_POOL: SymbolicPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> SymbolicPool:
    """This process's pool (a forked child gets a fresh one; it must not share its parent's pipes)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.owner_pid != os.getpid():
            _POOL = SymbolicPool()
        return _POOL


def _forget_parent_pool() -> None:
    # A forked child inherits the parent's pool object (and possibly a held lock) but not its
    # worker processes' ownership; start from nothing.
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_pool)


@atexit.register
def _close_pool() -> None:
    if _POOL is not None and _POOL.owner_pid == os.getpid():
        _POOL.close()
