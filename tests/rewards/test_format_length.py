"""Strict tag format reward and DAPO's soft overlong punishment."""

import pytest

from rlvr.rewards import REWARDS


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<think>a</think><answer>1</answer>", "ok"),
        ("  <think>a</think>\n<answer>1</answer>\n", "ok"),
        ("<think>a</think><answer>1</answer> extra", "text_after"),
        ("<think>a</think><answer>1</answer><answer>2</answer>", "duplicate_tag:answer"),
        ("<answer>1</answer><think>a</think>", "out_of_order:answer"),
        ("<think> </think><answer>1</answer>", "empty:think"),
        ("<think>a</think><answer></answer>", "empty:answer"),
        ("<think>a</think>so <answer>1</answer>", "text_before:answer"),
        ("<think>a<answer>1</answer>", "missing_tag:think"),
    ],
)
def test_tag_format(text, reason):
    fn = REWARDS.get("format")()
    v = fn.verdicts(None, [text])[0]
    assert v.reason == reason and v.reward == (1.0 if reason == "ok" else 0.0)


def test_format_prefilled_think_and_pattern():
    assert REWARDS.get("format")(think_prefilled=True)(None, ["a</think><answer>1</answer>"]) == [1.0]
    fn = REWARDS.get("format")(pattern=r"Answer: \d+")
    assert fn(None, ["Answer: 12", "Answer: 12 and more"]) == [1.0, 0.0]
    assert fn.kind == "format"


def test_overlong_matches_dapo_formula():
    # L_max = 20, L_cache = 5: no penalty up to 15 tokens; at 17, (15 - 17)/5 = -0.4; at 20, -1;
    # beyond L_max, -1; times the factor 0.5.
    fn = REWARDS.get("overlong")(max_completion_length=20, buffer=5, penalty=0.5)
    lengths = [10, 15, 16, 17, 20, 25]
    got = fn(None, ["x"] * len(lengths), [[0] * n for n in lengths])
    assert got == pytest.approx([0.0, 0.0, -0.1, -0.2, -0.5, -0.5])
    assert fn.kind == "length" and fn.__name__ == "overlong"


def test_overlong_rejects_bad_options():
    with pytest.raises(ValueError, match="buffer"):
        REWARDS.get("overlong")(max_completion_length=10, buffer=20)
    with pytest.raises(ValueError, match="completion_ids"):
        REWARDS.get("overlong")(max_completion_length=10)(None, ["x"], None)


def test_every_builtin_accepts_trls_keyword_call():
    # TRL calls reward_func(prompts=..., completions=..., completion_ids=..., **dataset_columns,
    # trainer_state=...); rlvr adds truncated=[...]. Every built-in must take exactly that.
    import rlvr.rewards  # noqa: F401  (registration)

    kwargs = {
        "prompts": ["p", "p"],
        "completions": ["<think>a</think><answer>4</answer>", [{"role": "assistant", "content": "\\boxed{5}"}]],
        "completion_ids": [[1, 2, 3], [1] * 9],
        "answer": ["4", "4"],
        "trainer_state": object(),
        "truncated": [False, False],
    }
    assert REWARDS.get("math")()(**kwargs) == [1.0, 0.0]
    assert REWARDS.get("format")()(**kwargs) == [1.0, 0.0]
    assert REWARDS.get("overlong")(max_completion_length=10, buffer=4)(**kwargs) == pytest.approx([0.0, -0.75])
    assert REWARDS.get("json_schema")(schema={"type": "object"})(**kwargs) == [0.0, 0.0]
    assert {"math", "code", "json_schema", "format", "overlong"} <= set(REWARDS.names())
