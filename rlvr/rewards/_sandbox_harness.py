"""Code sandbox harness: the trusted program that sets up isolation, then runs model code.

Started by ``rlvr.rewards.sandbox`` as ``python -I <this file> <result_fd>`` with a cleared
environment, in its own session and process group. It imports nothing from rlvr. It reads one
JSON spec from stdin (the parent closes stdin after it), so nothing the model could look for is
on disk; expected values are never in the spec at all — the parent keeps them.

Isolation, chosen by the parent (``spec["isolation"]``):
  * ``namespaces`` (the parent is root): new network, mount, IPC, UTS and PID namespaces and an
    *empty root*: a tmpfs holding only /usr, the interpreter's prefixes (read-only), a private
    writable /tmp and /dev/shm, a few devices and its own /proc (``_build_root``), entered with
    pivot_root; the host's files, the project, the case files and host unix sockets do not exist
    there. The model's code runs as PID 1 of the new PID namespace under an unprivileged uid of
    its own, so RLIMIT_NPROC binds (root ignores it) and, when PID 1 exits or is killed, the
    kernel kills and reaps everything it started, setsid or not.
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
        small = -(1 << 53) < value < (1 << 53)
        out.append(_int_format(value, "d") if small else '{"i":"' + _int_format(value, "x") + '"}')
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


def encode_value(value) -> str:
    """The encoding of ``value``, or a marker the parent reads as "not plain data" / "too large"."""
    out: list = []
    try:
        _encode(value, out)
    except _NotPlain as exc:
        return "<too large>" if str(exc) == "too large" else "<not plain data>"
    except RecursionError:
        return "<not plain data>"
    joined = _str_join("", out)
    return joined if _len(joined) <= MAX_VALUE_CHARS else "<too large>"


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


# What the program's filesystem holds (namespaces isolation): an empty tmpfs root with these bound
# read-only, plus the interpreter's own prefixes; nothing else of the host exists for it.
SYSTEM_PATHS = ("/usr", "/etc/ld.so.cache", "/etc/localtime")
SYMLINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
MS_RDONLY, MS_REMOUNT, MS_MOVE = 1, 32, 8192
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}


def root_paths() -> list:
    """Real paths bound read-only into the sandbox's root: system libraries and the interpreter's
    prefixes (a venv and the Python it was made from). Editable-install source folders that .pth
    files put on sys.path are *not* bound: the project's own files stay invisible."""
    wanted = {
        *SYSTEM_PATHS,
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
    }
    real = sorted({os.path.realpath(p) for p in wanted if os.path.exists(p)})
    return [p for i, p in enumerate(real) if not any(p.startswith(q + "/") or p == q for q in real[:i])]


def _pivot_root(root: str) -> None:
    os.chdir(root)
    os.mkdir(".old", 0o700)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None and _libc.syscall(number, b".", b".old") == 0:
        os.chdir("/")
        _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
        os.rmdir("/.old")
        return
    # No pivot_root here: move the new root over / and chroot into it (the program runs without
    # CAP_SYS_CHROOT, so it cannot climb out).
    os.rmdir(".old")
    _mount(root, "/", None, MS_MOVE)
    _check(_libc.chroot(b"."), "chroot")
    os.chdir("/")


def _build_root(spec: dict, uid: int) -> None:
    """Replace the filesystem with an empty root: system libraries and the interpreter read-only,
    a private /tmp (the only writable place, ``tmpfs_mb``), /dev/shm (multiprocessing's
    semaphores), a few devices and a /proc of the sandbox's own PID namespace. Host sockets on the
    filesystem (/run/*.sock, /tmp/.X11-unix) do not exist in it; abstract sockets belong to the
    network namespace, which is new too."""
    tmp_mb = int(spec["limits"]["tmpfs_mb"])
    pinned = [(p, os.open(p, os.O_PATH)) for p in root_paths()]  # before a tmpfs covers /tmp (CI checkouts)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700")
    root = "/tmp/root"
    os.mkdir(root, 0o755)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path, fd in pinned:
        target = root + path
        handle = f"/proc/self/fd/{fd}"
        if os.path.isdir(handle):
            os.makedirs(target, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
            open(target, "w").close()
        _mount(handle, target, None, MS_BIND | MS_REC)
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    for link in SYMLINKS:
        if os.path.islink(link):
            os.symlink(os.readlink(link), root + link)
    os.mkdir(root + "/dev", 0o755)
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            open(f"{root}/dev/{name}", "w").close()
            _mount("/dev/" + name, f"{root}/dev/{name}", None, MS_BIND)
    for path, flags in (("/tmp", MS_NOSUID | MS_NODEV), ("/dev/shm", MS_NOSUID | MS_NODEV | MS_NOEXEC)):
        os.makedirs(root + path, 0o755, exist_ok=True)
        _mount("tmpfs", root + path, "tmpfs", flags, f"size={tmp_mb}m,nr_inodes=4096,mode=1777")  # a file-count cap too
    os.mkdir(root + "/proc", 0o555)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _pivot_root(root)
    os.mkdir("/tmp/work", 0o700)
    os.chown("/tmp/work", uid, uid)
    os.chdir("/tmp/work")


def _enter_namespaces(spec: dict) -> None:
    """Runs as root in the harness; returns in the forked PID-1 child, as the sandbox uid, inside
    an empty root (``_build_root``)."""
    _check(_libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    pid = os.fork()
    if pid:  # outer harness: wait for PID 1 of the sandbox, then leave with its status
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    uid = int(spec["uid"])
    _build_root(spec, uid)
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
            data = data[_write(fd, data) :]

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
        exec(code, namespace)  # noqa: S102 - safe: this is the sandboxed process, never the trainer
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
                emit("VALUE", index, encode_value(value))
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
