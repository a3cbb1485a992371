"""The math checker: strict final-answer extraction, generous equivalence (docs/checkers.md).

Extraction is strict because training optimises whatever the extractor lets through:
  * a final answer is read only from an anchor: ``\\boxed{}``/``\\fbox{}``, ``<answer>…</answer>``,
    ``Answer:`` / ``The (final | correct) answer is``, ``#### x``, a "Final Answer" heading with the
    answer under it, or — when the completion (or the text after a ``</think>`` block) is nothing
    but a short answer — that text itself;
  * every anchor is read (several on one line too) and the distinct answers counted: more than one
    is ``multiple_answers`` (answer spraying scores 0); more boxes or anchors than the caps is
    rejected, never read in part; there is no "last number anywhere" fallback;
  * an answer taken back after it was stated (``Answer: 18. No wait, that's wrong.``) is
    ``retracted``; a hedged answer (``3 or 4``, ``maybe 5``, ``at least 7``) is ``hedged``;
  * a truncated completion (the trainer's ``truncated`` column) scores 0, whatever it contains.

Equivalence is generous about *form* and exact about *value*: numbers compare as exact fractions
after reading integers, decimals, fractions, mixed numbers, repeating decimals, ``\\frac``,
thousands separators, scientific forms, number and fraction words, currency and allow-listed
units; a percent sign means /100 only when the gold is a percentage (so ``50%`` is never accepted
for a gold of ``0.5``: that is the ×100 decoy). Anything else goes to math-verify (LaTeX parsing
and symbolic comparison) in a killable worker process after the input passed size, digit and
exponent bounds, with decimals read as the exact numbers they spell (``3.141593`` is not π).
Model text is never evaluated as code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rlvr.rewards.base import REWARDS, CheckerReward, Verdict
from rlvr.rewards.numparse import (
    MAX_DIGITS,
    parse_number,
    parse_number_words,
)
from rlvr.rewards.symbolic import get_pool

# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------

# Every pattern here is linear in the completion: no lazy group followed by an optional run
# (``(.+?)\s*$`` is quadratic on a line of spaces), no ``\s``/``\W`` runs that cross lines, no
# ``<open>(.*?)<close>`` scans (quadratic with many openers and no closer: tags are found with
# ``str.find``). Each is exercised on generated worst cases in the tests.
_ANCHOR_RE = re.compile(
    r"(?im)(?:\b(?:final|correct|right)[ \t]+answer|\bthe[ \t]+answer|^[^\w\n]{0,8}(?:\\text(?:bf|it)?\{)?answer)"
    r"[^\w\n]{0,4}?[ \t]{0,8}"
    r"(?:is\b|:|=|—|–)[ \t:*]{0,8}([^\n]*)"
)
# A heading with the answer under it: "#### Final Answer", "**Final Answer**", "### Answer".
_HEADING_RE = re.compile(r"(?im)^[ \t#*]{0,8}(?:the[ \t]+)?(?:final[ \t]+)?answer[ \t*:]{0,8}$")
_HASHES_RE = re.compile(r"(?m)^[ \t]{0,8}####[ \t]*([^\n]*)")
_BOX_START_RE = re.compile(r"\\(?:boxed|fbox)[ \t]{0,8}")
_TOKEN_RE = re.compile(r"[^\s$]+")
_BRACE_RE = re.compile(r"[{}]")
# Words after a stated final answer that take it back: "Answer: 18. No wait, that's wrong."
_RETRACT_RE = re.compile(
    r"(?i)\b(?:wait|wrong|incorrect|oops|scratch that|on second thought|made an error|my mistake|not right|"
    r"actually,? no|no,? actually|correction|"
    r"let me (?:redo|recompute|recalculate|reconsider|re-?check|try again|start over))\b"
)
_SHORT_ANSWER_MAX = 60  # chars: a bare completion longer than this is prose, not an answer
MAX_ANSWER_CHARS = 1000  # a final answer longer than this is not one (and is never normalised)
MAX_ANCHORS = 64  # more "Answer:" lines than this is spraying too (and bounds the work per completion)
MAX_BOXES = 20  # more boxes than this is spraying whatever they hold: rejected, not read in part
MAX_COMPLETION_CHARS = 400_000  # ~100k tokens; longer text is rejected before any parsing


@dataclass(frozen=True)
class Candidate:
    path: str  # "boxed", "answer_tag", "answer_anchor", "heading", "####", "after_think", "whole"
    text: str
    line: str = ""  # the whole anchor line the answer was clipped from: hedges there count too
    start: int = 0  # offset in the (post-</think>) text: what follows it may retract it


class _Unreadable(Exception):
    """A box that never closes (cut off) or runs past MAX_ANSWER_CHARS: no answer can be read."""

    def __init__(self, reason: str):
        self.reason = reason


def _boxes(text: str, strict: bool = False) -> list[tuple[int, str]]:
    """(offset, contents) of every ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces. With
    ``strict``, a box that does not close within ``MAX_ANSWER_CHARS`` raises ``_Unreadable`` (an
    over-long box is rejected, never silently dropped while another box is read). Each box is
    scanned over at most ``MAX_ANSWER_CHARS`` characters and at most ``MAX_BOXES + 1`` are read,
    so the cost is bounded; callers count the boxes first."""
    found = []
    for n, m in enumerate(_BOX_START_RE.finditer(text)):
        if n > MAX_BOXES:
            break
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth = 0
            for brace in _BRACE_RE.finditer(text, i, i + MAX_ANSWER_CHARS + 2):
                depth += 1 if brace.group(0) == "{" else -1
                if depth == 0:
                    found.append((m.start(), text[i + 1 : brace.start()]))
                    break
            else:
                if strict:
                    raise _Unreadable("answer_too_long" if len(text) - i > MAX_ANSWER_CHARS else "unclosed_box")
        elif m.group(0).endswith(" "):  # "\boxed 5": the next token
            tok = _TOKEN_RE.match(text, i, i + MAX_ANSWER_CHARS)
            if tok:
                found.append((m.start(), tok.group(0)))
    return found


def _boxed_contents(text: str) -> list[str]:
    return [b for _, b in _boxes(text)]


def _tags(text: str, open_tag: str = "<answer>", close_tag: str = "</answer>") -> tuple[list[tuple[int, str]], str]:
    """(offset, body) of each ``<answer>…</answer>``, and the text with them blanked out. Linear:
    once an opener has no closer after it, no later opener can have one."""
    found, outside, pos = [], [], 0
    while True:
        i = text.find(open_tag, pos)
        if i < 0:
            break
        j = text.find(close_tag, i + len(open_tag))
        if j < 0:
            break
        found.append((i, text[i + len(open_tag) : j]))
        outside.append(text[pos:i] + " ")
        pos = j + len(close_tag)
    outside.append(text[pos:])
    return found, "".join(outside)


_NESTED_ANCHOR_RE = re.compile(
    r"^(?:the[ \t]+)?(?:final[ \t]+|correct[ \t]+)?answer[ \t]{0,8}(?:is\b|:)[ \t:*]{0,8}", re.IGNORECASE
)
_CLIP_RE = re.compile(r"\s(?:because|since|as|which|so)\b|,\s(?=[a-zA-Z]{2,})|\.\s|;\s")
_WORKING_RE = re.compile(r"^[\d\s.,+\-*/×÷()^{}\\a-z]*$")  # "9 + 9", "3 \times 6": arithmetic, no prose


def _clip_anchor(s: str) -> str:
    # "The answer is 18 because ..." / "Answer: 18. Done." -> "18"; Minerva's "Final Answer: The
    # final answer is $18$. I hope it is correct." -> "$18$"; "the answer is 9 + 9 = 18" -> "18".
    s = _NESTED_ANCHOR_RE.sub("", s.strip(), count=1)
    if s.startswith("}"):  # "\textbf{Answer:} 18": the rest of the anchor's markup
        s = s.lstrip("}*: \t")
    m = _CLIP_RE.search(s)  # one forward search: linear (a leading \s+ would rescan whitespace runs)
    if m:
        s = s[: m.start()]
    s = s.strip().strip("*").strip()
    if "=" in s and "<" not in s and ">" not in s and "\\le" not in s and "\\ge" not in s:
        head, _, tail = s.rpartition("=")
        if tail.strip() and _WORKING_RE.match(head.replace(" ", "")) and re.search(r"\d", head):
            s = tail.strip().strip("*$").strip()
    return s


_INLINE_ANCHOR_RE = re.compile(r"(?i)\b(?:final[ \t]+|correct[ \t]+)?answer[^\w\n]{0,4}?[ \t]{0,8}(?:is\b|:|=)")
_LEADING_NUMBER_RE = re.compile(r"[ \t]{0,8}\$?([-+]?\d[\d,]*(?:\.\d+)?)")


def _line_answers(line: str) -> list[str]:
    """Every answer one anchor line states: "Final answer: 18. Final answer: 19." states two, and
    so do "Answer: 18; 19" and "Answer: 18. 19." (a number right after the clip point is another
    answer, not an explanation). ``line`` is the text after the first anchor, at most
    MAX_ANSWER_CHARS + 1 characters."""
    starts = [0] + [m.end() for m in _INLINE_ANCHOR_RE.finditer(line)]
    answers = []
    for k, start in enumerate(starts[:8]):
        segment = line[start : starts[k + 1] if k + 1 < len(starts) else len(line)]
        clipped = _clip_anchor(segment)
        answers.append(clipped)
        cut = _CLIP_RE.search(_NESTED_ANCHOR_RE.sub("", segment.strip(), count=1))
        if cut:
            rest = _NESTED_ANCHOR_RE.sub("", segment.strip(), count=1)[cut.end() :]
            lead = _LEADING_NUMBER_RE.match(rest)
            if lead:
                answers.append(lead.group(1))
    return answers


def _answer_like(s: str) -> bool:
    # "To get the answer: first add the two rates" is prose, not a final answer; a capture counts
    # when it holds a digit, math markup, or is at most four words ("eighteen", "no solution").
    return bool(s) and (bool(re.search(r"[\d$\\]", s)) or len(s.split()) <= 4 or parse_number_words(s) is not None)


def _below(text: str, pos: int) -> tuple[str, int] | None:
    """The answer written under a heading or an empty ``Final Answer:`` line: the next non-empty
    line, or a whole display block (``$$ … $$``, ``\\[ … \\]``) that starts there."""
    lines = text[pos : pos + 4 * MAX_ANSWER_CHARS].split("\n")
    offset = pos
    for k, line in enumerate(lines[1:8], 1):
        offset += len(lines[k - 1]) + 1
        stripped = line.strip()
        if not stripped:
            continue
        for left, right in (("$$", "$$"), ("\\[", "\\]")):
            if stripped.startswith(left) and (stripped == left or right not in stripped[len(left) :]):
                rest = "\n".join(lines[k:])
                close = rest.find(right, rest.find(left) + len(left))
                if close < 0:
                    return None
                return rest[: close + len(right)].replace("\n", " ").strip(), offset
        return stripped, offset
    return None


_AFTER_VALUE = {"left", "remaining", "altogether", "in", "now", "today", "total", "overall", "all", "each"}
_SENTENCE_NUMBER_RE = re.compile(r"(?<![\w.])[-+]?\$?\d[\d,]*(?:\.\d+)?(?:[ \t]*/[ \t]*\d+)?%?")
_INLINE_MATH_RE = re.compile(r"\$([^$\n]{1,300})\$|\\\((.{1,300}?)\\\)")


def _sentence_answer(text: str) -> str:
    """Under a "Final Answer" heading, a sentence that states one value states that value:
    "The total number of apples is 18." -> "18", "The area is $3\\sqrt{2}$." -> "3\\sqrt{2}". A
    sentence with two values, or none, is left as it is (and is not read as a number)."""
    if len(re.findall(r"[a-zA-Z]{2,}", text)) < 2 or _BOX_START_RE.search(text) or len(text) > MAX_ANSWER_CHARS:
        return text  # not prose: "$18$ + 1" is a formula, read whole
    spans = list(_INLINE_MATH_RE.finditer(text))
    if spans:
        if len(spans) != 1:
            return text
        value, rest = spans[0].group(1) or spans[0].group(2), text[: spans[0].start()] + text[spans[0].end() :]
    else:
        numbers = list(_SENTENCE_NUMBER_RE.finditer(text))
        if len(numbers) != 1:
            return text
        value, rest = numbers[0].group(0), text[: numbers[0].start()] + text[numbers[0].end() :]
    # the rest must be words: another digit or an operator makes it a formula or a second value
    if re.search(r"[\d+*/^=<>\\]|\s-\s", rest):
        return text
    # it states the value ("the total is 18", "Janet has 18 fish left"); it does not qualify it:
    # "18 if n is even" and "18 times ten" start with it, "is 18 thousandths" changes it
    match = spans[0] if spans else numbers[0]
    before, after = text[: match.start()], text[match.end() :]
    following = re.findall(r"[a-zA-Z][a-zA-Z./]*", after)[:1]
    if not re.search(r"[a-zA-Z]{2,}", before) or (
        following and not _is_unit(following[0]) and following[0].lower().rstrip(".") not in _AFTER_VALUE
    ):
        return text
    return value


def extract_candidates(text: str) -> tuple[list[Candidate], str]:
    """All final-answer candidates of a completion, and a reason when there cannot be any."""
    if "<think>" in text and "</think>" not in text:
        return [], "unclosed_think"
    after_think = "</think>" in text
    if after_think:
        text = text.rsplit("</think>", 1)[1]
    if sum(1 for _ in _BOX_START_RE.finditer(text)) > MAX_BOXES:
        return [], "too_many_boxes"
    cands: list[Candidate] = []
    tags, outside = _tags(text)
    if len(tags) > MAX_BOXES:
        return [], "too_many_answers"
    cands += [Candidate("answer_tag", t, start=i) for i, t in tags]
    try:
        cands += [Candidate("boxed", b, start=i) for i, b in _boxes(outside, strict=True)]
    except _Unreadable as exc:
        return [], exc.reason
    # An anchor line that holds a \boxed{} is the same statement as the box, already counted.
    for n, m in enumerate(_ANCHOR_RE.finditer(outside)):
        if n > MAX_ANCHORS:
            return [], "too_many_answers"
        a = m.group(1)[: MAX_ANSWER_CHARS + 1]
        if _BOX_START_RE.search(a):
            continue
        answers = _line_answers(a)
        clipped = answers[0]
        if numeric_value(normalize_answer(clipped))[0] is None:  # "Final answer: the total is 18 apples."
            clipped = _sentence_answer(clipped)
        if not clipped.strip("*$ \t") or clipped.strip() in ("\\[", "$$"):
            below = _below(outside, m.start())
            if below is not None and not _BOX_START_RE.search(below[0]) and not _ANCHOR_RE.match(below[0]):
                cands.append(Candidate("heading", _sentence_answer(below[0]), below[0], below[1]))
        elif _answer_like(clipped):
            cands.append(Candidate("answer_anchor", clipped, a, m.start()))
        cands += [Candidate("answer_anchor", other, a, m.start()) for other in answers[1:] if _answer_like(other)]
    for n, m in enumerate(_HEADING_RE.finditer(outside)):
        if n > MAX_ANCHORS:
            return [], "too_many_answers"
        below = _below(outside, m.start())
        if below is not None and not _BOX_START_RE.search(below[0]) and not _ANCHOR_RE.match(below[0]):
            cands.append(Candidate("heading", _sentence_answer(below[0]), below[0], below[1]))
    for n, m in enumerate(_HASHES_RE.finditer(outside)):
        if n > MAX_ANCHORS:
            return [], "too_many_answers"
        h = m.group(1)[: MAX_ANSWER_CHARS + 1]
        if re.fullmatch(r"[ \t*:]*(?:final[ \t]+)?answer[ \t*:]*", h, re.IGNORECASE):
            continue  # "#### Final Answer" is a markdown heading (read by _HEADING_RE), not GSM8K's marker
        cands += [Candidate("####", answer, h, m.start()) for answer in _line_answers(h)]
    if not cands:
        bare = text.strip()
        # "x = 2" is an answer; "5 + 13 = 18" is working: only "<letter> =" may hold an "=".
        short = (
            bare
            and len(bare) <= _SHORT_ANSWER_MAX
            and "\n" not in bare
            and "=" not in re.sub(r"\b[a-zA-Z]\s*=", "", bare)
        )
        # The bare text counts only when it *is* an answer: a number (with units or in words) or
        # a formula; "Reasoning... 12 apples and 4 pears" is prose and has no final answer.
        words = set(re.findall(r"(?<!\\)\b[a-zA-Z]{2,}", bare.lower())) - {"or", "and"}
        if short and (not words or numeric_value(normalize_answer(bare))[0] is not None):
            cands.append(Candidate("after_think" if after_think else "whole", bare))
        return cands, ("ok" if cands else "no_answer")
    first = min(c.start for c in cands)
    if _RETRACT_RE.search(outside, first):
        return cands, "retracted"
    return cands, "ok"


# ---------------------------------------------------------------------------------------------
# Normalisation and numeric reading
# ---------------------------------------------------------------------------------------------

_HEDGE_RE = re.compile(
    r"\b(?:or|either|nor|maybe|perhaps|possibly|probably|likely|approximately|approx|about|around|"
    r"roughly|nearly|almost|between|guess|could|might|unsure|uncertain|alternatively|at least|at most|"
    r"(?:more|less|fewer|greater|smaller|larger) than|up to|upwards of|or so|or more|or less|\d+-?ish)\b|"
    r"\\lor\b|\\approx\b|≈|≃|"
    r"\\sim\b|\?|(?<![\w}])~(?=\s*[\d.])"
)
_TEXT_CMD_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname|underline|bm|boldsymbol|emph)"
    r"\s*\{([^{}]*)\}"
)
_COLOR_RE = re.compile(r"\\(?:textcolor|colorbox)\s*\{[^{}]*\}\s*\{([^{}]*)\}|\\color\s*\{[^{}]*\}")
_FONT_RE = re.compile(r"\\(?:bf|it|rm|boldmath|large|Large|small)\b\s*")
_SPACING_RE = re.compile(r"\\(?:left|right|displaystyle|textstyle|!|,|;|:|quad|qquad)|\\ |~")
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
_SUPERSCRIPT_RUN_RE = re.compile(r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁻]{1,8}")
_MATRIX_RE = re.compile(r"\\(begin|end)\{(?:bmatrix|Bmatrix|matrix|smallmatrix)\}")

# Units are an allow-list: a word after a number is dropped only when it names what is counted or
# measured. Anything else may change the value ("18 factorial", "18 thousandths", "18 tens",
# "18 squared", "18 percent") or the claim ("18 is wrong") and keeps the answer from being read as
# the bare number. Plurals are read by dropping a final "s"/"es".
_UNITS = frozenset(
    """
m cm mm km um nm in inch inches ft foot feet yd yard mi mile meter metre kilometer kilometre centimeter centimetre
millimeter millimetre g mg kg gram kilogram milligram ton tonne lb lbs pound oz ounce l ml liter litre milliliter
millilitre gal gallon quart pint cup tablespoon teaspoon tbsp tsp s sec second ms min minute h hr hrs hour day week
month year yr decade century mph kmh kph km/h m/s cm/s rpm hz khz mhz ghz w kw watt kwh j kj joule cal kcal calorie
v volt amp n newton pa kpa psi atm bar mol c f degree deg celsius fahrenheit kelvin rad radian old dollar cent euro
pound yen rupee usd eur gbp byte kb mb gb tb bit unit square sq cubic point pt mark vote item piece person people
adult child children kid student teacher boy girl man men woman women worker employee friend player team member
apple orange banana pear egg cookie cake pie candy candies book page pen pencil marble ball toy car bus bike bicycle
box bag bottle can card ticket flower tree plant seed dog cat bird fish cow chicken sheep pig horse animal leg wheel
shirt sock shoe hat coin bill step lap trip mile game match row seat chair table room house floor slice piece
sticker stamp cupcake muffin sandwich pizza burger glass jar basket crate pack packet bead block brick stone rock
shell gift present lesson class question problem word letter song movie episode chapter photo picture video call
email message visit
""".split()
)
_UNIT_TOKEN_RE = re.compile(r"^([a-zA-Z/]+)(?:\^?\{?[23]\}?)?\.?$")  # "cm", "cm^2", "cm^{2}", "m/s^2", "hrs."


def _is_unit(word: str) -> bool:
    word = word[1:] if word.startswith("/") and len(word) > 1 else word  # "$18/hour": a rate
    if word in ("M", "B", "K", "T", "k", "bn", "mn"):  # 18M, 18K: million, thousand -- magnitudes, not units
        return False
    m = _UNIT_TOKEN_RE.match(word)
    if not m:
        return False
    w = m.group(1).lower()
    parts = w.split("/")
    if len(parts) > 2 or not all(parts):
        return False
    return all(
        p in _UNITS
        or (p.endswith("s") and p[:-1] in _UNITS)
        or (p.endswith("es") and p[:-2] in _UNITS)
        or (p.endswith("ies") and p[:-3] + "y" in _UNITS)
        for p in parts
    )


def _units_tail(tokens: list[str]) -> bool:
    """``["km", "per", "hour"]``, ``["m/s^2"]``, ``["square", "feet"]``: units and rates only."""
    if not tokens or tokens[-1].lower() == "per":
        return False
    return all(t.lower() == "per" or _is_unit(t) for t in tokens)


def normalize_answer(s: str) -> str:
    """Presentation-only rewriting: the same answer in any typesetting maps to the same string."""
    s = s.strip()
    for _ in range(4):  # unwrap nested presentation layers: $\boxed{\text{18}}$.
        before = s
        s = s.strip().strip("*").strip().rstrip(".").strip()
        if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
            s = s.strip("$")
        for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(left) and s.endswith(right):
                s = s[len(left) : -len(right)]
        boxed = _boxed_contents(s)
        if len(boxed) == 1 and re.fullmatch(r"\\(?:boxed|fbox)\s*\{.*\}", s, re.DOTALL):
            s = boxed[0]
        if s == before:
            break
    # A "$" left inside is a math delimiter of a partly typeset answer ("$18$ + 1"): drop the
    # delimiters and read the whole text, never only the typeset part. "\$" is a dollar sign.
    s = s.replace("\\$", "\x00")
    s = s.replace("$", " ").replace("\x00", "\\$")
    s = _SUPERSCRIPT_RUN_RE.sub(lambda m: "^{" + m.group(0).translate(_SUPERSCRIPTS) + "}", s)
    s = re.sub(r"\\\\(?:\s*\[[^\]]{0,12}\])?", "\x01", s)  # a row break (with "[2pt]" spacing) is not "\ "
    s = _SPACING_RE.sub(" ", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    for _ in range(3):  # \textcolor{red}{\textbf{18}}
        s = _COLOR_RE.sub(lambda m: " " + (m.group(1) or "") + " ", s)
        s = _TEXT_CMD_RE.sub(lambda m: " " + m.group(1) + " ", s)
    s = _FONT_RE.sub("", s)
    s = _MATRIX_RE.sub(lambda m: "\\" + m.group(1) + "{pmatrix}", s)  # bmatrix and pmatrix say the same
    s = re.sub(r"\x01\s*(\\end\{pmatrix\})", r"\1", s)  # a row break before \end ends no row
    s = s.replace("\x01", " \\\\ ")
    s = s.replace("\\$", "$").replace("−", "-").replace("°", " ° ").replace("€", " € ")
    s = re.sub(r"^[a-zA-Z]\s*=\s*(?!=)", "", s)  # "x = 5" -> "5"
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    return s.replace(" ^", "^")


def is_hedged(answer: str) -> bool:
    return _HEDGE_RE.search(_TEXT_CMD_RE.sub(lambda m: " " + m.group(1) + " ", answer.lower())) is not None


_CURRENCY_RE = re.compile(r"^(?:\$|£|€|¥|usd|eur|gbp|rs\.?)\s*", re.IGNORECASE)
_TRAILING_CURRENCY_RE = re.compile(r"\s*(?:\$|£|€|¥)$")
_DEGREE_RE = re.compile(r"\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree)\s*(?:[CF]\b)?$")


def numeric_value(s: str) -> tuple[Fraction | None, bool]:
    """(exact value, is_percentage) of a normalised answer, or (None, _) when it is not one number."""
    t = s.strip()
    if len(t) > 200:
        return None, False
    percent = False
    aside = re.fullmatch(r"([^()]+?) \(([^()]{1,40})\)", t)  # "18 (eighteen)", "18 (cm)": a restatement
    if aside:
        value, pct = numeric_value(aside.group(1))
        inner = aside.group(2)
        if value is not None and (parse_number(inner) == value or _units_tail(inner.split())):
            return value, pct
        return None, False
    m = re.fullmatch(r"(.*?)\s?(?:\\?%|percent|per\s?cent)", t, re.IGNORECASE)
    if m:
        t, percent = m.group(1), True
    t = _CURRENCY_RE.sub("", t)
    t = _TRAILING_CURRENCY_RE.sub("", t)
    tokens = t.split()
    # Units and rates at the end: "18 cm^2", "18 km per hour", "18 m/s^2", "18 ° C".
    for k in range(1, min(len(tokens), 5)):
        if _units_tail(tokens[k:]):
            t = " ".join(tokens[:k])
            break
    t = _DEGREE_RE.sub("", t).strip()
    value = parse_number(t)
    if value is not None:
        return value, percent
    glued = re.fullmatch(r"([-+]?[\d.,]+)([a-zA-Z/]+(?:\^?\{?[23]\}?)?)", t)  # "18cm", "18m/s"
    if glued and _is_unit(glued.group(2)):
        return parse_number(glued.group(1)), percent
    return None, percent


def distinct_answers(cands: list[Candidate]) -> list[tuple]:
    """Distinct answer keys, normalising each distinct raw text once (20k copies of one line cost one)."""
    return list(dict.fromkeys(answer_key(t) for t in dict.fromkeys(c.text for c in cands)))


def answer_key(s: str) -> tuple:
    """Identity of an answer for counting distinct candidates: its value when it is a number."""
    if len(s) > MAX_ANSWER_CHARS:
        return ("long", s)  # never normalised: over-long "answers" are rejected anyway
    norm = normalize_answer(s)
    value, percent = numeric_value(norm)
    if value is not None:
        return ("number", value, percent)
    return ("text", norm.replace(" ", ""))


# ---------------------------------------------------------------------------------------------
# Symbolic path: bounded input, LaTeX only, killable worker
# ---------------------------------------------------------------------------------------------

MAX_SYMBOLIC_CHARS = 300
MAX_POWERS = 8
MAX_EXPONENT_VALUE = 100
_HEAVY_RE = re.compile(r"\\(?:int|iint|oint|sum|prod|lim|infty\s*!|binom\s*\{\s*\d{4,})")


def to_latex(s: str) -> str:
    """Plain-text spellings that math-verify's LaTeX reader needs in LaTeX form."""
    s = re.sub(r"\s*(?:\\?%|percent)$", "", s)
    for _ in range(3):
        s = re.sub(r"(?<!\\)\bsqrt\s*\(([^()]*)\)", r"\\sqrt{\1}", s)
    s = re.sub(r"(?<![\\a-zA-Z])pi\b", r"\\pi", s)
    s = re.sub(r"(?<![\\a-zA-Z])(sin|cos|tan|cot|sec|csc|log|ln|exp)\b", r"\\\1", s)
    s = re.sub(r"(?<![\\a-zA-Z])(?:infinity|inf)\b", r"\\infty", s)
    s = s.replace("**", "^").replace("*", r"\cdot ")
    return s


def symbolic_rejection(latex: str) -> str | None:
    """Why ``latex`` is too risky to hand to a symbolic engine, or None.

    These bounds run before any parsing: a power tower ``10^{10^{10}}``, a huge factorial, a
    200-digit literal or a 10 kB expression can each keep sympy busy for minutes or exhaust memory.
    The worker's timeout would catch them too; rejecting them up front keeps the worker alive.
    """
    if len(latex) > MAX_SYMBOLIC_CHARS:
        return "too_long"
    if any(len(run) > MAX_DIGITS for run in re.findall(r"\d+", latex)):
        return "too_many_digits"
    if latex.count("^") > MAX_POWERS:
        return "too_many_powers"
    for m in re.finditer(r"\^\s*(\{(?:[^{}]|\{[^{}]*\})*\}|\S)", latex):
        exponent = m.group(1).strip("{}")
        if "^" in exponent or "\\uparrow" in exponent:
            return "power_tower"
        if any(int(n) > MAX_EXPONENT_VALUE for n in re.findall(r"\d+", exponent)):
            return "exponent_too_large"
    if re.search(r"(\d{3,}|\})\s*!", latex) or "!!" in latex:
        return "factorial_too_large"
    if _HEAVY_RE.search(latex):
        return "unsupported_construct"
    depth = 0
    for ch in latex:
        depth += ch == "{"
        depth -= ch == "}"
        if depth > 12:
            return "too_deep"
    bare = re.sub(r"\\[a-zA-Z]+", " ", re.sub(r"\\(?:begin|end)\{[a-z]+\}", " ", latex))
    if re.search(r"(?<!\\)\b[a-zA-Z]{2,}\b", bare):
        return "words"  # prose in an answer ("3 and 4", "no solution") is not a formula
    return None


_REL = {
    "\\le": "<=",
    "\\leq": "<=",
    "\\leqslant": "<=",
    "≤": "<=",
    "\\ge": ">=",
    "\\geq": ">=",
    "\\geqslant": ">=",
    "≥": ">=",
    "\\lt": "<",
    "\\gt": ">",
    "=<": "<=",
    "=>": ">=",
}
_REL_RE = re.compile(r"\\(?:leqslant|geqslant|leq|geq|le|ge|lt|gt)(?![a-zA-Z])|≤|≥")
_OR_RE = re.compile(r"\s*(?:\\cup|∪|\\lor|\bor\b|\\vee)\s*")
_BOUND = r"([^<>=]{1,60}?)"
_DOUBLE_RE = re.compile(rf"^{_BOUND}\s*(<=?)\s*([a-zA-Z])\s*(<=?)\s*{_BOUND}$")
_DOUBLE_GT_RE = re.compile(rf"^{_BOUND}\s*(>=?)\s*([a-zA-Z])\s*(>=?)\s*{_BOUND}$")
_SINGLE_RE = re.compile(rf"^([a-zA-Z])\s*(<=?|>=?)\s*{_BOUND}$")
_SINGLE_REV_RE = re.compile(rf"^{_BOUND}\s*(<=?|>=?)\s*([a-zA-Z])$")
_IN_RE = re.compile(r"^[a-zA-Z]\s*\\in\s*(.+)$")


def inequalities_as_intervals(s: str) -> str | None:
    """``x < 1 or x > 3`` -> ``(-\\infty, 1) \\cup (3, \\infty)``; ``2 \\le x < 5`` -> ``[2, 5)``;
    ``x \\in [2, 5)`` -> ``[2, 5)``. None when ``s`` is not inequalities in one variable. The same
    solution set written as inequalities or as intervals is the same answer."""
    if len(s) > 300:
        return None
    m = _IN_RE.match(s.strip())
    if m:
        return m.group(1).strip()
    t = _REL_RE.sub(lambda m: " " + _REL[m.group(0)] + " ", s)
    if "<" not in t and ">" not in t:
        return None
    parts, variables = [], set()
    for part in _OR_RE.split(t):
        part = part.strip()
        if part.startswith("(") and part.count("<") + part.count(">"):  # "(x < 1) or (x > 3)"
            part = part.strip("()").strip()
        m = _DOUBLE_RE.match(part)
        if m:
            lo, op1, var, op2, hi = m.groups()
            parts.append(("[" if op1 == "<=" else "(") + f"{lo.strip()}, {hi.strip()}" + ("]" if op2 == "<=" else ")"))
            variables.add(var)
            continue
        m = _DOUBLE_GT_RE.match(part)
        if m:
            hi, op1, var, op2, lo = m.groups()
            parts.append(("[" if op2 == ">=" else "(") + f"{lo.strip()}, {hi.strip()}" + ("]" if op1 == ">=" else ")"))
            variables.add(var)
            continue
        m = _SINGLE_RE.match(part)
        if m:
            var, op, bound = m.groups()
        else:
            m = _SINGLE_REV_RE.match(part)
            if not m:
                return None
            bound, op, var = m.groups()
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
        variables.add(var)
        b = bound.strip()
        if op.startswith("<"):
            parts.append(f"(-\\infty, {b}" + ("]" if op == "<=" else ")"))
        else:
            parts.append(("[" if op == ">=" else "(") + f"{b}, \\infty)")
    if len(variables) != 1 or not parts:
        return None
    return " \\cup ".join(parts)


def _bracket_kind(s: str) -> str:
    """ "set" for ``\\{…\\}``, "ordered" for ``(…)``/``[…]`` with a comma (a tuple, point or interval)."""
    t = s.replace(" ", "")
    if t.startswith("\\{") and t.endswith("\\}"):
        return "set"
    if t[:1] in "([" and t[-1:] in ")]" and "," in t and "\\cup" not in t:
        return "ordered"
    return ""


def _decimals(s: str) -> int | None:
    """Decimal places of the most precise decimal literal in ``s``, or None when there is none."""
    places = [len(frac) for frac in re.findall(r"\d\.(\d+)", s)]
    return max(places) if places else None


def equivalent(gold: str, pred: str, timeout_s: float = 5.0) -> tuple[bool, str]:
    """(is ``pred`` the same answer as ``gold``, reason). Reasons: ok, wrong, timeout, too_long,
    power_tower, ..., unparsed, checker_error. Both inputs are raw answer strings.

    Values compare exactly: a decimal is the same as an exact answer only when it is exactly equal
    (0.5 and 1/2), never because it rounds to it (3.141593 is not π) — unless the gold is itself a
    decimal, which states the precision the answer is read at."""
    g, p = normalize_answer(gold), normalize_answer(pred)
    if not p:
        return False, "empty_answer"
    if g.replace(" ", "") == p.replace(" ", ""):
        return True, "ok"
    gv, g_percent = numeric_value(g)
    pv, p_percent = numeric_value(p)
    if gv is not None and pv is not None:
        if g_percent:  # gold "50%": 50%, 50 and 0.5 all say the same thing
            same = pv == gv or (not p_percent and pv == gv / 100)
        else:  # gold "50": a % on the prediction is a unit, never a /100 (the x100 decoy)
            same = pv == gv
        return same, "ok" if same else "wrong"
    g = inequalities_as_intervals(g) or g
    p = inequalities_as_intervals(p) or p
    kinds = {_bracket_kind(g), _bracket_kind(p)}
    if kinds == {"set", "ordered"}:  # {1, 2} is a set; (1, 2) is an ordered pair or an interval
        return False, "wrong"
    if _bracket_kind(g) == "ordered" and not _bracket_kind(p) and "," in p:  # "2, 5" does not say which of the two
        return False, "wrong"
    g_latex, p_latex = to_latex(g), to_latex(p)
    for latex in (p_latex, g_latex):
        why = symbolic_rejection(latex)
        if why is not None:
            return False, why
    outcome = get_pool().compare(g_latex, p_latex, timeout_s, gold_decimals=_decimals(g))
    return {
        "equal": (True, "ok"),
        "not_equal": (False, "wrong"),
        "unparsed": (False, "unparsed"),
        "timeout": (False, "timeout"),
        "error": (False, "checker_error"),
    }[outcome]


def gold_answer(gold: Any) -> str:
    """The answer inside a dataset's gold field (GSM8K's ``... #### 18``, MATH's ``\\boxed{}``)."""
    g = str(gold)
    if "####" in g:
        return g.rsplit("####", 1)[1].strip()
    boxed = _boxed_contents(g)
    return boxed[-1] if boxed else g.strip()


# ---------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------


class MathReward(CheckerReward):
    """1.0 when the completion states exactly one final answer and it equals the gold, else 0.0."""

    kind = "correctness"

    def __init__(self, gold_column: str = "answer", timeout_s: float = 5.0, name: str = "math"):
        super().__init__(name)
        if timeout_s <= 0:
            raise ValueError(f"math reward: timeout_s must be > 0 seconds, got {timeout_s}")
        self.gold_column = gold_column
        self.timeout_s = timeout_s

    def check(self, text: str, row: dict[str, Any]) -> Verdict:
        gold = row.get(self.gold_column)
        if gold is None:
            return Verdict(False, None, reason="no_gold")
        return check_math(text, gold, truncated=bool(row.get("truncated", False)), timeout_s=self.timeout_s)


def _is_list(gold: str) -> bool:
    """A bare comma list (the roots of a quadratic: ``2, 3``); a bracketed ``(2, 5)`` is one point
    or interval, and "2 or 5" does not state it."""
    g = normalize_answer(gold)
    return "," in g and numeric_value(g)[0] is None and not _bracket_kind(g) and "\\cup" not in g


def _join_alternatives(answer: str) -> str:
    """When the gold is a list (the roots of a quadratic), "x = 2 or x = 3" states the list."""
    parts = re.split(r"\s*(?:,|\bor\b|\band\b)\s*", normalize_answer(answer))
    parts = [re.sub(r"^[a-zA-Z]\s*=\s*", "", p).strip() for p in parts]
    return ", ".join(parts) if all(parts) else answer


def check_math(text: str, gold: Any, *, truncated: bool = False, timeout_s: float = 5.0) -> Verdict:
    """The verdict for one completion against one gold answer (pure apart from the worker pool)."""
    if len(text) > MAX_COMPLETION_CHARS:
        return Verdict(False, 0.0, reason="completion_too_long", extra={"chars": len(text)})
    cands, why = extract_candidates(text)
    keys = distinct_answers(cands)
    first = cands[0] if cands else None
    verdict = Verdict(
        correct=False,
        reward=0.0,
        extracted=(normalize_answer(first.text) if len(first.text) <= MAX_ANSWER_CHARS else first.text[:80] + "...")
        if first
        else None,
        path=first.path if first else "",
        n_candidates=len(keys),
    )
    if truncated:
        verdict.reason = "truncated"
    elif not cands or why != "ok":
        verdict.reason = why
    elif len(keys) > 1:
        verdict.reason = "multiple_answers"
        verdict.extra["candidates"] = [c.text[:80] for c in cands][:10]
    elif len(first.text) > MAX_ANSWER_CHARS:
        verdict.reason = "answer_too_long"
    else:
        gold_text = gold_answer(gold)
        is_list = _is_list(gold_text)
        answer = _join_alternatives(first.text) if is_list else first.text
        line = _join_alternatives(first.line) if is_list and first.line else first.line
        if inequalities_as_intervals(normalize_answer(answer)) is not None:
            # "x < 1 or x > 3" is one solution set: its "or" is not a hedge; the rest of the line still counts.
            answer, line = "", line.replace(first.text, " ")
        if is_hedged(answer) or is_hedged(line):  # "Answer: 18. Or maybe 19."
            verdict.reason = "hedged"
            return verdict
        same, reason = equivalent(gold_text, first.text if not answer else answer, timeout_s)
        verdict.correct, verdict.reward, verdict.reason = same, float(same), reason
    return verdict


def _math_factory(**options: Any) -> MathReward:
    return MathReward(**options)


REWARDS.add("math", _math_factory)
