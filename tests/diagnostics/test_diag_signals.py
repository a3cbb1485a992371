from rlvr.diagnostics.signals import (
    answer_tail,
    canonical_number,
    decoy_golds,
    is_multi_answer,
    looks_like_code,
    tail_numbers,
    tamper_signals,
)


def test_tail_starts_at_last_anchor():
    text = "The answer is 5? No. 3 + 4 = 7.\nSo the answer is \\boxed{7}."
    assert answer_tail(text) == "\\boxed{7}."
    assert answer_tail("blah\n#### 1,234") == "#### 1,234"


def test_tail_without_anchor_is_last_line():
    assert answer_tail("first line 1 2 3\nsecond line 9\n\n") == "second line 9"
    assert answer_tail("") == ""


def test_tail_numbers_are_distinct_and_canonical():
    # "1,800", "1800.0" and "1800" are one answer; -3 and 2/3 are numbers too.
    assert tail_numbers("Final answer: 1,800 or 1800.0 or 1800 or -3 or 2/3") == ["1800", "-3", "2/3"]
    assert canonical_number("12.50") == "12.5"
    # A digit inside a word is not a number of its own.
    assert tail_numbers("The answer is x2 and 4") == ["4"]


def test_multi_answer_uses_checker_count_first():
    assert is_multi_answer("The answer is 7.", {"n_candidates": 2}, 4)
    assert not is_multi_answer("The answer is 7.", {"n_candidates": 1}, 4)
    # Text fallback: four distinct numbers in the tail is a spray, a worked last line of three is not.
    assert is_multi_answer("The answer is 6 or 7 or 8 or 9", None, 4)
    assert not is_multi_answer("The answer is 3 + 4 = 7", None, 4)


def test_decoy_golds():
    assert decoy_golds("18") == ["1800"]
    assert decoy_golds("1,234") == ["123400"]
    assert decoy_golds("0") == ["100"]  # 0 x 100 is still 0: use 100 instead
    assert decoy_golds("2.5") == ["250"]
    assert decoy_golds("\\frac{1}{2}") == []
    assert decoy_golds(None) == []
    # The other numbers a completion offers come first: short sprays are re-checked against them.
    assert decoy_golds("72", "72 82") == ["82", "7200"]
    assert decoy_golds("72", "7282") == ["7282", "7200"]
    assert decoy_golds("72", "72 or 82 or 83") == ["82", "83", "7200"]
    assert decoy_golds("18", "The answer is 18.0") == ["1800"]  # the gold in another form is no decoy
    assert decoy_golds("x", "The answer is 3 or x") == ["3"]  # a non-numeric gold: only what is offered


def test_tamper_signals_on_programs():
    honest = "```python\ndef add(a, b):\n    return a + b\n```"
    assert looks_like_code(honest) and tamper_signals(honest) == []
    assert tamper_signals("import sys\ndef f():\n    sys.exit(0)") == ["exit_call"]
    assert tamper_signals("def f():\n    raise SystemExit(0)") == ["exit_call"]
    assert tamper_signals("getattr(__import__('s' + 'ys'), 'exit')") == ["introspection"]
    assert tamper_signals("class A:\n    def __eq__(self, o):\n        return True") == ["eq_override"]
    assert tamper_signals("import unittest\n") == ["test_framework"]
    assert tamper_signals("f = sys._getframe(1).f_locals['expected']") == ["introspection"]
    assert not looks_like_code("The answer is 7.")
