"""Code sandbox harness: the trusted program that sets up isolation, then runs model code.

Started by ``rlvr.rewards.sandbox`` as ``python -I <this file> <result_fd>`` with a cleared
environment, in its own session and process group. It imports nothing from rlvr. It reads one
JSON spec from stdin (the parent closes stdin after it), so nothing the model could look for is
on disk; expected values are never in the spec at all — the parent keeps them.

Isolation, chosen by the parent (``spec["isolation"]``):
  * ``namespaces`` (the parent is root): new network, mount, IPC, UTS and PID namespaces; fresh
    tmpfs on /tmp, /var/tmp, /dev/shm and /proc; directories the interpreter needs but that are
    private to root (e.g. /root/.pyenv under a 0700 /root) are re-exposed read-only-by-permission
    under an otherwise empty tmpfs; then the model's code runs as PID 1 of the new PID namespace
    under an unprivileged uid of its own, so RLIMIT_NPROC binds (root ignores it) and, when PID 1
    exits or is killed, the kernel kills and reaps everything it started, setsid or not.
  * ``bwrap``: the parent wrapped this process in bubblewrap; only rlimits are set here.
  * ``rlimits`` (fallback): rlimits, and a network namespace when unprivileged user namespaces
    are available; when the parent is root (without CAP_SYS_ADMIN), the program also runs under
    an unprivileged uid of its own, so it cannot signal or read root's processes and files.

Result channel: lines ``<token>\\t<KIND>\\t<index>\\t<payload>`` on the file descriptor given
in argv[1]. KIND is VALUE (a plain-data value in the exact encoding below), ERROR (exception
name), EXIT (exit code of a stdio program) or DONE (written only after every step ran).

Value encoding (decoded by ``rlvr.rewards.sandbox.decode_value``): JSON, where null, booleans,
integers below 2**53, strings (ASCII-escaped: newlines and backslashes round-trip exactly) and
arrays (lists) are themselves, and other types are one-key objects: {"i": hex} big int (hex is
not subject to Python's 4300-digit decimal limit), {"f": float.hex} float (exact, inf and nan
included), {"c": [re, im]}, {"y": hex} bytes, {"t": [...]} tuple (namedtuples too), {"S": [...]}
set, {"F": [...]} frozenset, {"d": [[k, v], ...]} dict (defaultdict and OrderedDict too),
{"C": [[k, v], ...]} Counter, {"q": [num, den]} Fraction, {"D": str} Decimal. The encoder reads
only exact builtin types through methods captured before the model's code runs, so no object
can bring its own ``__eq__``, ``__repr__``, ``__iter__`` or ``items`` to the parent.
"""

import _json
import ctypes
import json
import os
import resource
import sys
from collections import Counter, OrderedDict, defaultdict
from decimal import Decimal
from fractions import Fraction

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_write, _repr, _type, _eval, _exec = os.write, repr, type, eval, exec  # captured before model code runs
MAX_VALUE_CHARS = 8 << 20  # one encoded value; larger is "too large", stated in docs/checkers.md
_enc_str = _json.encode_basestring_ascii  # the C function itself: patching json.encoder cannot reach it
_int_format, _float_hex, _bytes_hex, _dec_str = int.__format__, float.hex, bytes.hex, Decimal.__str__
_dict_items, _len, _isinstance, _str_join = dict.items, len, isinstance, str.join
_iters = {t: t.__iter__ for t in (list, tuple, set, frozenset)}
_frac_num, _frac_den = Fraction.__dict__["_numerator"].__get__, Fraction.__dict__["_denominator"].__get__
_complex_real, _complex_imag = complex.real.__get__, complex.imag.__get__
_DICTS = {dict: "d", defaultdict: "d", OrderedDict: "d", Counter: "C"}
_SEQS = {list: None, tuple: "t", set: "S", frozenset: "F"}


class _NotPlain(Exception):
    pass


def _is_namedtuple(t) -> bool:
    return t.__mro__[1:2] == (tuple,) and "_fields" in t.__dict__


def _encode(value, out: list, depth: int = 0) -> None:
    """Append the exact encoding of ``value`` (see the module doc) to ``out``; _NotPlain otherwise."""
    if depth > 100:
        raise _NotPlain("nested too deep")
    t = _type(value)
    if value is None:
        out.append("null")
    elif t is bool:
        out.append("true" if value else "false")
    elif t is int:
        out.append(_int_format(value, "d") if -(1 << 53) < value < (1 << 53) else '{"i":"' + _int_format(value, "x") + '"}')
    elif t is float:
        out.append('{"f":"' + _float_hex(value) + '"}')
    elif t is str:
        out.append(_enc_str(value))
    elif t is bytes:
        out.append('{"y":"' + _bytes_hex(value) + '"}')
    elif t is complex:
        out.append('{"c":["' + _float_hex(_complex_real(value)) + '","' + _float_hex(_complex_imag(value)) + '"]}')
    elif t is Fraction:
        out.append('{"q":["' + _int_format(_frac_num(value), "x") + '","' + _int_format(_frac_den(value), "x") + '"]}')
    elif t is Decimal:
        out.append('{"D":' + _enc_str(_dec_str(value)) + "}")
    elif t in _DICTS:
        out.append('{"' + _DICTS[t] + '":[')
        for n, (k, v) in enumerate(_dict_items(value)):
            out.append("[" if n == 0 else ",[")
            _encode(k, out, depth + 1)
            out.append(",")
            _encode(v, out, depth + 1)
            out.append("]")
        out.append("]}")
    elif t in _SEQS or _is_namedtuple(t):
        tag = _SEQS.get(t, "t")
        out.append("[" if tag is None else '{"' + tag + '":[')
        for n, item in enumerate(_iters[t if t in _SEQS else tuple](value)):
            if n:
                out.append(",")
            _encode(item, out, depth + 1)
        out.append("]" if tag is None else "]}")
    else:
        raise _NotPlain(t.__name__)
    if _len(out) > 4096:  # keep the piece list short and the size bounded as we go
        joined = _str_join("", out)
        if _len(joined) > MAX_VALUE_CHARS:
            raise _NotPlain("too large")
        out[:] = [joined]


def encode_value(value) -> str | None:
    out: list = []
    try:
        _encode(value, out)
    except (_NotPlain, RecursionError):
        return None
    joined = _str_join("", out)
    return joined if _len(joined) <= MAX_VALUE_CHARS else None


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _blocked_ancestor(path: str):
    """(ancestor that a non-root uid cannot traverse, child of it on the way to path) or None."""
    parts = os.path.realpath(path).split("/")[1:]
    current = ""
    for i, part in enumerate(parts[:-1]):
        current += "/" + part
        if not os.stat(current).st_mode & 0o001:
            return current, current + "/" + parts[i + 1]
    return None


def _expose_interpreter() -> None:
    """Make the running interpreter's own files reachable for the unprivileged uid.

    Under a 0700 ancestor (pyenv's /root/.pyenv), mount an empty 0755 tmpfs over the ancestor and
    bind back only the subtrees the interpreter uses: the sandbox sees /root/.pyenv and nothing
    else of /root.
    """
    needed = _interpreter_paths()
    plan: dict[str, set[str]] = {}
    for path in needed:
        hit = _blocked_ancestor(path)
        if hit:
            plan.setdefault(hit[0], set()).add(hit[1])
    for n, (ancestor, children) in enumerate(sorted(plan.items())):
        staged = []
        for k, child in enumerate(sorted(children)):
            stage = f"/tmp/.stage{n}_{k}"
            os.mkdir(stage, 0o700) if os.path.isdir(child) else open(stage, "w").close()
            _mount(child, stage, None, MS_BIND | MS_REC)
            staged.append((stage, child))
        _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for stage, child in staged:
            os.mkdir(child, 0o755) if os.path.isdir(stage) else open(child, "w").close()
            _mount(stage, child, None, MS_BIND | MS_REC)
            _check(_libc.umount2(stage.encode(), MNT_DETACH), f"umount {stage}")
            os.rmdir(stage) if os.path.isdir(stage) else os.unlink(stage)


def _interpreter_paths() -> set:
    """Files and folders the running interpreter may still read: its prefixes and sys.path."""
    needed = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    return needed | {p for p in sys.path if p and os.path.exists(p)}


def _pin_under(top: str) -> list:
    """O_PATH handles on the topmost interpreter paths under ``top`` (a venv in a checkout under
    /tmp, as CI clones often are), taken before a tmpfs covers ``top``; `_restore_pinned` binds
    them back. Without this the interpreter loses its own files and the sandbox cannot start."""
    inside = sorted(os.path.realpath(p) for p in _interpreter_paths() if os.path.realpath(p).startswith(top + "/"))
    tops = [p for i, p in enumerate(inside) if not any(p.startswith(q + "/") or p == q for q in inside[:i])]
    return [(p, os.open(p, os.O_PATH)) for p in tops]


def _restore_pinned(pinned: list) -> None:
    for path, fd in pinned:
        handle = f"/proc/self/fd/{fd}"
        if os.path.isdir(handle):
            os.makedirs(path, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
            open(path, "w").close()
        _mount(handle, path, None, MS_BIND | MS_REC)
        os.close(fd)


def _enter_namespaces(spec: dict) -> None:
    """Runs as root in the harness; returns in the forked PID-1 child, as the sandbox uid."""
    _check(_libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    pid = os.fork()
    if pid:  # outer harness: wait for PID 1 of the sandbox, then leave with its status
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    uid = int(spec["uid"])
    tmp_mb = int(spec["limits"]["tmpfs_mb"])
    pinned = _pin_under("/tmp")
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb}m,mode=1777")
    _restore_pinned(pinned)
    _expose_interpreter()
    for path in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,mode=1777")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir("/tmp/work", 0o700)
    os.chown("/tmp/work", uid, uid)
    os.chdir("/tmp/work")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # drops every capability: the rest runs as an ordinary user
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")  # no setuid binaries


def _set_limits(limits: dict) -> None:
    mb = 1024 * 1024
    cpu = int(limits["cpu_s"])
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2),
        (resource.RLIMIT_NPROC, (limits["nproc"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["fsize_mb"] * mb,) * 2),
        (resource.RLIMIT_NOFILE, (limits["nofile"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(res, value)


def main() -> None:
    fd = int(sys.argv[1])
    spec = json.loads(sys.stdin.buffer.read())
    token = spec["token"]

    def emit(kind: str, index: int, payload: str = "") -> None:
        payload = payload.replace("\n", " ")  # values are ASCII-escaped JSON: no raw newline is ever lost
        data = f"{token}\t{kind}\t{index}\t{payload}\n".encode()
        while data:
            data = data[_write(fd, data):]

    try:
        root_fallback = spec["isolation"] == "rlimits" and os.geteuid() == 0
        if spec["isolation"] == "namespaces":
            _enter_namespaces(spec)
        elif root_fallback:
            if _libc.unshare(CLONE_NEWNET) != 0:
                emit("NOTE", -1, "no network namespace: root without CAP_SYS_ADMIN")
        elif spec["isolation"] == "rlimits" and _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            emit("NOTE", -1, "no network namespace: unprivileged user namespaces unavailable")
        _set_limits(spec["limits"])
        if root_fallback:
            # Root without namespaces: at least stop being root, so the program cannot signal or
            # read root's processes and files (kill(-1, SIGKILL) would take the trainer down).
            # The cost: modules under a root-only folder (/root/.pyenv) that are not imported yet
            # cannot be imported. Install bubblewrap or grant CAP_SYS_ADMIN for the full sandbox.
            uid = int(spec["uid"])
            os.chown(os.getcwd(), uid, uid)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    except Exception as exc:  # noqa: BLE001 - a sandbox that cannot be built must never run the program
        emit("SETUP", -1, f"{_type(exc).__name__}: {exc}")
        os._exit(3)
    _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)

    stdin_text = spec.get("stdin")
    if stdin_text is not None:
        with open(".stdin", "w") as f:
            f.write(stdin_text)
        new = os.open(".stdin", os.O_RDONLY)
        os.dup2(new, 0)
        os.close(new)
        os.unlink(".stdin")
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the program
    else:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)

    import builtins

    mode = spec["mode"]
    # Dataset conventions: a stdio program runs as __main__; a function-style solution is the
    # module ``solution`` (tests may ``from solution import f`` or ``import solution``), also
    # written to ./solution.py so that multiprocessing children and subprocesses can import it.
    with open("solution.py", "w") as f:
        f.write(spec["source"])
    sys.path.insert(0, os.getcwd())
    if mode == "stdio":
        namespace = {"__name__": "__main__", "__builtins__": builtins, "__file__": os.path.abspath("solution.py")}
    else:
        import types

        module = types.ModuleType("solution")
        module.__file__ = os.path.abspath("solution.py")
        sys.modules["solution"] = module
        namespace = module.__dict__
    try:
        code = compile(spec["source"], "solution.py", "exec")
        exec(code, namespace)  # noqa: S102 - running the model's program is this sandbox's job
    except SystemExit as exc:
        if mode == "stdio" and exc.code in (None, 0):
            pass  # a program that ends with sys.exit(0) after printing its answer is fine
        else:
            sys.stdout.flush()
            emit("EXIT", -1, _repr(exc.code))
            os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        sys.stdout.flush()
        emit("ERROR", -1, _type(exc).__name__)
        os._exit(0)
    for index, step in enumerate(spec["steps"]):
        try:
            if step["kind"] == "exec":
                _exec(step["code"], namespace)
                emit("OK", index)
            else:
                value = _eval(step["code"], namespace)
                encoded = encode_value(value)
                emit("VALUE", index, encoded if encoded is not None else "<not plain data>")
        except SystemExit:
            sys.stdout.flush()
            emit("EXIT", index)
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001
            emit("ERROR", index, _type(exc).__name__)
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001, S110 - a closed stdout is the program's problem; the parent sees the output
        pass
    emit("DONE", len(spec["steps"]))
    os._exit(0)


if __name__ == "__main__":
    main()
