"""Who owns a run folder, and what a new run may do to one that already holds a run.

The rules (docs: README "Run folders", `log.output_dir`, `resume`, `overwrite` in docs/config.md):

- A folder that already holds a run (rlvr's ``header.json``, ``metrics.jsonl`` or ``checkpoints/``)
  is never appended to silently. ``rlvr train`` refuses it with one line naming the three ways on:
  ``resume=true`` (continue it), ``overwrite=true`` (delete it and start again) or another
  ``log.output_dir``. A numbered sibling folder was the other choice; it was not taken because
  every later command (``rlvr eval runs/default``, ``diagnose``, ``report``) would then silently read
  the old run.
- While a run trains, it holds an exclusive ``flock`` on ``OUTPUT_DIR/.rlvr.lock`` (its pid, host and
  start time are written inside, for the message a second run gets). The kernel drops the lock when
  the process dies, however it dies, so a lock is never stale; a second ``rlvr train`` into the same
  folder is refused at once instead of interleaving its steps.
- ``resume=true`` compares the new config with the folder's ``config.yaml`` (the previous segment's)
  and appends what changed, and at which step, to ``config-history.jsonl``; changes that cannot work
  on the saved state (another model, LoRA switched on or off, another LoRA shape) are refused, and
  so is a ``train.max_steps`` at or below the checkpoint's step (nothing to train; ``final/`` is left
  as it is).

Everything here runs before any model loads, on rank 0 only (the others share rank 0's folder).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from rlvr.errors import UserError, disk_full_message, is_disk_full

LOCK_NAME = ".rlvr.lock"
HISTORY_NAME = "config-history.jsonl"
# Keys whose change breaks the saved state: the weights or the adapter would not fit the checkpoint.
_FIXED_AT_RESUME = {
    "model.path": "the checkpoint holds this model's weights",
    "model.lora.enabled": "the checkpoint holds {what}",
    "model.lora.r": "the checkpoint's LoRA matrices have the old rank",
    "model.lora.target_modules": "the checkpoint's adapter covers the old modules",
}
# Keys that say how to start or where the folder is, not what the run is: never recorded as a change.
_NOT_COMPARED = {"resume", "overwrite", "log.output_dir"}  # the folder may have been moved


def holds_run(folder: Path) -> bool:
    """True when ``folder`` has what a started run leaves: its header, metrics or checkpoints."""
    return any((folder / name).exists() for name in ("header.json", "metrics.jsonl", "checkpoints"))


def _is_rlvr_folder(folder: Path) -> bool:
    """True when rlvr wrote ``header.json`` here (overwrite=true deletes only such folders)."""
    try:
        header = json.loads((folder / "header.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and "rlvr" in (header.get("versions") or {})


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v and not k.endswith("options"):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(old: dict, new: dict) -> dict[str, list]:
    """{dotted key: [old, new]} for every option whose value differs between two resolved configs."""
    a, b = _flatten(old), _flatten(new)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if k not in _NOT_COMPARED and a.get(k) != b.get(k)}


def checkpoint_step(ckpt: Path) -> int:
    try:
        return int(json.loads((ckpt / "state.json").read_text())["step"])
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"checkpoint {ckpt} is unreadable ({e}); pass another one with resume=PATH") from None


def _checkpoint_has_lora(ckpt: Path) -> bool | None:
    """Whether the checkpoint's trainable weights are a LoRA adapter (None: cannot tell). Reads only the
    names of the saved tensors (the DCP metadata file), not the tensors."""
    try:
        from torch.distributed.checkpoint import FileSystemReader

        keys = FileSystemReader(str(ckpt / "dcp")).read_metadata().state_dict_metadata.keys()
        return any("lora_" in k for k in keys if k.startswith("model."))
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is reported by load_checkpoint itself
        return None


def _resume_checkpoint(cfg: Any, folder: Path) -> Path | None:
    from rlvr.checkpoint import latest_checkpoint

    if cfg.resume is True:
        return latest_checkpoint(folder / "checkpoints")
    path = Path(cfg.resume)
    if not (path / "state.json").is_file():
        raise UserError(
            f"resume={cfg.resume}: no checkpoint there (a checkpoint folder holds state.json, e.g. "
            f"{folder / 'checkpoints' / 'step-000050'}); use resume=true for the newest one",
            code=2,
        )
    return path


def check_resume(cfg: Any, folder: Path, ckpt: Path) -> dict[str, list]:
    """Refuse a resume that cannot work; return the config changes (recorded by the caller)."""
    step = checkpoint_step(ckpt)
    if cfg.train.max_steps <= step:
        raise UserError(
            f"nothing to train: {ckpt} is at step {step} and train.max_steps is {cfg.train.max_steps}. "
            f"Raise train.max_steps (e.g. train.max_steps={step + cfg.train.max_steps}) to train further; "
            "final/ and the checkpoints are left as they are",
            code=2,
        )
    has_lora = _checkpoint_has_lora(ckpt)
    if has_lora is not None and has_lora != cfg.model.lora.enabled:
        what = "a LoRA adapter" if has_lora else "full weights, not a LoRA adapter"
        raise UserError(
            f"{ckpt} holds {what}: resume with model.lora.enabled={str(has_lora).lower()} "
            "(as the run was started), or start a new run in another log.output_dir",
            code=2,
        )
    old_path = folder / "config.yaml"
    if not old_path.is_file():
        return {}
    try:
        old = yaml.safe_load(old_path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    changes = config_changes(old, cfg.model_dump(mode="json"))
    for key, why in _FIXED_AT_RESUME.items():
        if key in changes:
            before, after = changes[key]
            what = "a LoRA adapter" if before else "full weights"
            raise UserError(
                f"resume cannot change {key} ({before!r} -> {after!r}): {why.format(what=what)}. "
                f"Set {key}={json.dumps(before)} to resume, or start a new run in another "
                "log.output_dir",
                code=2,
            )
    return changes


def _clear(folder: Path) -> None:
    """Delete a previous run's files, keeping the lock this run holds."""
    for entry in folder.iterdir():
        if entry.name == LOCK_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _lock(folder: Path) -> Any:
    """Take the folder's lock, or raise naming who holds it. Returns the open lock file."""
    fh = open(folder / LOCK_NAME, "a+")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        owner = fh.read().strip() or "another process"
        fh.close()
        raise UserError(
            f"{folder} is in use by a run that is still training ({owner}); wait for it to finish, "
            "or train into another log.output_dir",
            code=2,
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}")
    fh.flush()
    return fh


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


@contextmanager
def claim_run_folder(cfg: Any, console: Any = None, preflight: Any = None) -> Iterator[dict[str, Any]]:
    """Lock ``cfg.log.output_dir`` for this run and make it fit the request (fresh, resumed, overwritten).
    ``preflight()`` (reward functions, data, model path) runs after the folder is inspected and before
    anything in it changes, so a bad input leaves the old run untouched. Yields what was decided:
    ``{"checkpoint": Path | None, "changes": {...}}``. A full disk inside becomes one clear line."""
    folder = Path(cfg.log.output_dir)
    if not _is_main():
        if preflight is not None:
            preflight()
        yield {"checkpoint": None, "changes": {}}
        return
    if folder.exists() and not folder.is_dir():
        raise UserError(
            f"log.output_dir {str(folder)!r} is a file, not a folder; choose another log.output_dir", code=2
        )
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create log.output_dir {str(folder)!r}: {e.strerror}") from None
    lock = _lock(folder)
    try:
        decided = _decide(cfg, folder)
        if preflight is not None:
            preflight()
        if decided.pop("clear"):
            _clear(folder)
        if decided["changes"]:
            with open(folder / HISTORY_NAME, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "step": checkpoint_step(decided["checkpoint"]),
                            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                            "changed": decided["changes"],
                        }
                    )
                    + "\n"
                )
            if console is not None:
                console.info(
                    "resumed with a changed config (recorded in "
                    + HISTORY_NAME
                    + "): "
                    + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in decided["changes"].items())
                )
        try:
            yield decided
        except UserError:
            raise
        except Exception as e:
            if is_disk_full(e, folder):
                raise UserError(disk_full_message(e, str(folder))) from e  # type: ignore[arg-type]
            raise
    except BaseException:
        if created and [p.name for p in folder.iterdir()] == [LOCK_NAME]:
            (folder / LOCK_NAME).unlink()  # a run that failed before writing anything leaves no folder
            folder.rmdir()
        raise
    finally:
        lock.close()  # releases the flock


def _decide(cfg: Any, folder: Path) -> dict[str, Any]:
    """What to do with what the folder holds: {"clear": bool, "checkpoint": Path | None, "changes": {}}."""
    overwrite = bool(getattr(cfg, "overwrite", False))
    occupied = holds_run(folder)
    if cfg.resume is not False:
        ckpt = _resume_checkpoint(cfg, folder)
        if ckpt is None:
            # Killed before its first checkpoint: its steps will be redone from step 0, so its partial
            # logs go (keeping them would show every early step twice).
            return {"clear": occupied and _is_rlvr_folder(folder), "checkpoint": None, "changes": {}}
        return {"clear": False, "checkpoint": ckpt, "changes": check_resume(cfg, folder, ckpt)}
    if not occupied:
        return {"clear": False, "checkpoint": None, "changes": {}}
    if overwrite:
        if not _is_rlvr_folder(folder):
            raise UserError(
                f"overwrite=true: {folder} has files but no header.json written by rlvr, so it is not "
                "clearly a run folder and nothing was deleted; choose another log.output_dir",
                code=2,
            )
        return {"clear": True, "checkpoint": None, "changes": {}}
    raise UserError(
        f"{folder} already holds a run ({_describe(folder)}). Continue it with resume=true, replace it with "
        f"overwrite=true, or train into another folder, e.g. log.output_dir={_free_sibling(folder)}",
        code=2,
    )


def _describe(folder: Path) -> str:
    from rlvr.checkpoint import latest_checkpoint

    parts = []
    ckpt = latest_checkpoint(folder / "checkpoints")
    if ckpt is not None:
        parts.append(f"last checkpoint at step {checkpoint_step(ckpt)}")
    parts.append("finished: final/ exists" if (folder / "final").exists() else "not finished")
    return ", ".join(parts)


def _free_sibling(folder: Path) -> str:
    i = 2
    while (folder.parent / f"{folder.name}-{i}").exists():
        i += 1
    return str(folder.parent / f"{folder.name}-{i}")


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the lines of a JSONL log up to ``step``: what a resumed run has not redone. A line that does
    not parse (cut short by a full disk or a kill mid-write) is dropped, not a reason to fail."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    path.write_text("".join(line + "\n" for line in kept))
