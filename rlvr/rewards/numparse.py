"""Exact reading of numbers written by people and models, without evaluating anything.

Every answer form the math checker calls "the same number" goes through ``parse_number``:
``18``, ``18.0``, ``1,234``, ``-3/4``, ``\\frac{3}{4}``, ``1.5e3``, ``2.5 \\times 10^{3}``,
``eighteen``, ``one hundred and five``, ``1.5 million``. Values are ``fractions.Fraction`` so
equality is exact (0.1 + 0.2 == 0.3 here). Inputs are bounded first (digits, exponents, length),
so no form can make this module slow: it is safe to call in the trainer process.

Nothing here calls ``eval``, ``sympify`` or ``parse_expr``; it is regular expressions over a
bounded string and integer arithmetic with bounded exponents.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_CHARS = 120  # longer strings are not "a number" for the fast path
MAX_DIGITS = 60  # per digit run; 10^60 is far beyond any dataset answer
MAX_EXPONENT = 60  # |e| in 1.5e3 / 10^{3}

_UNITS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
}
_TENS = {
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
NUMBER_WORDS = frozenset(_UNITS) | frozenset(_TENS) | frozenset(_SCALES) | {"hundred"}

_SIGN = r"[-+\u2212]?"
_PLAIN = r"\d+(?:\.\d*)?|\.\d+"
_GROUPED = r"\d{1,3}(?:,\d{3})+(?:\.\d*)?"  # 1,234,567.5 — only correct grouping is a number
_NUMBER_RE = re.compile(rf"^({_SIGN})({_GROUPED}|{_PLAIN})(?:[eE]([-+]?\d+))?$")
_FRAC_RE = re.compile(rf"^({_SIGN})\\[dt]?frac\{{\s*({_SIGN}[\d.,]+)\s*\}}\{{\s*({_SIGN}[\d.,]+)\s*\}}$")
_SLASH_RE = re.compile(rf"^({_SIGN}[\d.,]+)\s*/\s*({_SIGN}[\d.,]+)$")
_TIMES_POW_RE = re.compile(r"^(.+?)\s*(?:\\times|\\cdot|×|\*|x)\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?$")
_SCALE_RE = re.compile(r"^(.+?)\s+(thousand|million|billion|trillion)$")
_MIXED_RE = re.compile(rf"^({_SIGN})(\d+)\s*(?:\s(\d+)\s*/\s*(\d+)|\\[dt]?frac\{{\s*(\d+)\s*\}}\{{\s*(\d+)\s*\}})$")
_REPEATING_RE = re.compile(rf"^({_SIGN})(\d*)\.(\d*)\\overline\{{\s*(\d+)\s*\}}$")
# Denominators spelled as ordinals: "two thirds", "one half", "three quarters", "a fifth".
_ORDINALS = {
    "half": 2,
    "halves": 2,
    "third": 3,
    "thirds": 3,
    "quarter": 4,
    "quarters": 4,
    "fourth": 4,
    "fourths": 4,
    "fifth": 5,
    "fifths": 5,
    "sixth": 6,
    "sixths": 6,
    "seventh": 7,
    "sevenths": 7,
    "eighth": 8,
    "eighths": 8,
    "ninth": 9,
    "ninths": 9,
    "tenth": 10,
    "tenths": 10,
    "hundredth": 100,
    "hundredths": 100,
    "thousandth": 1000,
    "thousandths": 1000,
}
_DIGIT_RUN_RE = re.compile(r"\d+")


def _sign(s: str) -> int:
    return -1 if s in ("-", "\u2212") else 1


def within_bounds(s: str) -> bool:
    """True when ``s`` is short and has no digit run long enough to make arithmetic expensive."""
    return len(s) <= MAX_CHARS and all(len(run) <= MAX_DIGITS for run in _DIGIT_RUN_RE.findall(s))


def _parse_decimal(s: str) -> Fraction | None:
    m = _NUMBER_RE.match(s)
    if m is None:
        return None
    sign, body, exp = m.groups()
    value = Fraction(body.replace(",", ""))
    if exp is not None:
        e = int(exp)
        if abs(e) > MAX_EXPONENT:
            return None
        value *= Fraction(10) ** e
    return _sign(sign) * value


def parse_number_words(s: str) -> int | None:
    """``"one hundred and five"`` -> 105; ``None`` for anything not entirely number words.

    Only unambiguous cardinal forms: units, tens (``twenty-one`` / ``twenty one``), ``hundred``,
    scale words, an optional ``and`` after ``hundred``/a scale, and a leading ``minus`` or
    ``negative``. Hedges (``two or three``), ``a couple``, ``a dozen`` and ordinals are not numbers.
    """
    words = s.lower().replace("-", " ").replace(",", " ").split()
    if not words or len(words) > 20:
        return None
    sign = 1
    if words[0] in ("minus", "negative"):
        sign, words = -1, words[1:]
        if not words:
            return None
    total, current, seen_any, prev, last_scale = 0, 0, False, "", None
    for w in words:
        if w == "and":
            if prev not in ("hundred", *_SCALES):
                return None
            prev = w
            continue
        if w in _UNITS:
            if prev in _UNITS or (prev in _TENS and _UNITS[w] >= 10) or (prev in _TENS and _UNITS[w] == 0):
                return None  # "five six", "twenty eleven", "twenty zero"
            current += _UNITS[w]
        elif w in _TENS:
            if prev in _UNITS or prev in _TENS:
                return None
            current += _TENS[w]
        elif w == "hundred":
            if prev not in _UNITS or current >= 100:
                return None
            current *= 100
        elif w in _SCALES:
            if current == 0 or (last_scale is not None and _SCALES[w] >= last_scale):
                return None  # "a thousand", "one thousand one million"
            last_scale = _SCALES[w]
            total += current * _SCALES[w]
            current = 0
        else:
            return None
        seen_any, prev = True, w
    if not seen_any or prev == "and":
        return None
    return sign * (total + current)


def parse_number(s: str) -> Fraction | None:
    """The exact value of ``s`` if it is one plain number in a common form, else ``None``.

    Callers strip units, ``$``, ``\\text{}`` and percent signs first (``rlvr.rewards.mathcheck``);
    this function only reads the number itself.
    """
    s = s.strip()
    if not s or not within_bounds(s):
        return None
    value = _parse_decimal(s)
    if value is not None:
        return value
    m = _FRAC_RE.match(s)
    if m:
        num, den = _parse_decimal(m.group(2)), _parse_decimal(m.group(3))
        if num is None or den is None or den == 0:
            return None
        return _sign(m.group(1)) * num / den
    m = _SLASH_RE.match(s)
    if m:
        num, den = _parse_decimal(m.group(1)), _parse_decimal(m.group(2))
        if num is None or den is None or den == 0:
            return None
        return num / den
    m = _TIMES_POW_RE.match(s)
    if m:
        mant, e = _parse_decimal(m.group(1)), int(m.group(2))
        if mant is None or abs(e) > MAX_EXPONENT:
            return None
        return mant * Fraction(10) ** e
    m = _SCALE_RE.match(s)
    if m:
        mant = _parse_decimal(m.group(1))
        if mant is None:
            w = parse_number_words(m.group(1))
            mant = Fraction(w) if w is not None else None
        if mant is not None:
            return mant * _SCALES[m.group(2)]
    m = _MIXED_RE.match(s)
    if m:  # "1 1/2", "1\\frac{1}{2}": a whole number and a proper fraction
        whole, num, den = int(m.group(2)), int(m.group(3) or m.group(5)), int(m.group(4) or m.group(6))
        if den == 0 or num >= den:
            return None
        return _sign(m.group(1)) * (whole + Fraction(num, den))
    m = _REPEATING_RE.match(s)
    if m:  # 0.1\\overline{6} = 1/6: the repeating block over 9...9, shifted past the fixed digits
        whole, fixed, block = m.group(2) or "0", m.group(3), m.group(4)
        value = Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed))
        value += Fraction(int(block), (10 ** len(block) - 1) * 10 ** len(fixed))
        return _sign(m.group(1)) * value
    words = parse_number_words(s)
    if words is not None:
        return Fraction(words)
    return parse_fraction_words(s)


def parse_fraction_words(s: str) -> Fraction | None:
    """``"two thirds"`` -> 2/3, ``"one half"`` / ``"a half"`` -> 1/2, ``"18 thousandths"`` -> 18/1000,
    ``"half a million"`` -> 500000; ``None`` for anything else. A denominator word changes the value,
    so it is read here and never stripped as if it were a unit."""
    words = s.lower().replace("-", " ").split()
    if len(words) == 3 and words[0] == "half" and words[1] == "a" and words[2] in (*_SCALES, "hundred", "dozen"):
        return Fraction({**_SCALES, "hundred": 100, "dozen": 12}[words[2]], 2)
    if len(words) < 2 or words[-1] not in _ORDINALS:
        return None
    head = " ".join(words[:-1])
    if head in ("a", "an"):
        num: Fraction | int | None = 1
    else:
        num = _parse_decimal(head) if re.fullmatch(r"\d+", head) else parse_number_words(head)
    if num is None:
        return None
    if (num == 1) == words[-1].endswith("s"):  # "one thirds", "two third": not well-formed
        return None
    return Fraction(num) / _ORDINALS[words[-1]]
