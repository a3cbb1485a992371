"""Math checker: extraction, equivalence, timeouts, thread and process-pool use."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from rlvr.rewards import REWARDS, check_math, equivalent
from rlvr.rewards.mathcheck import extract_candidates, symbolic_rejection
from rlvr.rewards.numparse import parse_number, parse_number_words
from rlvr.rewards.symbolic import SymbolicPool


@pytest.mark.parametrize(
    "text, value",
    [
        ("eighteen", 18),
        ("one hundred and five", 105),
        ("twenty-one", 21),
        ("two thousand three hundred and four", 2304),
        ("minus seven", -7),
        ("two or three", None),  # a hedge is not a number
        ("a dozen", None),
        ("five six", None),
        ("one thousand one million", None),
    ],
)
def test_number_words(text, value):
    assert parse_number_words(text) == value


@pytest.mark.parametrize(
    "text, num, den",
    [
        ("1,234", 1234, 1),
        ("-3/4", -3, 4),
        ("\\frac{3}{4}", 3, 4),
        ("1.5e3", 1500, 1),
        ("2.5 \\times 10^{3}", 2500, 1),
        ("0.10", 1, 10),
        ("1.5 million", 1500000, 1),
    ],
)
def test_parse_number_exact(text, num, den):
    value = parse_number(text)
    assert (value.numerator, value.denominator) == (num, den)


@pytest.mark.parametrize("text", ["1,23", "1e999", "9" * 61, "12,34,567", "3 4"])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


def test_extraction_paths_and_spraying():
    assert [c.path for c in extract_candidates("so \\boxed{4}")[0]] == ["boxed"]
    assert extract_candidates("<think>a</think> 4")[0][0].path == "after_think"
    assert extract_candidates("Reasoning... 12 apples and 4 pears")[1] == "no_answer"  # no last-number fallback
    v = check_math("\\boxed{3} or maybe \\boxed{4}", "3")
    assert (v.reward, v.reason, v.n_candidates) == (0.0, "multiple_answers", 2)
    # the same answer stated twice in two forms is one candidate, not spraying
    v = check_math("The answer is 18.\n\\boxed{18.0}", "18")
    assert (v.reward, v.n_candidates) == (1.0, 1)


def test_truncated_scores_zero_even_when_right():
    assert check_math("\\boxed{18}", "18", truncated=True).reason == "truncated"
    assert check_math("\\boxed{18}", "18", truncated=True).reward == 0.0


@pytest.mark.parametrize(
    "gold, pred, same",
    [
        ("50%", "0.5", True),
        ("50%", "50", True),
        ("0.5", "50%", False),  # ×100 decoy: a percent is /100 only when the gold is one
        ("50", "50%", True),  # ... otherwise it is a unit
        ("18", "18.0", True),
        ("18", "1800", False),
        ("18", "17", False),
        ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2", True),
        ("(x+1)^2", "x^2+2x+1", True),
        ("(x+1)^2", "x^2+x+1", False),
    ],
)
def test_equivalence(gold, pred, same):
    assert equivalent(gold, pred)[0] is same


def test_bounds_reject_before_symbolic_work():
    assert symbolic_rejection("10^{10^{10}}") == "power_tower"
    assert symbolic_rejection("2^{100000}") == "exponent_too_large"
    assert symbolic_rejection("1000000!") == "factorial_too_large"
    assert symbolic_rejection("x" * 400) == "too_long"
    assert symbolic_rejection("\\frac{1}{2}+x^{2}") is None


def test_never_executes_model_text(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    for text in (f"Answer: {payload}", f"\\boxed{{{payload}}}", f"Answer: $\\text{{{payload}}}$"):
        assert check_math(text, "0").reward == 0.0
    assert not marker.exists()


def test_timeout_is_zero_and_counted():
    pool = SymbolicPool(size=1)
    try:
        # A worker that never answers stands in for a hung sympy call: swap in a sleeping stub.
        import subprocess
        import sys

        from rlvr.rewards import symbolic

        pool._spawn_real = pool._spawn

        def stub():
            proc = subprocess.Popen(
                [sys.executable, "-c", "import sys,time;print('{\"ready\": true}',flush=True);time.sleep(60)"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            w = symbolic._Worker(proc)
            assert w.read_line(__import__("time").monotonic() + 30) is not None
            return w

        pool._spawn = stub
        assert pool.compare("x", "x", timeout_s=0.3) == "timeout"
        assert pool.timeouts == 1
        # the killed worker is gone and its successor starts in the background, in the same slot
        deadline = __import__("time").monotonic() + 30
        while not pool._idle and __import__("time").monotonic() < deadline:
            __import__("time").sleep(0.05)
        assert pool._live == 1 and len(pool._idle) == 1
    finally:
        pool.close()


def test_reward_function_contract_and_counts():
    fn = REWARDS.get("math")(gold_column="answer", timeout_s=5)
    completions = [
        "\\boxed{18}",
        [{"role": "assistant", "content": "Answer: 7"}],
        "\\boxed{3} \\boxed{4}",
        "\\boxed{18}",
    ]
    rewards = fn(
        ["p"] * 4, completions, [[1]] * 4, answer=["18", "7", "3", "18"], truncated=[False, False, False, True]
    )
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert fn.__name__ == "math" and fn.kind == "correctness" and fn.gold_column == "answer"
    assert fn.stats["multiple_answers"] == 1 and fn.stats["truncated"] == 1
    with pytest.raises(KeyError, match="gold_column"):
        fn(["p"], ["\\boxed{1}"], [[1]], solution=["1"])


_SYMBOLIC_CASES = [
    ("(x+1)^2", "x^2+2x+1", 1.0),
    ("\\frac{\\pi}{2}", "\\pi/2", 1.0),
    ("(x+1)^2", "x^2+1", 0.0),
    ("\\sqrt{8}", "2\\sqrt{2}", 1.0),
]


def _score(case):
    gold, pred, _ = case
    return check_math(f"Answer: ${pred}$", gold).reward


def test_threads_and_process_pool():
    cases = _SYMBOLIC_CASES * 3
    with cf.ThreadPoolExecutor(max_workers=4) as ex:
        assert list(ex.map(_score, cases)) == [c[2] for c in cases]
    assert threading.active_count() >= 1
    with cf.ProcessPoolExecutor(max_workers=2) as ex:
        assert list(ex.map(_score, _SYMBOLIC_CASES)) == [c[2] for c in _SYMBOLIC_CASES]


def test_real_symbolic_stall_times_out_off_the_main_thread():
    # sin(x)^100 vs cos(x)^100 passes every size bound, yet sympy's simplification stalls for
    # tens of seconds: the only defence is the killable worker. Run it from a worker thread,
    # where math-verify's own signal.alarm could not fire.
    fn = REWARDS.get("math")(timeout_s=1.0)
    with cf.ThreadPoolExecutor(max_workers=1) as ex:
        verdict = ex.submit(fn.verdicts, None, ["\\boxed{\\cos(x)^{100}}"], None, answer=["\\sin(x)^{100}"]).result()[0]
    assert (verdict.reason, verdict.reward) == ("timeout", 0.0)
    assert verdict.seconds < 10
    assert fn.stats["timeout"] == 1
    # the pool replaced the killed worker: the next comparison works
    assert fn(None, ["\\boxed{x^2+2x+1}"], None, answer=["(x+1)^2"]) == [1.0]


_REDOS = {
    # Each of these took minutes (quadratic regex backtracking or per-box rescans) before the
    # patterns were made linear; now each is milliseconds. 1 s leaves room for a loaded machine.
    "line_of_spaces": "Answer: x" + " " * 100_000 + "y",
    "non_word_lines": "*\n" * 50_000 + "answer",
    "unclosed_boxes": "\\boxed{" * 30_000,
    "many_anchors": "Answer: 1\n" * 20_000,
    "long_hash_line": "#### " + "1 " * 50_000,
    "deep_braces": "\\boxed{" + "{" * 50_000 + "}" * 50_000 + "}",
}


@pytest.mark.parametrize("name", list(_REDOS))
def test_extraction_time_is_bounded_on_adversarial_text(name):
    import time

    from rlvr.rewards.codecheck import extract_code
    from rlvr.rewards.jsoncheck import extract_json_text
    from rlvr.rewards.mathcheck import distinct_answers

    text = _REDOS[name]
    start = time.perf_counter()
    cands, _ = extract_candidates(text)
    distinct_answers(cands)
    extract_code("```" + text)
    extract_json_text("```" + text)
    assert time.perf_counter() - start < 1.0


def test_numeric_forms_property():
    # For random integers, every form of the gold is accepted and every form of a different
    # number — including the ±1, ×10, ×100 and /100 decoys — is rejected. Fast path only.
    import random

    rng = random.Random(1234)
    forms = [
        lambda n: str(n),
        lambda n: f"{n:,}",
        lambda n: f"{n}.0",
        lambda n: f"\\frac{{{2 * n}}}{{2}}",
        lambda n: f"{n} apples",
        lambda n: f"\\${n:,}",
    ]
    for _ in range(150):
        gold = rng.randint(-(10**7), 10**7)
        form = rng.choice(forms)
        assert check_math(f"The answer is {form(gold)}.", str(gold)).reward == 1.0, form(gold)
        for decoy in {gold + 1, gold - 1, gold * 10, gold * 100, -gold} - {gold}:
            assert check_math(f"\\boxed{{{form(decoy)}}}", str(gold)).reward == 0.0, (form(decoy), gold)


def test_worker_itself_never_executes_text(tmp_path):
    # Bypass the bounds: hand the payload straight to the symbolic worker. Its LaTeX-only reader
    # must not run it (math-verify's expression reader would: it calls sympy's parse_expr).
    from rlvr.rewards.symbolic import get_pool

    marker = tmp_path / "pwned"
    for payload in (f"__import__('os').system('touch {marker}')", f"exec(\"open('{marker}','w')\")"):
        assert get_pool().compare("0", payload, timeout_s=10) in ("not_equal", "unparsed", "error")
    assert not marker.exists()


@pytest.mark.parametrize(
    "text, num, den",
    [
        ("1 1/2", 3, 2),
        ("-2 3/4", -11, 4),
        ("1\\frac{1}{2}", 3, 2),
        ("0.\\overline{3}", 1, 3),
        ("0.1\\overline{6}", 1, 6),
        ("two thirds", 2, 3),
        ("one half", 1, 2),
        ("half a million", 500000, 1),
        ("18 thousandths", 9, 500),
    ],
)
def test_mixed_numbers_repeating_decimals_and_fraction_words(text, num, den):
    value = parse_number(text)
    assert (value.numerator, value.denominator) == (num, den)


@pytest.mark.parametrize("text", ["2 3/2", "one thirds", "two third", "1 1/0"])
def test_malformed_mixed_and_fraction_words_are_not_numbers(text):
    assert parse_number(text) is None


@pytest.mark.parametrize(
    "text, interval",
    [
        ("x < 1 or x > 3", "(-\\infty, 1) \\cup (3, \\infty)"),
        ("2 \\le x < 5", "[2, 5)"),
        ("5 > x \\geq 2", "[2, 5)"),
        ("x \\in [0, 1]", "[0, 1]"),
        ("3 < x", "(3, \\infty)"),
        ("x < 1 or y > 3", None),
        ("18", None),
    ],
)
def test_inequalities_as_intervals(text, interval):
    from rlvr.rewards.mathcheck import inequalities_as_intervals

    assert inequalities_as_intervals(text) == interval


@pytest.mark.parametrize(
    "completion, reason",
    [
        ("Final answer: 18. No wait, that's wrong.", "retracted"),
        ("\\boxed{18}" * 21, "too_many_boxes"),
        ("\\boxed{" + "1" * 1200 + "} \\boxed{18}", "answer_too_long"),
        ("\\boxed{18} then \\boxed{1", "unclosed_box"),
        ("Answer: 18 factorial", "words"),
        ("Answer: 2 or 5", "hedged"),
    ],
)
def test_second_answers_and_value_words_are_rejected_with_a_reason(completion, reason):
    gold = "(2, 5)" if "2 or 5" in completion else "18"
    v = check_math(completion, gold)
    assert (v.correct, v.reason) == (False, reason)


def test_units_are_an_allow_list():
    from rlvr.rewards.mathcheck import numeric_value

    for ok in ("18 cm^2", "18 km per hour", "18 m/s^2", "18 students", "18 square feet", "18cm"):
        assert numeric_value(ok)[0] == 18, ok
    for changed in ("18 factorial", "18 tens", "18 squared", "18 zorbs", "18 per"):
        assert numeric_value(changed)[0] != 18, changed


@pytest.mark.parametrize(
    "gold, pred, same",
    [
        ("\\pi", "3.141593", False),
        ("\\pi", "3.141592653589793238462643383279502884197169399", False),
        ("\\frac{\\sqrt{3}}{2}", "0.866025", False),
        ("\\frac{1}{2^{99}}", "\\frac{1}{2^{98}}", False),
        ("\\frac{1}{2^{99}}", "2^{-99}", True),
        ("\\sqrt{18}", "3\\sqrt{2}", True),
        ("0.866", "\\frac{\\sqrt{3}}{2}", True),
        ("0.866", "\\frac{\\sqrt{2}}{2}", False),  # a decimal gold sets the precision
        ("\\{1, 2\\}", "(1, 2)", False),
        ("(1, 2)", "\\{1, 2\\}", False),
        ("(2, 5)", "2, 5", False),
        ("(-\\infty, 1) \\cup (3, \\infty)", "x < 1 \\text{ or } x > 3", True),
        ("[2, 5)", "2 \\le x < 5", True),
    ],
)
def test_values_are_exact_and_sets_are_not_tuples(gold, pred, same):
    assert equivalent(gold, pred)[0] is same
