"""JSON checking that runs in a killable worker process: strict parsing, ECMA-262 patterns, formats.

Started by ``rlvr.rewards.symbolic.WorkerPool`` as ``python -I <this file>``; it imports nothing
from rlvr (the parent's ``sys.path`` is not assumed), and ``rlvr.rewards.jsoncheck`` imports its
pure functions for in-process use. Protocol, one JSON object per line: the parent writes
``{"text": ..., "schema": ..., "gold": ... | null, "has_gold": bool}``; the worker answers
``{"reason": ..., "errors": [...], "detail": ...}`` (reason "ok" when valid and equal to the gold).

Why a process: a schema ``pattern`` with catastrophic backtracking (``^(a+)+$``), ``uniqueItems``
over a large array of objects (quadratic in jsonschema) or a cyclic ``$ref`` can each keep
validation busy for seconds to hours on one crafted completion. The parent kills the worker at
its deadline and scores that completion ``timeout``; the rest of the batch is unaffected.

Semantics the JSON Schema specification asks for and Python's defaults do not give:
  * ``pattern`` / ``patternProperties`` are ECMA-262 regular expressions (``$`` only at the true
    end, ``\\d`` ASCII only, ``\\w`` ASCII, JavaScript escapes), run by ``regress`` (the Rust
    ``regress`` engine that implements ECMA-262), with the ``u`` flag as the spec recommends;
  * JSON has one number type: ``3.0`` is the integer 3 and ``1e2`` equals ``100``; integers of any
    length are exact (past Python's 4300-digit ``int`` limit they are kept as ``Decimal``, which
    compares exactly and is never converted, a quadratic step);
  * numbers that overflow to infinity (``1e400``) and ``NaN``/``Infinity`` are not JSON numbers;
  * ``multipleOf`` is decided in exact decimal arithmetic on the numbers as written (0.3 is a
    multiple of 0.1; jsonschema's float division says it is not);
  * ``email`` / ``idn-email`` are checked by ``email-validator`` (syntax only, no DNS): jsonschema's
    own check only asks for an "@".
"""

from __future__ import annotations

import decimal
import functools
import json
import math
import sys
from decimal import Decimal
from typing import Any

MAX_JSON_CHARS = 1 << 20
_INT_DIGITS = 4000  # below Python's int/str conversion limit (4300)


class StrictJSONError(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _reject_constant(name: str) -> Any:
    raise StrictJSONError("nan_or_infinity", f"{name} is not JSON")


def _parse_float(s: str) -> float:
    value = float(s)
    if not math.isfinite(value):
        raise StrictJSONError("non_finite_number", f"{s[:40]} overflows a double; JSON numbers are finite")
    return value


def _parse_int(s: str) -> int | Decimal:
    return int(s) if len(s) <= _INT_DIGITS else Decimal(s)


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
    decoder = json.JSONDecoder(
        parse_constant=_reject_constant,
        object_pairs_hook=_no_duplicates,
        parse_float=_parse_float,
        parse_int=_parse_int,
    )
    stripped = text.strip()
    try:
        value, end = decoder.raw_decode(stripped)
    except json.JSONDecodeError as exc:
        raise StrictJSONError("invalid_json", exc.msg) from None
    except RecursionError:
        raise StrictJSONError("too_deep", "nesting too deep") from None
    except StrictJSONError:
        raise
    except ValueError as exc:  # int conversion limits and the like: a verdict, never a crash
        raise StrictJSONError("invalid_json", str(exc)[:120]) from None
    if stripped[end:].strip():
        raise StrictJSONError("trailing_data", f"{stripped[end : end + 40]!r} after the value")
    return value


def _type_tree(v: Any) -> Any:
    # 1 == 1.0 == True in Python; in JSON, true is not 1 but 1 and 1.0 are the same number.
    if isinstance(v, dict):
        return {k: _type_tree(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_type_tree(x) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return type(v).__name__
    return "number"


def _canonical(v: Any) -> Any:
    if isinstance(v, dict):
        return ("object", tuple(sorted((k, _canonical(x)) for k, x in v.items())))
    if isinstance(v, list):
        return ("array", tuple(_canonical(x) for x in v))
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return (type(v).__name__, v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        return ("number", int(v))
    return ("number", v)


def _exact(number: Any) -> Decimal:
    """The decimal a JSON number was written as (a float's shortest repr is its JSON spelling)."""
    return (
        number
        if isinstance(number, Decimal)
        else Decimal(repr(number))
        if isinstance(number, float)
        else Decimal(number)
    )


def same_json(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value whatever their spelling, booleans apart from numbers."""
    return _type_tree(a) == _type_tree(b) and a == b


@functools.lru_cache(maxsize=512)
def ecma_regex(pattern: str):
    import regress

    try:
        return regress.Regex(pattern, flags="u")
    except Exception:  # noqa: BLE001 - some valid non-unicode patterns (e.g. "\-") are rejected under "u"
        return regress.Regex(pattern)


def ecma_search(pattern: str, text: str) -> bool:
    return ecma_regex(pattern).find(text) is not None


def _is_email(instance: Any) -> bool:
    if not isinstance(instance, str):
        return True
    from email_validator import EmailNotValidError, validate_email

    try:
        validate_email(instance, check_deliverability=False)
    except EmailNotValidError:
        return False
    return True


def _is_ecma_regex(instance: Any) -> bool:
    if not isinstance(instance, str):
        return True
    try:
        ecma_regex(instance)
    except Exception:  # noqa: BLE001 - regress raises its own error type for a bad pattern
        return False
    return True


class _EcmaRe:
    """Stands in for the ``re`` module inside jsonschema's keyword code, which calls ``re.search``
    for ``additionalProperties``, ``unevaluatedProperties`` and the legacy drafts' pattern keywords:
    every schema pattern, wherever it is read, is an ECMA-262 regular expression."""

    @staticmethod
    def search(pattern: str, text: str):
        return ecma_regex(pattern).find(text)


def _use_ecma_everywhere() -> None:
    from jsonschema import _keywords, _legacy_keywords, _utils

    for module in (_keywords, _legacy_keywords, _utils):
        module.re = _EcmaRe  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=256)
def validator_for_schema(schema_json: str):
    """A jsonschema validator with ECMA-262 patterns, exact big integers and strict emails."""
    import jsonschema
    from jsonschema import FormatChecker
    from jsonschema.validators import extend, validator_for

    _use_ecma_everywhere()
    schema = json.loads(schema_json, parse_int=_parse_int)
    base = validator_for(schema)

    def pattern(validator, patrn, instance, schema):
        if validator.is_type(instance, "string") and not ecma_search(patrn, instance):
            yield jsonschema.ValidationError(f"{instance[:80]!r} does not match {patrn!r}")

    def pattern_properties(validator, properties, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in properties.items():
            for k, v in instance.items():
                if ecma_search(patrn, k):
                    yield from validator.descend(v, subschema, path=k, schema_path=patrn)

    def is_integer(checker, instance):
        if isinstance(instance, bool):
            return False
        if isinstance(instance, float):
            return instance.is_integer()
        if isinstance(instance, Decimal):
            return instance == instance.to_integral_value()
        return isinstance(instance, int)

    def unique_items(validator, unique, instance, schema):
        # jsonschema compares every pair (quadratic: minutes on 20k objects); a canonical key per
        # item is linear and says the same (1 and 1.0 are one number, true is not 1).
        if unique and validator.is_type(instance, "array"):
            seen = set()
            for item in instance:
                key = _canonical(item)
                if key in seen:
                    yield jsonschema.ValidationError(f"{json.dumps(item, default=str)[:80]} is not unique")
                    return
                seen.add(key)

    def multiple_of(validator, divisor, instance, schema):
        # Exact decimal arithmetic on the numbers as written: jsonschema divides floats, so 0.3 is
        # "not a multiple of 0.1" (0.3 / 0.1 = 2.9999999999999996) and huge integers overflow.
        if not validator.is_type(instance, "number"):
            return
        a, b = _exact(instance), _exact(divisor)
        with decimal.localcontext() as ctx:
            span = max(0, a.adjusted() - b.adjusted())  # digits of the quotient
            ctx.prec = max(len(a.as_tuple().digits), len(b.as_tuple().digits)) + span + 60
            ctx.Emax, ctx.Emin = decimal.MAX_EMAX, decimal.MIN_EMIN
            if b == 0 or a % b != 0:
                yield jsonschema.ValidationError(f"{str(instance)[:40]} is not a multiple of {divisor}")

    type_checker = base.TYPE_CHECKER.redefine("integer", is_integer)
    overrides = {"pattern": pattern, "patternProperties": pattern_properties, "multipleOf": multiple_of}
    if "uniqueItems" in base.VALIDATORS:
        overrides["uniqueItems"] = unique_items
    cls = extend(base, validators=overrides, type_checker=type_checker)
    checker = FormatChecker()
    checker.checks("email")(_is_email)
    checker.checks("idn-email")(_is_email)
    checker.checks("regex")(_is_ecma_regex)
    return cls(schema, format_checker=checker)


def check(text: str, schema: Any, gold: Any = None, has_gold: bool = False) -> dict[str, Any]:
    """The verdict on one extracted JSON text, as plain data (see the module doc)."""
    try:
        value = strict_loads(text)
    except StrictJSONError as exc:
        return {"reason": exc.reason, "detail": str(exc)}
    schema_json = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
    try:
        errors = sorted(validator_for_schema(schema_json).iter_errors(value), key=lambda e: list(map(str, e.path)))
    except RecursionError:
        return {"reason": "schema_too_deep", "detail": "validation recursed too deep (a cyclic $ref?)"}
    except Exception as exc:  # noqa: BLE001 - e.g. multipleOf on a number no float can hold: scored 0
        return {"reason": "unverifiable", "detail": f"{type(exc).__name__}: {exc}"[:200]}
    messages = [f"{'/'.join(map(str, e.path)) or '<root>'}: {e.message}"[:160] for e in errors[:5]]
    out: dict[str, Any] = {"errors": messages}
    if errors:
        if all(e.validator == "required" for e in errors):
            out["reason"] = "incomplete"
        else:
            formats = any(e.validator == "format" for e in errors)
            out["reason"] = "format_violation" if formats else "schema_violation"
        return out
    if has_gold:
        try:
            gold_value = strict_loads(gold) if isinstance(gold, str) else gold
        except StrictJSONError as exc:
            return {"reason": "bad_gold", "detail": str(exc)}
        if not same_json(value, gold_value):
            out["reason"] = "wrong_value"
            return out
    out["reason"] = "ok"
    return out


def main() -> None:
    import resource

    limit = 2 * 1024**3  # a runaway validation dies on memory, not the machine
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import warnings

    warnings.filterwarnings("ignore")
    check('{"a": "x@example.org"}', {"type": "object", "properties": {"a": {"format": "email", "pattern": "^x"}}})
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = check(request["text"], request["schema"], request.get("gold"), bool(request.get("has_gold")))
        except Exception as exc:  # noqa: BLE001 - reported, never a dead worker
            reply = {"reason": "checker_error", "detail": f"{type(exc).__name__}: {exc}"[:200]}
        out.write(json.dumps(reply, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
