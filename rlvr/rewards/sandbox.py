"""Run untrusted Python in a sandbox and collect what it reported, with hard limits.

The parent side of ``_sandbox_harness.py``. One call, ``run_sandboxed``, starts the harness in
its own session, feeds it the spec over a pipe, reads stdout, stderr and the result channel with
byte caps, kills it at the wall-clock deadline, and then makes sure nothing it started survives:

  * ``namespaces`` isolation (root): the model's code is PID 1 of its own PID namespace, under a
    uid of its own; the parent SIGKILLs every process with that uid (found in /proc), which takes
    the namespace down (the kernel kills and reaps the rest), then reaps the harness;
  * other isolations: the parent SIGKILLs the process group, then every process whose initial
    environment carries this run's ``RLVR_SANDBOX`` marker (a child that called setsid keeps it).

Isolation choice (``isolation="auto"``): ``namespaces`` when running as root (root inside
bubblewrap would keep root's exemption from RLIMIT_NPROC, so a fork bomb would not be capped),
else ``bwrap`` when bubblewrap is installed (``apt-get install bubblewrap``), else ``rlimits``.
"""

from __future__ import annotations

import ast
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

HARNESS_PATH = Path(__file__).with_name("_sandbox_harness.py")
MAX_VALUE_CHARS = 8 << 20  # one returned value, encoded (the harness's limit): ~1M small ints in a list
CHANNEL_BYTES = 64 << 20  # all values of one run together
Isolation = Literal["auto", "namespaces", "bwrap", "rlimits"]


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0  # wall clock for the whole run
    memory_mb: int = 512  # RLIMIT_AS
    nproc: int = 32  # RLIMIT_NPROC (processes + threads of the sandbox uid)
    fsize_mb: int = 8  # RLIMIT_FSIZE: largest file it may write
    tmpfs_mb: int = 16  # size of its private /tmp (namespaces isolation)
    nofile: int = 64
    output_bytes: int = 1 << 20  # stdout and stderr each; more is an "output bomb" and kills the run

    def for_harness(self) -> dict[str, Any]:
        return {
            "cpu_s": max(1, math.ceil(self.timeout_s)),
            "memory_mb": self.memory_mb,
            "nproc": self.nproc,
            "fsize_mb": self.fsize_mb,
            "tmpfs_mb": self.tmpfs_mb,
            "nofile": self.nofile,
        }


@dataclass
class RunResult:
    records: list[tuple[str, int, str]] = field(default_factory=list)  # (KIND, index, payload) with the token
    foreign_lines: int = 0  # result-channel lines without the token: the program wrote there
    done: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    returncode: int | None = None
    timed_out: bool = False
    output_overflow: bool = False
    isolation: str = ""
    killed_after_exit: int = 0  # processes still alive after the harness ended (detached children)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


class SandboxSetupError(RuntimeError):
    """The sandbox could not be built (not the program's fault): never scored as a wrong answer."""


_AUTO_CHOICE: str | None = None
_AUTO_LOCK = threading.Lock()


def _works(isolation: str) -> bool:
    try:
        run = run_sandboxed(
            "pass", [{"kind": "eval", "code": "1 + 1"}], limits=Limits(timeout_s=30), isolation=isolation
        )
    except SandboxSetupError:
        return False
    return run.done and ("VALUE", 0, "2") in run.records


def resolve_isolation(isolation: Isolation = "auto") -> str:
    """The isolation a run will use. ``auto`` probes once per process: root without
    CAP_SYS_ADMIN (a default Docker container) cannot create namespaces, and bubblewrap may be
    installed but blocked, so the first choice that actually runs a program wins."""
    global _AUTO_CHOICE
    if isolation == "auto":
        with _AUTO_LOCK:
            if _AUTO_CHOICE is None:
                candidates = []
                if os.geteuid() == 0 and sys.platform.startswith("linux"):
                    candidates.append("namespaces")
                if shutil.which("bwrap"):
                    candidates.append("bwrap")
                _AUTO_CHOICE = next((c for c in candidates if _works(c)), "rlimits")
                if _AUTO_CHOICE == "rlimits":
                    warnings.warn(
                        "code sandbox: neither namespaces (needs root with CAP_SYS_ADMIN) nor bubblewrap is usable here; "
                        "falling back to rlimits only, which cannot stop a program from signalling or reading the "
                        "calling user's processes and files. Install bubblewrap: apt-get install bubblewrap",
                        stacklevel=2,
                    )
            return _AUTO_CHOICE
    return _explicit_isolation(isolation)


def _explicit_isolation(isolation: str) -> str:
    if isolation not in ("namespaces", "bwrap", "rlimits"):
        raise ValueError(f"sandbox isolation must be one of auto, namespaces, bwrap, rlimits; got {isolation!r}")
    if isolation == "namespaces" and os.geteuid() != 0:
        raise ValueError(
            "sandbox isolation 'namespaces' needs root; use 'auto', 'bwrap' (apt-get install bubblewrap) or 'rlimits'"
        )
    if isolation == "bwrap" and shutil.which("bwrap") is None:
        raise ValueError("sandbox isolation 'bwrap' needs bubblewrap: apt-get install bubblewrap (or use 'auto')")
    return isolation


def root_paths() -> list[str]:
    """What the sandbox's otherwise empty root holds, read-only: system libraries and this interpreter's
    prefixes. One list for both isolations: the harness computes it for the namespaces one, and
    bubblewrap is given the same (the harness module is stdlib-only, so importing it here is cheap)."""
    from rlvr.rewards._sandbox_harness import root_paths as harness_root_paths

    return harness_root_paths()


def bwrap_argv(workdir: str, tmpfs_mb: int) -> list[str]:
    """bubblewrap wrapper: an empty root with only the interpreter and system libraries bound
    read-only, private sized /tmp and /dev/shm, new /dev and /proc, no network, new session,
    dies with us. ``workdir`` (0700, deleted after the run) is the working directory."""
    size = str(tmpfs_mb << 20)
    links = [
        a
        for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
        if os.path.islink(link)
        for a in ("--symlink", os.readlink(link), link)
    ]
    return [
        shutil.which("bwrap") or "bwrap",
        # the fresh /tmp first: an interpreter or checkout under /tmp (CI) is bound over it, not hidden by it
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--size",
        size,
        "--tmpfs",
        "/tmp",
        "--size",
        size,
        "--tmpfs",
        "/dev/shm",
        *[arg for path in root_paths() for arg in ("--ro-bind", path, path)],
        "--ro-bind",
        str(HARNESS_PATH),
        str(HARNESS_PATH),
        *links,
        "--bind",
        workdir,
        workdir,
        "--chdir",
        workdir,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
    ]


def _sweep(predicate, max_passes: int = 50) -> int:
    """SIGKILL every process matching ``predicate(pid)`` until a pass finds none; returns the count."""
    killed = 0
    for _ in range(max_passes):
        found = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                if predicate(pid):
                    os.kill(pid, signal.SIGKILL)
                    found += 1
            except (ProcessLookupError, PermissionError, FileNotFoundError, OSError):
                continue
        killed += found
        if not found:
            break
        time.sleep(0.01)
    return killed


def _uid_of(pid: int) -> int | None:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
            if line.startswith(b"State:") and b"Z" in line.split()[1:2][0]:
                return None  # a zombie holds no resources; its parent reaps it
    return None


def sandbox_processes(uid: int | None = None, marker: str | None = None) -> list[int]:
    """Live (non-zombie) processes of one sandbox run, for tests and diagnostics."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if uid is not None and _uid_of(pid) == uid or marker is not None and _has_marker(pid, marker):
                pids.append(pid)
        except OSError:
            continue
    return pids


def _has_marker(pid: int, marker: str) -> bool:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f"RLVR_SANDBOX={marker}".encode() in f.read().split(b"\0")


def run_sandboxed(
    source: str,
    steps: list[dict[str, str]] | None = None,
    *,
    mode: Literal["assert", "stdio"] = "assert",
    stdin: str | None = None,
    limits: Limits = Limits(),
    isolation: Isolation = "auto",
) -> RunResult:
    """Run ``source`` then ``steps`` (``{"kind": "exec"|"eval", "code": ...}``) in a fresh sandbox."""
    chosen = resolve_isolation(isolation)
    token = secrets.token_hex(16)
    marker = secrets.token_hex(8)
    uid = 100_000 + secrets.randbelow(1_000_000_000)  # a uid of its own: RLIMIT_NPROC per run
    spec = {
        "token": token,
        "mode": mode,
        "source": source,
        "steps": steps or [],
        "stdin": stdin,
        "limits": limits.for_harness(),
        "isolation": chosen,
        "uid": uid,
    }
    workdir = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    os.chmod(workdir, 0o700)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/tmp/work" if chosen == "namespaces" else workdir,
        "TMPDIR": "/tmp/work" if chosen == "namespaces" else workdir,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        # Thread pools of numeric libraries count against RLIMIT_NPROC: one thread each.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "RLVR_SANDBOX": marker,
    }
    argv = [sys.executable, "-I", str(HARNESS_PATH)]
    if chosen == "bwrap":
        argv = bwrap_argv(workdir, limits.tmpfs_mb) + argv
    result_r, result_w = os.pipe()
    result = RunResult(isolation=chosen)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv + [str(result_w)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(result_w,),
            cwd=workdir,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(result_w)
    try:
        channel = _pump(
            proc, json.dumps(spec).encode(), result_r, start + limits.timeout_s, limits.output_bytes, result
        )
    finally:
        os.close(result_r)
        # The harness has exited (still unreaped) or is being cut off. Kill before reaping: while
        # the harness is unreaped its pid, which is also the process group id, cannot be reused,
        # so killpg cannot hit an unrelated group.
        killed = _kill_run(proc, chosen, uid, marker)
        if not (result.timed_out or result.output_overflow):
            result.killed_after_exit = killed  # detached children (setsid, double fork) that outlived it
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        result.returncode = proc.returncode
        shutil.rmtree(workdir, ignore_errors=True)
    result.seconds = time.monotonic() - start
    _parse_channel(channel, token, result)
    setup = [payload for kind, idx, payload in result.records if kind == "SETUP"]
    if setup:
        raise SandboxSetupError(
            f"the {chosen} sandbox could not be set up ({setup[0]}); use isolation='auto' to pick one that works here, "
            "or install bubblewrap (apt-get install bubblewrap)"
        )
    return result


def _kill_run(proc: subprocess.Popen, isolation: str, uid: int, marker: str) -> int:
    killed = 0
    if isolation == "namespaces":
        killed += _sweep(lambda pid: _uid_of(pid) == uid)  # PID 1 of the namespace takes the rest down
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if isolation != "namespaces":
        killed += _sweep(lambda pid: pid != os.getpid() and _has_marker(pid, marker))
    return killed


def _pump(proc: subprocess.Popen, spec: bytes, result_r: int, deadline: float, cap: int, result: RunResult) -> bytes:
    """Write the spec, read the three outputs (capped) until the harness exits or the deadline."""
    sel = selectors.DefaultSelector()
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(), result_r: bytearray()}
    for fd in buffers:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    stdin_fd = proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_WRITE)
    pending = memoryview(spec)
    exit_fd = os.pidfd_open(proc.pid) if hasattr(os, "pidfd_open") else None
    if exit_fd is not None:
        sel.register(exit_fd, selectors.EVENT_READ)
    exited = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # This thread may wake late (another thread held the GIL): a program that already
                # finished is judged on what it wrote, not on when the parent got round to it.
                if _has_exited(proc.pid):
                    _drain(buffers)
                    break
                result.timed_out = True
                break
            events = sel.select(timeout=min(remaining, 0.05 if exit_fd is None else remaining))
            for key, _ in events:
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        pending = pending[os.write(fd, pending[:65536]) :]
                    except BlockingIOError:
                        pass
                    except BrokenPipeError:  # the harness died before reading its spec
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                elif fd == exit_fd:
                    exited = True
                else:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        continue
                    buffers[fd] += chunk
                    limit = cap if fd != result_r else max(4 * cap, CHANNEL_BYTES)
                    if len(buffers[fd]) > limit:
                        result.output_overflow = True
            if result.output_overflow:
                break
            if exited or (exit_fd is None and _has_exited(proc.pid)):
                _drain(buffers)
                break
    finally:
        if exit_fd is not None:
            os.close(exit_fd)
        sel.close()
        if not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
    result.stdout = bytes(buffers[proc.stdout.fileno()][:cap])
    result.stderr = bytes(buffers[proc.stderr.fileno()][:cap])
    return bytes(buffers[result_r])


def _has_exited(pid: int) -> bool:
    # WNOWAIT: look without reaping, so the pid (and process group id) stays ours until killpg.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _drain(buffers: dict[int, bytearray]) -> None:
    # After the harness exits, take what is already in the pipes; a detached child that holds a
    # pipe open must not keep the parent waiting.
    for fd, buf in buffers.items():
        while True:
            try:
                chunk = os.read(fd, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            buf += chunk
            if len(buf) > 8 << 20:
                break


def _parse_channel(channel: bytes, token: str, result: RunResult) -> None:
    for raw in channel.decode("utf-8", "replace").splitlines():
        parts = raw.split("\t", 3)
        if len(parts) != 4 or parts[0] != token:
            result.foreign_lines += 1
            continue
        _, kind, index, payload = parts
        try:
            idx = int(index)
        except ValueError:
            result.foreign_lines += 1
            continue
        if kind == "NOTE":
            result.notes.append(payload)
            continue
        result.records.append((kind, idx, payload))
        if kind == "DONE":
            result.done = True


# ---------------------------------------------------------------------------------------------
# Plain-data values: read back without evaluating anything
# ---------------------------------------------------------------------------------------------


class NotLiteral(ValueError):
    pass


def decode_value(payload: str) -> Any:
    """The value the harness encoded (see ``_sandbox_harness``'s module doc): exact and reversible
    for any string, any int, floats (inf, nan), bytes, complex, Fraction, Decimal and containers;
    Counter stays a Counter, other dict subclasses become dicts and namedtuples tuples."""
    from collections import Counter
    from decimal import Decimal
    from fractions import Fraction

    if len(payload) > MAX_VALUE_CHARS + 64:
        raise NotLiteral("value too large")
    try:
        tree = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise NotLiteral(f"not an encoded value: {exc}") from None

    def build(node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, str)):
            return node
        if isinstance(node, list):
            return [build(x) for x in node]
        if not isinstance(node, dict) or len(node) != 1:
            raise NotLiteral("malformed value")
        ((tag, body),) = node.items()
        if tag == "i":
            return int(body, 16)
        if tag == "f":
            return float.fromhex(body)
        if tag == "c":
            return complex(float.fromhex(body[0]), float.fromhex(body[1]))
        if tag == "y":
            return bytes.fromhex(body)
        if tag == "q":
            return Fraction(int(body[0], 16), int(body[1], 16))
        if tag == "D":
            return Decimal(body)
        if tag == "t":
            return tuple(build(x) for x in body)
        if tag in ("S", "F"):
            return (set if tag == "S" else frozenset)(build(x) for x in body)
        if tag in ("d", "C"):
            pairs = {build(k): build(v) for k, v in body}
            return Counter(pairs) if tag == "C" else pairs
        raise NotLiteral(f"unknown value tag {tag!r}")

    try:
        return build(tree)
    except (TypeError, ValueError, RecursionError) as exc:
        raise NotLiteral(f"malformed value: {exc}") from None


def literal_value(node: ast.AST | str) -> Any:
    """``ast.literal_eval`` plus ``inf``/``nan`` and ``set()`` (what ``repr`` of plain data emits)."""
    if isinstance(node, str):
        if len(node) > 4 << 20:
            raise NotLiteral("value too large")
        try:
            node = ast.parse(node, mode="eval").body
        except (SyntaxError, RecursionError, MemoryError, ValueError) as exc:
            raise NotLiteral(str(exc)) from None
    if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
        return float(node.id)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("set", "frozenset")
        and not node.args
        and not node.keywords
    ):
        return set() if node.func.id == "set" else frozenset()
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = literal_value(node.operand)
        if isinstance(v, (int, float, complex)) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):  # complex: 1+2j
        left, right = literal_value(node.left), literal_value(node.right)
        if isinstance(right, complex) and isinstance(left, (int, float)):
            return left + right if isinstance(node.op, ast.Add) else left - right
    if isinstance(node, ast.Tuple):
        return tuple(literal_value(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [literal_value(e) for e in node.elts]
    if isinstance(node, ast.Set):
        return {literal_value(e) for e in node.elts}
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {literal_value(k): literal_value(v) for k, v in zip(node.keys, node.values)}
    raise NotLiteral(f"not a literal: {type(node).__name__}")
