"""Naming reward functions in a config, and finding them before any model loads.

A reward is named by

- a built-in name (``math``, ``format``, ...: the ``REWARDS`` registry);
- ``module:function``: an importable module. The working directory is searched too, as ``python``
  does for a script, so ``myrewards:exact`` finds ``./myrewards.py`` with no ``PYTHONPATH``;
- ``path/to/file.py:function``: a file, absolute or relative to the working directory.

In the config ``rewards`` takes the long form ``[{name: math, weight: 1.0, options: {...}}]`` and the
short forms ``[math]``, ``[myrewards:exact]``, ``math`` (one reward) and ``[{name:math}]`` (YAML reads
``name:math`` without a space as one key; it is taken as ``name: math``).

``check_reward_function`` is the check made before the model loads: the function accepts TRL's
keyword arguments, and every argument it requires is a column the dataset has.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable

from rlvr.errors import UserError

# What the trainer always passes by keyword besides the dataset's columns.
ALWAYS_PASSED = ("prompts", "completions", "completion_ids", "truncated", "trainer_state")


class RewardReferenceError(UserError):
    """A reward function that cannot be found or called as TRL calls it."""


def _short_form(item: Any) -> Any:
    if isinstance(item, str):
        return {"name": item.strip()}
    if isinstance(item, dict):
        out: dict[str, Any] = {}
        for k, v in item.items():
            # YAML reads `{name:math}` (no space after the colon) as the key "name:math" with no value.
            if v is None and isinstance(k, str) and ":" in k and k.split(":", 1)[0].strip() in ("name", "weight"):
                k, v = (s.strip() for s in k.split(":", 1))
            out[k] = v
        return out
    return item


def normalise_reward_specs(value: Any) -> Any:
    """The short forms of `rewards` -> the long form (a list of {name, weight, options})."""
    if isinstance(value, (str, dict)):
        value = [value]
    if isinstance(value, list):
        return [_short_form(v) for v in value]
    return value


def is_reference(name: str) -> bool:
    """True for 'module:function' and 'path/file.py:function' (not a built-in name)."""
    return ":" in name


def _split(name: str) -> tuple[str, str]:
    where, sep, attr = name.rpartition(":")
    if not sep or not where or not attr:
        raise RewardReferenceError(
            f"reward {name!r}: write a function as 'module:function' or 'path/to/file.py:function'"
        )
    return where, attr


def _looks_like_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or os.sep in where


def _import_file(where: str, name: str) -> Any:
    path = Path(where).expanduser()
    if not path.is_file():
        raise RewardReferenceError(
            f"reward {name!r}: no file {str(path)!r} (relative paths start at the working directory, {os.getcwd()})"
        )
    mod_name = f"rlvr_rewards_file_{abs(hash(str(path.resolve())))}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise RewardReferenceError(f"reward {name!r}: {str(path)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    # The file's own folder is importable, as for a script: its helper modules are found, now and when
    # a function imports one at call time (appended, so it never shadows an installed package).
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module failed at import: say where
        del sys.modules[mod_name]
        raise RewardReferenceError(f"reward {name!r}: importing {str(path)!r} raised {type(e).__name__}: {e}") from e
    return module


def _import_module(where: str, name: str) -> Any:
    cwd = os.getcwd()
    # `python script.py` and `python -m` search the working directory; the `rlvr` console script does not.
    # It is appended (not put first) and kept: a local file never shadows an installed package, and
    # the module's own later imports of its neighbours still work.
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        if e.name is not None and (where == e.name or where.startswith(e.name + ".")):
            raise RewardReferenceError(
                f"reward {name!r}: no module {where!r} in the working directory ({cwd}) or on the Python path; "
                f"give the file instead, e.g. path/to/{where.split('.')[-1]}.py:{name.rpartition(':')[2]}"
            ) from None
        raise RewardReferenceError(f"reward {name!r}: importing {where!r} failed: {e}") from e
    except Exception as e:  # noqa: BLE001
        raise RewardReferenceError(f"reward {name!r}: importing {where!r} raised {type(e).__name__}: {e}") from e


def import_reward(name: str) -> Callable:
    """'module:function' or 'path/file.py:function' -> the callable (a function or a factory)."""
    where, attr = _split(name)
    module = _import_file(where, name) if _looks_like_file(where) else _import_module(where, name)
    fn = getattr(module, attr, None)
    if fn is None:
        import difflib

        public = [a for a in dir(module) if not a.startswith("_") and callable(getattr(module, a))]
        close = difflib.get_close_matches(attr, public, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else (f" It has: {', '.join(public[:12])}." if public else "")
        raise RewardReferenceError(f"reward {name!r}: {where!r} has no function {attr!r}.{hint}")
    if not callable(fn):
        raise RewardReferenceError(f"reward {name!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def check_reward_function(label: str, fn: Callable, columns: set[str] | None) -> None:
    """Raise when TRL's call ``fn(prompts=, completions=, completion_ids=, **columns)`` cannot work:
    a keyword the function does not take, or a required argument no column provides."""
    target = getattr(fn, "verdicts", fn)
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return  # a builtin or C callable: nothing to read
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [n for n in ("prompts", "completions", "completion_ids") if n not in names]
    if missing and not takes_kwargs:
        raise RewardReferenceError(
            f"reward function {label!r} does not accept {', '.join(missing)}: rlvr calls it as TRL does, "
            "f(prompts=..., completions=..., completion_ids=..., **columns); add **kwargs to its parameters"
        )
    if columns is None:
        return
    required = [
        p.name
        for p in params
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in ALWAYS_PASSED
        and p.name not in columns
    ]
    if required:
        raise RewardReferenceError(
            f"reward function {label!r} requires {', '.join(required)}, which the dataset has no column for "
            f"(columns: {', '.join(sorted(columns)) or 'none'}); rename a column (data.answer_column) or give "
            "the argument a default"
        )
