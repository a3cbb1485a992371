"""The JSON checker: strict parsing, JSON Schema validation with formats, in a killable worker.

Parsing is stricter than ``json.loads``: ``NaN``/``Infinity`` (which Python accepts and JSON does
not), numbers that overflow to infinity (``1e400``), duplicate keys (which Python silently
resolves to the last one, so ``{"ok": false, "ok": true}`` would read as ok), and anything after
the value are all rejected. The answer is the whole completion after any ``</think>``, the
contents of ``<answer>…</answer>``, or the last fenced ``json`` block — one value, nothing else.
Validation uses jsonschema's validator for the schema's own ``$schema`` (Draft 2020-12 by
default) with format checking on, ECMA-262 ``pattern``s and a real ``email`` check (see
``_json_worker.py``). JSON has one number type: ``3.0`` equals a gold ``3``, ``1e2`` equals ``100``.

Every completion gets a verdict: parsing and validation run in a worker process that is killed
at ``timeout_s`` (a catastrophic ``pattern``, a cyclic ``$ref``, a quadratic ``uniqueItems``),
which scores that completion ``timeout`` and no other; anything the validator cannot decide is
``unverifiable`` (reward 0), never an exception that blanks the batch.

Rewards: 1.0 valid (and equal to the gold value when ``gold_column`` is set); ``incomplete_reward``
(default 0.0) when the only schema errors are missing required properties; else 0.0.
"""

from __future__ import annotations

import functools
import json
import warnings
from typing import Any

import jsonschema
from jsonschema import FormatChecker
from jsonschema.validators import validator_for

from rlvr.rewards._json_worker import MAX_JSON_CHARS, StrictJSONError, _is_ecma_regex, same_json, strict_loads
from rlvr.rewards.base import REWARDS, CheckerReward, Verdict
from rlvr.rewards.symbolic import get_json_pool
from rlvr.rewards.textscan import fenced_blocks, tagged

__all__ = ["MAX_JSON_CHARS", "StrictJSONError", "check_json", "same_json", "strict_loads"]

DEFAULT_TIMEOUT_S = 2.0  # wall clock for one completion's parse + validation in the worker


def extract_json_text(text: str) -> tuple[str | None, str]:
    if "<think>" in text and "</think>" not in text:
        return None, "unclosed_think"
    text = text.rsplit("</think>", 1)[-1]
    tags = tagged(text, "<answer>", "</answer>")
    if len(tags) > 1:
        return None, "multiple_answers"
    if tags:
        return tags[0], "answer_tag"
    fences = [body for info, body in fenced_blocks(text) if info.strip().lower() in ("", "json", "jsonc", "json5")]
    if fences:
        return fences[-1], "fenced"
    return (text if text.strip() else None), "whole"


def _load_schema(schema: Any) -> dict:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"json_schema reward: the schema is not valid JSON ({exc.msg}); pass a dict or a JSON string"
            ) from None
    if not isinstance(schema, (dict, bool)):
        raise TypeError(f"json_schema reward: a schema is a JSON object (or true/false), got {type(schema).__name__}")
    cls = validator_for(schema)
    # check_schema would test every "pattern" with Python's re; they are ECMA-262 expressions
    # (``\p{L}`` is valid there and not in re), so the meta-schema's "regex" format is checked by regress.
    checker = FormatChecker()
    checker.checks("regex")(_is_ecma_regex)
    meta = validator_for(cls.META_SCHEMA)(cls.META_SCHEMA, format_checker=checker)
    error = jsonschema.exceptions.best_match(meta.iter_errors(schema))
    if error is not None:
        raise ValueError(f"json_schema reward: the schema itself is invalid: {error.message}")
    _warn_unchecked_formats(json.dumps(schema, sort_keys=True))
    return schema


def check_json(
    text: str,
    schema: Any,
    *,
    gold: Any = None,
    incomplete_reward: float = 0.0,
    truncated: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Verdict:
    raw, path = extract_json_text(text)
    verdict = Verdict(
        False, 0.0, extracted=None if raw is None else raw.strip()[:200], path=path, n_candidates=int(raw is not None)
    )
    if truncated:
        verdict.reason = "truncated"
        return verdict
    if raw is None:
        verdict.reason = path if path in ("unclosed_think", "multiple_answers") else "no_json"
        return verdict
    if len(raw) > MAX_JSON_CHARS:
        verdict.reason = "too_large"
        return verdict
    try:
        schema_json = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        gold_plain = gold if gold is None or isinstance(gold, str) else json.dumps(gold)
    except (TypeError, ValueError) as exc:
        verdict.reason, verdict.extra["detail"] = "bad_schema_or_gold", str(exc)[:160]
        return verdict
    if isinstance(schema, str) or isinstance(schema, (dict, bool)):
        _warn_unchecked_formats(schema_json)
    request = {"text": raw, "schema": schema_json, "gold": gold_plain, "has_gold": gold is not None}
    status, reply = get_json_pool().request(request, timeout_s)
    if reply is None:
        verdict.reason = "timeout" if status == "timeout" else "checker_error"
        return verdict
    verdict.reason = reply["reason"]
    if "errors" in reply:
        verdict.extra["errors"] = reply["errors"]
    if "detail" in reply:
        verdict.extra["detail"] = reply["detail"]
    if verdict.reason == "incomplete":
        verdict.reward = float(incomplete_reward)
    elif verdict.reason == "ok":
        verdict.correct, verdict.reward = True, 1.0
    return verdict


@functools.lru_cache(maxsize=256)
def _warn_unchecked_formats(schema_json: str) -> None:
    # Datasets often repeat one schema per row: warn once per distinct schema.
    try:
        schema = json.loads(schema_json)
    except ValueError:
        return
    unchecked = _formats_used(schema) - set(FormatChecker().checkers)
    if unchecked:
        warnings.warn(
            f"json_schema reward: the schema uses format(s) {sorted(unchecked)} that this jsonschema install cannot "
            'check, so they are ignored; pip install "jsonschema[format-nongpl]" to check them',
            stacklevel=3,
        )


def _formats_used(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        found = {schema["format"]} if isinstance(schema.get("format"), str) else set()
        return found.union(*(_formats_used(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_formats_used(v) for v in schema))
    return set()


class JSONSchemaReward(CheckerReward):
    kind = "correctness"

    def __init__(
        self,
        schema: Any = None,
        schema_column: str = "schema",
        gold_column: str | None = None,
        incomplete_reward: float = 0.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        name: str = "json_schema",
    ):
        super().__init__(name)
        if timeout_s <= 0:
            raise ValueError(f"json_schema reward: timeout_s must be > 0 seconds, got {timeout_s}")
        self.timeout_s = timeout_s
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
        return check_json(
            text,
            schema,
            gold=gold,
            incomplete_reward=self.incomplete_reward,
            truncated=bool(row.get("truncated", False)),
            timeout_s=self.timeout_s,
        )


REWARDS.add("json_schema", lambda **options: JSONSchemaReward(**options))
