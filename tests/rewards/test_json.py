"""JSON checker: strict parsing and schema validation with formats."""

import pytest

from rlvr.rewards import REWARDS, check_json, strict_loads
from rlvr.rewards.jsoncheck import StrictJSONError

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "format": "email"}}, "required": ["a", "b"]}


@pytest.mark.parametrize(
    "text, reason",
    [('{"a": NaN}', "nan_or_infinity"), ('{"a": 1, "a": 2}', "duplicate_key"), ('{"a": 1} x', "trailing_data"), ("{a: 1}", "invalid_json")],
)
def test_strict_loads_rejects(text, reason):
    with pytest.raises(StrictJSONError) as info:
        strict_loads(text)
    assert info.value.reason == reason


def test_incomplete_reward_option_and_gold():
    fn = REWARDS.get("json_schema")(schema=SCHEMA, incomplete_reward=0.25)
    got = fn(None, ['{"a": 1, "b": "x@y.org"}', '{"a": 1}', '{"a": "1", "b": "x@y.org"}', '{"a": 1, "b": "nope"}'], None)
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
