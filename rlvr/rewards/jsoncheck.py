"""The JSON checker: strict parsing, JSON Schema validation with formats (issue 5).

Parsing is stricter than ``json.loads``: ``NaN``/``Infinity`` (which Python accepts and JSON does
not), duplicate keys (which Python silently resolves to the last one, so ``{"ok": false, "ok":
true}`` would read as ok), and anything after the value are all rejected. The answer is the
whole completion after any ``</think>``, the contents of ``<answer>…</answer>``, or the last
fenced ``json`` block — one value, nothing else. Validation uses jsonschema's validator for the
schema's own ``$schema`` (Draft 2020-12 by default) with format checking on, so ``"format":
"email"`` or ``"date"`` is checked rather than ignored.

Rewards: 1.0 valid (and equal to the gold value when ``gold_column`` is set); ``incomplete_reward``
(default 0.0) when the only schema errors are missing required properties; else 0.0.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from typing import Any

import jsonschema
from jsonschema import FormatChecker
from jsonschema.validators import validator_for

from rlvr.rewards.base import REWARDS, CheckerReward, Verdict

MAX_JSON_CHARS = 1 << 20
_FENCE_RE = re.compile(r"```([^\n]*)\n(.*?)```", re.DOTALL)  # info string parsed in Python: no backtracking
_ANSWER_RE = re.compile(r"(?s)<answer>(.*?)</answer>")


class StrictJSONError(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _reject_constant(name: str) -> Any:
    raise StrictJSONError("nan_or_infinity", f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise StrictJSONError("duplicate_key", f"key {key!r} appears twice")
        obj[key] = value
    return obj


def strict_loads(text: str) -> Any:
    """Parse one JSON value; raise ``StrictJSONError`` with a machine-readable ``reason``."""
    if len(text) > MAX_JSON_CHARS:
        raise StrictJSONError("too_large", f"{len(text)} characters > {MAX_JSON_CHARS}")
    decoder = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    stripped = text.strip()
    try:
        value, end = decoder.raw_decode(stripped)
    except json.JSONDecodeError as exc:
        raise StrictJSONError("invalid_json", exc.msg) from None
    except RecursionError:
        raise StrictJSONError("too_deep", "nesting too deep") from None
    if stripped[end:].strip():
        raise StrictJSONError("trailing_data", f"{stripped[end:end + 40]!r} after the value")
    return value


def extract_json_text(text: str) -> tuple[str | None, str]:
    if "<think>" in text and "</think>" not in text:
        return None, "unclosed_think"
    text = text.rsplit("</think>", 1)[-1]
    tags = _ANSWER_RE.findall(text)
    if len(tags) > 1:
        return None, "multiple_answers"
    if tags:
        return tags[0], "answer_tag"
    fences = [body for info, body in _FENCE_RE.findall(text) if info.strip().lower() in ("", "json", "jsonc", "json5")]
    if fences:
        return fences[-1], "fenced"
    return (text if text.strip() else None), "whole"


def _load_schema(schema: Any) -> dict:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema reward: the schema is not valid JSON ({exc.msg}); pass a dict or a JSON string") from None
    if not isinstance(schema, (dict, bool)):
        raise TypeError(f"json_schema reward: a schema is a JSON object (or true/false), got {type(schema).__name__}")
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"json_schema reward: the schema itself is invalid: {exc.message}") from None
    return schema


def check_json(text: str, schema: Any, *, gold: Any = None, incomplete_reward: float = 0.0, truncated: bool = False) -> Verdict:
    raw, path = extract_json_text(text)
    verdict = Verdict(False, 0.0, extracted=None if raw is None else raw.strip()[:200], path=path, n_candidates=int(raw is not None))
    if truncated:
        verdict.reason = "truncated"
        return verdict
    if raw is None:
        verdict.reason = path if path in ("unclosed_think", "multiple_answers") else "no_json"
        return verdict
    try:
        value = strict_loads(raw)
    except StrictJSONError as exc:
        verdict.reason, verdict.extra["detail"] = exc.reason, str(exc)
        return verdict
    validator = _validator(schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True))
    errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path)))
    verdict.extra["errors"] = [f"{'/'.join(map(str, e.path)) or '<root>'}: {e.message}"[:160] for e in errors[:5]]
    if errors:
        if all(e.validator == "required" for e in errors):
            verdict.reason, verdict.reward = "incomplete", float(incomplete_reward)
        else:
            verdict.reason = "schema_violation" if not any(e.validator == "format" for e in errors) else "format_violation"
        return verdict
    if gold is not None:
        gold_value = strict_loads(gold) if isinstance(gold, str) else gold
        if value != gold_value or _type_tree(value) != _type_tree(gold_value):
            verdict.reason = "wrong_value"
            return verdict
    verdict.correct, verdict.reward, verdict.reason = True, 1.0, "ok"
    return verdict


def _type_tree(v: Any) -> Any:
    # 1 == 1.0 == True in Python; in JSON, true is not 1. Compare the shape of types as well.
    if isinstance(v, dict):
        return {k: _type_tree(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_type_tree(x) for x in v]
    return type(v).__name__


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str):
    # Datasets often repeat one schema per row: check and build each distinct schema once.
    schema = _load_schema(schema_json)
    checker = FormatChecker()
    unchecked = _formats_used(schema) - set(checker.checkers)
    if unchecked:
        warnings.warn(
            f"json_schema reward: the schema uses format(s) {sorted(unchecked)} that this jsonschema install cannot "
            'check, so they are ignored; pip install "jsonschema[format-nongpl]" to check them',
            stacklevel=3,
        )
    return validator_for(schema)(schema, format_checker=checker)


def _formats_used(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        found = {schema["format"]} if isinstance(schema.get("format"), str) else set()
        return found.union(*(_formats_used(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_formats_used(v) for v in schema))
    return set()


class JSONSchemaReward(CheckerReward):
    kind = "correctness"

    def __init__(self, schema: Any = None, schema_column: str = "schema", gold_column: str | None = None,
                 incomplete_reward: float = 0.0, name: str = "json_schema"):
        super().__init__(name)
        self.schema = None if schema is None else _load_schema(schema)
        self.schema_column = schema_column
        self.gold_column = gold_column
        self.incomplete_reward = incomplete_reward

    def verdicts(self, prompts, completions, completion_ids=None, **columns):
        if self.schema is None and self.schema_column not in columns:
            raise KeyError(
                f"reward {self.__name__!r} needs a JSON Schema: pass schema={{...}} to the reward or give the dataset a "
                f"{self.schema_column!r} column (columns: {', '.join(sorted(columns)) or 'none'})"
            )
        return super().verdicts(prompts, completions, completion_ids, **columns)

    def check(self, text: str, row: dict[str, Any]) -> Verdict:
        schema = self.schema if self.schema is not None else row.get(self.schema_column)
        gold = row.get(self.gold_column) if self.gold_column else None
        return check_json(text, schema, gold=gold, incomplete_reward=self.incomplete_reward, truncated=bool(row.get("truncated", False)))


REWARDS.add("json_schema", lambda **options: JSONSchemaReward(**options))
