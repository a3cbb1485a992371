"""Fingerprints for header.json: enough to tell whether two runs saw the same data and the same checkers.

The lead's trainer writes header.json (versions, git revision, machine, resolved config) and adds
``{"dataset": fingerprint_rows(rows), "checkers": {name: fingerprint_checker(fn)}}``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any, Callable, Iterable, Mapping


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)


def fingerprint_rows(rows: Iterable[Mapping[str, Any]]) -> str:
    """``"sha256:<hex>/<n rows>"`` over the rows in order (key order inside a row does not matter).

    Order matters on purpose: the same rows shuffled differently are a different run. Costs one
    pass over the data (about a second per 100k short rows).
    """
    digest = hashlib.sha256()
    n = 0
    for row in rows:
        digest.update(_canonical(dict(row)).encode("utf-8"))
        digest.update(b"\n")
        n += 1
    return f"sha256:{digest.hexdigest()[:16]}/{n}"


def fingerprint_checker(fn: Callable[..., Any]) -> dict[str, Any]:
    """Name, module, options and a hash of the source of a reward function (source may be unavailable).

    Options are the JSON-able public attributes a factory set on the function (``gold_column``,
    ``kind``, tolerances, ...), which is where two checkers with the same code differ.
    """
    target = getattr(fn, "func", fn)  # functools.partial
    try:
        source = inspect.getsource(target if inspect.isfunction(target) or inspect.isclass(target) else type(target))
        source_hash = "sha256:" + hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
    except (OSError, TypeError):
        source_hash = None
    options = {}
    for key, value in sorted(getattr(fn, "__dict__", {}).items()):
        if key.startswith("_") or callable(value):
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        options[key] = value
    return {
        "name": getattr(fn, "__name__", type(fn).__name__),
        "module": getattr(target, "__module__", None),
        "source": source_hash,
        "options": options,
    }


def run_fingerprints(
    rows: Iterable[Mapping[str, Any]], reward_funcs: Mapping[str, Callable[..., Any]]
) -> dict[str, Any]:
    """``{"dataset": ..., "checkers": {name: ...}}``, ready to merge into header.json."""
    return {
        "dataset": fingerprint_rows(rows),
        "checkers": {name: fingerprint_checker(fn) for name, fn in reward_funcs.items()},
    }
