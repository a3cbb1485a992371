"""The math checker: strict final-answer extraction, generous equivalence (issue 5, DESIGN.md §6).

Extraction is strict because training optimises whatever the extractor lets through:
  * a final answer is read only from an anchor: ``\\boxed{}``/``\\fbox{}``, ``<answer>…</answer>``,
    ``Answer:`` / ``The (final) answer is``, ``#### x``, or — when the completion (or the text after
    a ``</think>`` block) is nothing but a short answer — that text itself;
  * every anchor is read and the distinct answers counted: more than one is ``multiple_answers``
    (answer spraying scores 0); there is no "last number anywhere" fallback;
  * a hedged answer (``3 or 4``, ``maybe 5``, ``approximately 7``) is ``hedged`` and scores 0;
  * a truncated completion (the trainer's ``truncated`` column) scores 0, whatever it contains.

Equivalence is generous about *form* and exact about *value*: numbers compare as exact fractions
after reading integers, decimals, fractions, ``\\frac``, thousands separators, scientific forms,
number words, currency and unit words; a percent sign means /100 only when the gold is a
percentage (so ``50%`` is never accepted for a gold of ``0.5``: that is the ×100 decoy). Anything
else goes to math-verify (LaTeX parsing and symbolic comparison) in a killable worker process
after the input passed size, digit and exponent bounds. Model text is never evaluated as code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rlvr.rewards.base import REWARDS, CheckerReward, Verdict
from rlvr.rewards.numparse import (
    MAX_DIGITS,
    NUMBER_WORDS,
    parse_number,
    parse_number_words,
)
from rlvr.rewards.symbolic import get_pool

# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------

# Every pattern here is linear in the completion: no lazy group followed by an optional run
# (``(.+?)\s*$`` is quadratic on a line of spaces), no ``\s``/``\W`` runs that cross lines.
_ANCHOR_RE = re.compile(
    r"(?im)(?:\bfinal[ \t]+answer|\bthe[ \t]+answer|^[^\w\n]{0,8}answer)[^\w\n]{0,4}?[ \t]*(?:is\b|:|=)[ \t:*]*([^\n]*)"
)
_HASHES_RE = re.compile(r"(?m)^[ \t]*####[ \t]*([^\n]*)")
_ANSWER_TAG_RE = re.compile(r"(?s)<answer>(.*?)</answer>")
_BOX_START_RE = re.compile(r"\\(?:boxed|fbox)[ \t]*")
_TOKEN_RE = re.compile(r"[^\s$]+")
_BRACE_RE = re.compile(r"[{}]")
_SHORT_ANSWER_MAX = 60  # chars: a bare completion longer than this is prose, not an answer
MAX_ANSWER_CHARS = 1000  # a final answer longer than this is not one (and is never normalised)
MAX_BOXES = 20  # more boxes than this is spraying whatever they hold
MAX_COMPLETION_CHARS = 400_000  # ~100k tokens; longer text is rejected before any parsing


@dataclass(frozen=True)
class Candidate:
    path: str  # "boxed", "answer_tag", "answer_anchor", "####", "after_think", "whole"
    text: str
    line: str = ""  # the whole anchor line the answer was clipped from: hedges there count too


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces (unbalanced ones
    are dropped: a box cut off by truncation is not an answer). At most ``MAX_BOXES + 1`` boxes
    are read, each scanned over at most ``MAX_ANSWER_CHARS`` characters, so the cost is bounded."""
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
                    found.append(text[i + 1 : brace.start()])
                    break
        elif m.group(0).endswith(" "):  # "\boxed 5": the next token
            tok = _TOKEN_RE.match(text, i, i + MAX_ANSWER_CHARS)
            if tok:
                found.append(tok.group(0))
    return found


_NESTED_ANCHOR_RE = re.compile(r"^(?:the[ \t]+)?(?:final[ \t]+)?answer[ \t]*(?:is\b|:)[ \t:*]*", re.IGNORECASE)


def _clip_anchor(s: str) -> str:
    # "The answer is 18 because ..." / "Answer: 18. Done." -> "18"; Minerva's "Final Answer: The
    # final answer is $18$. I hope it is correct." -> "$18$"
    s = _NESTED_ANCHOR_RE.sub("", s.strip(), count=1)
    s = re.split(r"\s+(?:because|since|as|which|so)\b|,\s+(?=[a-zA-Z]{2,})|\.\s|;\s", s, maxsplit=1)[0]
    return s.strip().strip("*").strip()


def _answer_like(s: str) -> bool:
    # "To get the answer: first add the two rates" is prose, not a final answer; a capture counts
    # when it holds a digit, math markup, or is at most four words ("eighteen", "no solution").
    return bool(s) and (bool(re.search(r"[\d$\\]", s)) or len(s.split()) <= 4 or parse_number_words(s) is not None)


def extract_candidates(text: str) -> tuple[list[Candidate], str]:
    """All final-answer candidates of a completion, and a reason when there cannot be any."""
    if "<think>" in text and "</think>" not in text:
        return [], "unclosed_think"
    after_think = "</think>" in text
    if after_think:
        text = text.rsplit("</think>", 1)[1]
    cands: list[Candidate] = []
    tags = _ANSWER_TAG_RE.findall(text)
    cands += [Candidate("answer_tag", t) for t in tags]
    outside = _ANSWER_TAG_RE.sub(" ", text)
    cands += [Candidate("boxed", b) for b in _boxed_contents(outside)]
    # An anchor line that holds a \boxed{} is the same statement as the box, already counted.
    anchors = [a[: MAX_ANSWER_CHARS + 1] for a in _ANCHOR_RE.findall(outside) if not _BOX_START_RE.search(a)]
    cands += [Candidate("answer_anchor", _clip_anchor(a), a) for a in anchors if _answer_like(_clip_anchor(a))]
    cands += [Candidate("####", _clip_anchor(h[: MAX_ANSWER_CHARS + 1]), h[: MAX_ANSWER_CHARS + 1]) for h in _HASHES_RE.findall(outside)]
    if not cands:
        bare = text.strip()
        # "x = 2" is an answer; "5 + 13 = 18" is working: only "<letter> =" may hold an "=".
        short = bare and len(bare) <= _SHORT_ANSWER_MAX and "\n" not in bare and "=" not in re.sub(r"\b[a-zA-Z]\s*=", "", bare)
        # The bare text counts only when it *is* an answer: a number (with units or in words) or
        # a formula; "Reasoning... 12 apples and 4 pears" is prose and has no final answer.
        words = set(re.findall(r"(?<!\\)\b[a-zA-Z]{2,}", bare.lower())) - {"or", "and"}
        if short and (not words or numeric_value(normalize_answer(bare))[0] is not None):
            cands.append(Candidate("after_think" if after_think else "whole", bare))
    return cands, ("ok" if cands else "no_answer")


# ---------------------------------------------------------------------------------------------
# Normalisation and numeric reading
# ---------------------------------------------------------------------------------------------

_HEDGE_RE = re.compile(
    r"\b(?:or|either|nor|maybe|perhaps|possibly|probably|likely|approximately|approx|about|around|"
    r"roughly|nearly|almost|between|guess|could|might|unsure|uncertain|alternatively)\b|\\lor\b|\\approx\b|≈|\\sim\b|\?"
)
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING_RE = re.compile(r"\\(?:left|right|displaystyle|!|,|;|:|quad|qquad)|\\ ")
# Words after a number that are *not* units: stripping them would change the value or the claim.
_NOT_UNITS = NUMBER_WORDS | {
    "or", "and", "to", "of", "by", "over", "times", "plus", "minus", "divided", "squared", "cubed",
    "pi", "sqrt", "root", "roots", "i", "e", "x", "y", "z", "n", "k", "ln", "log", "sin", "cos",
    "tan", "dozen", "dozens", "half", "halves", "third", "thirds", "quarter", "quarters", "fourth",
    "fourths", "fifth", "fifths", "tenth", "tenths", "hundredth", "hundredths", "percent",
    "not", "no", "less", "more", "than", "least", "most", "each", "per", "remainder", "r",
    # a sentence, not a unit: "18 is wrong", "18 if n is even", "18 but check"
    "is", "are", "was", "were", "if", "then", "else", "but", "unless", "except", "otherwise", "wrong",
    "incorrect", "correct", "right", "true", "false", "yes", "wait", "actually", "when", "where",
}
_UNIT_WORD_RE = re.compile(r"^[a-zA-Z][a-zA-Z.]*(?:\^?[23])?(?:/[a-zA-Z]+)?$")
_GLUED_UNITS = {"cm", "mm", "km", "m", "kg", "g", "mg", "lb", "lbs", "oz", "ft", "in", "mi", "ml", "l", "h", "hr", "hrs", "min", "s", "sec", "mph", "kmh"}


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
    s = _SPACING_RE.sub(" ", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = _TEXT_CMD_RE.sub(lambda m: " " + m.group(1) + " ", s)
    s = s.replace("\\$", "$").replace("−", "-")
    s = re.sub(r"^[a-zA-Z]\s*=\s*(?!=)", "", s)  # "x = 5" -> "5"
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    return s


def is_hedged(answer: str) -> bool:
    return _HEDGE_RE.search(_TEXT_CMD_RE.sub(lambda m: " " + m.group(1) + " ", answer.lower())) is not None


def numeric_value(s: str) -> tuple[Fraction | None, bool]:
    """(exact value, is_percentage) of a normalised answer, or (None, _) when it is not one number."""
    t = s.strip()
    percent = False
    m = re.fullmatch(r"(.*?)\s*(?:\\?%|percent|per\s*cent)", t, re.IGNORECASE)
    if m:
        t, percent = m.group(1), True
    t = re.sub(r"^(?:\$|£|€|usd|eur)\s*", "", t, flags=re.IGNORECASE)
    t = re.sub(r"\s*(?:\^\s*\{?\\circ\}?|°|\\degree)$", "", t)
    value = parse_number(t)
    if value is not None:
        return value, percent
    glued = re.fullmatch(r"([-+]?[\d.,]+)([a-zA-Z]+)", t)
    if glued and glued.group(2).lower() in _GLUED_UNITS:
        return parse_number(glued.group(1)), percent
    tokens = t.split()
    for k in range(len(tokens) - 1, max(len(tokens) - 4, 0) - 1, -1):  # at most 3 unit words
        if k == 0:
            break
        tail = tokens[k:]
        if all(_UNIT_WORD_RE.match(w) and w.lower().rstrip(".") not in _NOT_UNITS for w in tail):
            value = parse_number(" ".join(tokens[:k]))
            if value is not None:
                return value, percent
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
    if re.search(r"(?<!\\)\b[a-zA-Z]{2,}\b", re.sub(r"\\[a-zA-Z]+", " ", latex)):
        return "words"  # prose in an answer ("3 and 4", "no solution") is not a formula
    return None


def equivalent(gold: str, pred: str, timeout_s: float = 5.0) -> tuple[bool, str]:
    """(is ``pred`` the same answer as ``gold``, reason). Reasons: ok, wrong, timeout, too_long,
    power_tower, ..., unparsed, checker_error. Both inputs are raw answer strings."""
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
    g_latex, p_latex = to_latex(g), to_latex(p)
    for latex in (p_latex, g_latex):
        why = symbolic_rejection(latex)
        if why is not None:
            return False, why
    outcome = get_pool().compare(g_latex, p_latex, timeout_s)
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
    g = normalize_answer(gold)
    return "," in g and numeric_value(g)[0] is None


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
        extracted=(normalize_answer(first.text) if len(first.text) <= MAX_ANSWER_CHARS else first.text[:80] + "...") if first else None,
        path=first.path if first else "",
        n_candidates=len(keys),
    )
    if truncated:
        verdict.reason = "truncated"
    elif not cands:
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
        if is_hedged(answer) or is_hedged(line):  # "Answer: 18. Or maybe 19."
            verdict.reason = "hedged"
            return verdict
        same, reason = equivalent(gold_text, answer, timeout_s)
        verdict.correct, verdict.reward, verdict.reason = same, float(same), reason
    return verdict


def _math_factory(**options: Any) -> MathReward:
    return MathReward(**options)


REWARDS.add("math", _math_factory)
