"""JSON checker: strict parsing and schema validation with formats."""

import pytest

from rlvr.rewards import REWARDS, check_json, strict_loads
from rlvr.rewards.jsoncheck import StrictJSONError

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string", "format": "email"}},
    "required": ["a", "b"],
}


@pytest.mark.parametrize(
    "text, reason",
    [
        ('{"a": NaN}', "nan_or_infinity"),
        ('{"a": 1, "a": 2}', "duplicate_key"),
        ('{"a": 1} x', "trailing_data"),
        ("{a: 1}", "invalid_json"),
    ],
)
def test_strict_loads_rejects(text, reason):
    with pytest.raises(StrictJSONError) as info:
        strict_loads(text)
    assert info.value.reason == reason


def test_incomplete_reward_option_and_gold():
    fn = REWARDS.get("json_schema")(schema=SCHEMA, incomplete_reward=0.25)
    got = fn(
        None, ['{"a": 1, "b": "x@y.org"}', '{"a": 1}', '{"a": "1", "b": "x@y.org"}', '{"a": 1, "b": "nope"}'], None
    )
    assert got == [1.0, 0.25, 0.0, 0.0]
    # 1 == True in Python; in JSON they differ, and a gold comparison must say so.
    assert check_json('{"v": true}', {"type": "object"}, gold='{"v": 1}').reason == "wrong_value"
    assert check_json('{"v": 1}', {"type": "object"}, gold={"v": 1}).correct


def test_schema_column_and_clear_errors():
    fn = REWARDS.get("json_schema")()
    assert fn(None, ['{"a": 1, "b": "x@y.org"}'], None, schema=[SCHEMA]) == [1.0]
    with pytest.raises(KeyError, match="schema"):
        fn(None, ["{}"], None)
    with pytest.raises(ValueError, match="schema itself is invalid"):
        REWARDS.get("json_schema")(schema={"type": 12})


def test_ecma_patterns_email_and_one_number_type():
    code = {"type": "object", "properties": {"c": {"type": "string", "pattern": "^\\d+$"}}}
    assert check_json('{"c": "123"}', code).correct
    assert check_json('{"c": "123\\n"}', code).reason == "schema_violation"  # Python's $ matches before a final \n
    assert check_json('{"c": "\u0663"}', code).reason == "schema_violation"  # Python's \d matches Arabic-Indic digits
    mail = {"type": "string", "format": "email"}
    assert [
        check_json(json_text, mail).correct for json_text in ('"@"', '"ada@"', '"a b@example.org"', '"ada@example.org"')
    ] == [False, False, False, True]
    assert check_json('{"n": 3.0}', {"type": "object"}, gold='{"n": 3}').correct
    assert check_json('{"n": 1e2}', {"type": "object"}, gold={"n": 100}).correct
    assert check_json('{"n": 9e999}', {"type": "object"}, gold='{"n": 1e400}').reason == "non_finite_number"


def test_every_completion_gets_a_verdict_and_a_stall_costs_only_itself():
    import time

    evil = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    mult = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.01}}}
    fn = REWARDS.get("json_schema")(timeout_s=1.0)
    completions = ['{"s": "' + "a" * 60 + '!"}', '{"n": ' + "9" * 5000 + "}", '{"n": 1e400}', '{"n": 0.5}', "[" * 5000]
    schemas = [evil, mult, mult, mult, {"$ref": "#"}]
    start = time.monotonic()
    got = fn(None, completions, None, schema=schemas)
    assert got == [
        0.0,
        1.0,
        0.0,
        1.0,
        0.0,
    ]  # never None, never an exception for the batch (99...9 is a multiple of 0.01)
    assert [v.reason for v in fn.verdicts(None, completions[:1], None, schema=schemas[:1])] == ["timeout"]
    assert time.monotonic() - start < 30  # one cut-off stall each, plus worker restarts on a shared machine


def test_schema_patterns_are_checked_as_ecma_at_load():
    fn = REWARDS.get("json_schema")(schema={"type": "string", "pattern": "^\\p{L}+$"})  # not valid in Python's re
    assert fn(None, ['"h\u00e9llo"', '"h1"'], None) == [1.0, 0.0]
    with pytest.raises(ValueError, match="schema itself is invalid"):
        REWARDS.get("json_schema")(schema={"type": "string", "pattern": "(("})


@pytest.mark.parametrize(
    "value, divisor, ok",
    [
        ("0.3", 0.1, True),
        ("0.35", 0.1, False),
        ("19.99", 0.01, True),
        ("1e308", 0.5, True),
        ("9" * 5000, 0.01, True),
        ("9" * 5000, 7, False),
        ("10", 3, False),
    ],
)
def test_multiple_of_is_exact(value, divisor, ok):
    schema = {"type": "object", "properties": {"n": {"multipleOf": divisor}}}
    assert check_json('{"n": %s}' % value, schema).correct is ok
