"""Every checker call on generated worst cases, up to the size cap, costs < 0.5 s of parent CPU.

Each case targets one regular expression or scan (named in its id) with the input that would make
a backtracking pattern quadratic: many openers without a closer, long runs of the characters a
pattern's loops consume, anchors repeated to the cap. CPU time of this process is measured
(``time.process_time``), so the symbolic and JSON workers, which run in their own processes and
are cut off at their deadlines, do not count; a slow regex in the parent does, whatever the load
of the machine. The bound is generous (a linear scan of 400 kB takes milliseconds) yet fails
for any quadratic pattern at this size (seconds to minutes).
"""

from __future__ import annotations

import time

import pytest

from rlvr.rewards.codecheck import check_code, extract_code
from rlvr.rewards.jsoncheck import check_json
from rlvr.rewards.mathcheck import MAX_COMPLETION_CHARS, check_math

CAP = MAX_COMPLETION_CHARS - 100  # just under the math checker's size cap
BOUND_S = 0.5


def _fill(unit: str, head: str = "", tail: str = "") -> str:
    return head + unit * ((CAP - len(head) - len(tail)) // len(unit)) + tail


MATH = {
    # _ANCHOR_RE / _HEADING_RE / _HASHES_RE: openers repeated, whitespace runs on anchor lines
    "anchor_openers_one_line": _fill("the answer "),
    "anchor_openers_lines": _fill("Answer: 18\n"),
    "final_answer_no_colon": _fill("final answer "),
    "answer_is_repeated": _fill("the answer is "),
    "spaces_after_anchor": _fill(" ", "Answer: ", "x"),
    "tabs_between_the_and_answer": _fill("\t", "the", "answer"),
    "spaces_after_final": _fill(" ", "final", "answer: 18"),
    "spaces_before_anchor_line": _fill(" ", "\n", "answer: 18"),
    "hash_line_spaces": _fill(" ", "#### ", "18"),
    "hash_lines": _fill("#### 18\n"),
    "heading_lines": _fill("#### Final Answer\n"),
    "heading_then_blank_lines": _fill("\n", "**Final Answer**\n", "18"),
    "empty_final_answer_lines": _fill("Final Answer:\n"),
    "display_block_unclosed": _fill(" x", "Final Answer:\n$$", ""),
    # _BOX_START_RE / _boxes / _tags: openers without closers
    "box_openers": _fill("\\boxed{"),
    "box_openers_spaced": _fill("\\boxed "),
    "fbox_spaces": _fill(" ", "\\fbox", "{18}"),
    "answer_tag_openers": _fill("<answer>"),
    "think_then_tags": _fill("<answer>", "<think>a</think>"),
    # _RETRACT_RE / _HEDGE_RE / _CLIP_RE over the rest of the text and the anchor line
    "retraction_prefixes": _fill("wai ", "\\boxed{18} "),
    "hedge_line": _fill("o", "Answer: 18 ", ""),
    "clip_spaces": _fill(" ", "Answer: 18", "because"),
    "clip_commas": _fill(", ", "Answer: 18", "ab"),
    # normalisation and numeric reading on the longest answer allowed
    "long_box_text_cmds": "\\boxed{" + "\\text{a}" * 120 + "}",
    "long_box_dollars": "\\boxed{" + "$" * 999 + "}",
    "long_box_superscripts": "\\boxed{" + "²" * 999 + "}",
    "long_box_row_breaks": "\\boxed{" + "\\\\" * 499 + "}",
    "long_box_inequalities": "\\boxed{x" + " <" * 450 + "}",
    "long_box_percent": "\\boxed{" + " " * 990 + "%}",
    "long_box_commas": "\\boxed{" + "1," * 499 + "}",
    "many_distinct_anchors": "".join(f"Answer: {i}\n" for i in range(64)) * (CAP // 800),
}


@pytest.mark.parametrize("name", list(MATH))
def test_math_checker_parent_cpu_is_bounded(name):
    text = MATH[name]
    assert len(text) <= MAX_COMPLETION_CHARS
    start = time.process_time()
    verdict = check_math(text, "18", timeout_s=1.0)
    spent = time.process_time() - start
    assert verdict.reward in (0.0, 1.0)
    assert spent < BOUND_S, f"{name}: {spent:.2f} s of parent CPU"


CODE = {
    "backtick_run": "`" * CAP,
    "backtick_run_then_newline": "`" * CAP + "\n",
    "fence_openers": _fill("```x\n"),
    "fence_info_line": _fill("x", "```", ""),
    "think_then_backticks": _fill("`", "<think>a</think>", ""),
}


@pytest.mark.parametrize("name", list(CODE))
def test_code_extraction_parent_cpu_is_bounded(name):
    start = time.process_time()
    extract_code(CODE[name])
    verdict = check_code(CODE[name], ["assert f() == 1"])
    spent = time.process_time() - start
    assert verdict.reward == 0.0
    assert spent < BOUND_S, f"{name}: {spent:.2f} s of parent CPU"


JSON = {
    "answer_tag_openers": _fill("<answer>"),
    "backtick_run": "`" * CAP,
    "fence_openers": _fill("```json\n"),
    "deep_nesting": "[" * (CAP // 2) + "]" * (CAP // 2),
    "catastrophic_pattern": '{"s": "' + "a" * 5000 + '!"}',
}
JSON_SCHEMA = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}


@pytest.mark.parametrize("name", list(JSON))
def test_json_checker_parent_cpu_is_bounded(name):
    start = time.process_time()
    verdict = check_json(JSON[name], JSON_SCHEMA, timeout_s=1.0)
    spent = time.process_time() - start
    assert verdict.reward == 0.0
    assert spent < BOUND_S, f"{name}: {spent:.2f} s of parent CPU"
