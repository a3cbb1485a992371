"""Expected failures and how the command line shows them: one line naming the problem and the fix.

A failure the user can fix (a config, a data file, a reward function that breaks its contract, a run
folder in use, a full disk) is raised as ``UserError`` or one of the other classes in
``expected_errors()``; ``rlvr`` prints it as ``error: ...`` and exits non-zero. The traceback of rlvr's
internals helps nobody there, so it is shown only with ``RLVR_DEBUG=1``. Anything else is a bug in
rlvr and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from typing import Iterator


class UserError(Exception):
    """A failure the user can fix; the message says what and how. ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def debug_enabled() -> bool:
    return os.environ.get("RLVR_DEBUG", "") not in ("", "0", "false", "False")


def disk_full_message(err: OSError, where: str) -> str:
    """ENOSPC as one line: which file (when the OS said), what is safe, how to go on."""
    target = f" while writing {err.filename}" if getattr(err, "filename", None) else f" while writing into {where}"
    return (
        f"no space left on device{target}. Checkpoints are written to a temporary folder and renamed only "
        "when complete, so the newest checkpoint is intact: free some space, then rerun with resume=true"
    )


def is_disk_full(err: BaseException, folder: str | os.PathLike | None = None) -> bool:
    """ENOSPC/EDQUOT, or a writer's own error (torch's "file write failed" is a RuntimeError without an
    errno) while the folder's file system has no room left."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if "No space left on device" in str(err):
        return True
    if folder is not None and isinstance(err, (OSError, RuntimeError)):
        import shutil

        try:
            return shutil.disk_usage(folder).free < 1 << 20
        except OSError:
            return False
    return False


@contextmanager
def disk_full_names(target: str | os.PathLike) -> Iterator[None]:
    """Re-raise a full disk while writing ``target`` as OSError(ENOSPC) that names it."""
    try:
        yield
    except Exception as e:
        if is_disk_full(e, os.path.dirname(os.fspath(target)) or "."):
            raise OSError(errno.ENOSPC, "No space left on device", os.fspath(target)) from e
        raise


def expected_errors() -> tuple[type[BaseException], ...]:
    """The exception classes a user's input can cause, shown as one line by the command line."""
    from rlvr.config import ConfigError

    # UserError covers rlvr's own (reward functions breaking their contract among them);
    # ValueError/OSError/TypeError/KeyError are raised with a message for the user by the loaders,
    # data readers and checkpoint code (a bad file, a wrong model, a mismatched checkpoint).
    return (UserError, ConfigError, ValueError, OSError, TypeError, KeyError)


def one_line(err: BaseException) -> str:
    """The message of an expected error, for ``error: ...``. KeyError quotes its message: unquote it."""
    if is_disk_full(err):
        return disk_full_message(err, "the run folder")  # type: ignore[arg-type]
    if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
        return err.args[0]
    return str(err) or type(err).__name__
