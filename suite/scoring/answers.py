"""A response's final answer as text, and plain numbers read exactly: string work only.

Nothing here evaluates, compiles or ``sympify``-s what a model wrote. A number is read by a regular
expression into a ``fractions.Fraction``; anything else stays a string for the LaTeX grader
(suite.scoring.math_equal), which parses it as data in a sandboxed worker (suite.scoring.sandbox).
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX = re.compile(r"\\(?:boxed|fbox)\b")


def boxes(text: str) -> list[str]:
    """The contents of every outermost ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, in order, braces
    balanced; a nested box (``\\boxed{\\boxed{3}}``) is read inside out; ``\\boxed 5`` (a few MATH
    solutions write it) runs to the next ``$``. An empty or unbalanced box is an empty string (an unbalanced
    one ends the list: nothing after it can close)."""
    found, pos = [], 0
    while True:
        m = _BOX.search(text, pos)
        if m is None:
            return found
        rest = text[m.end():]
        if rest[:1] == " " and not rest.lstrip().startswith("{"):
            found.append(rest.split("$")[0].strip())
            pos = m.end() + 1
            continue
        start = m.end() + (len(rest) - len(rest.lstrip()))
        if text[start:start + 1] != "{":
            pos = m.end()
            continue
        depth, end = 0, None
        for i in range(start, len(text)):
            ch = text[i]
            if ch == "{" and text[i - 1:i] != "\\":
                depth += 1
            elif ch == "}" and text[i - 1:i] != "\\":
                depth -= 1
                if depth == 0:
                    end = i
                    break
        if end is None:
            return found + [""]
        body = text[start + 1:end].strip()
        inner = boxes(body)
        if inner and _BOX.match(body.lstrip()) and body.rstrip().endswith("}"):
            found.append(inner[-1])  # \boxed{\boxed{3}}: the innermost
        else:
            found.append(body)
        pos = end + 1


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (see `boxes`), or None when there is none or
    it is empty or unbalanced."""
    found = boxes(text)
    return (found[-1] or None) if found else None


# A trailing unit in \text{...} / \mathrm{...} / \mbox{...}: "5 \text{ cm}", "3\,\mathrm{m/s^2}".
_UNIT = re.compile(r"\\(?:text|textbf|mathrm|mbox|textrm|operatorname)\s*\{\s*~?[A-Za-z][A-Za-z\s/^.\d~-]*\}\s*$")
_SPACING = re.compile(r"\\[,;: ]|~|\\quad|\\qquad")
_PERCENT = re.compile(r"\s*(?:\\%|%|\\text\{\s*\\?%\s*\}|\\text\{\s*percent\s*\}|\bpercent(?:age)?\b|\bpct\b)\s*$")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree\b|°")


def strip_units(answer: str) -> str:
    """``answer`` without math delimiters, a trailing unit, degree or percent sign, dollar signs and LaTeX
    spacing. A percent sign is dropped, never applied: ``28\\%`` reads as 28, so 0.28 is not 28%, and
    5 is not 500 (the percent rule some graders have, which accepts wrong answers)."""
    a = answer.strip()
    for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
        if a.startswith(left) and a.endswith(right):
            a = a[len(left):-len(right)]
    a = a.strip().strip("$").strip()
    a = a.replace("\\$", "").replace("\\left", "").replace("\\right", "")
    a = a.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    a = _DEGREES.sub("", a)
    a = _SPACING.sub(" ", re.sub(r"\\!\s*", "", a)).strip()  # \! is a negative space: 32,\! 349 is one number
    whole = re.fullmatch(r"\\(?:text|textbf|mathrm)\{([^{}]*)\}", a)
    if whole:  # a whole answer in \text{} is its text, not a unit
        return whole.group(1).strip()
    for _ in range(2):  # "5 \text{ m} \text{ s}" style units, "28 percent"
        a = _PERCENT.sub("", a).strip()
        a = _UNIT.sub("", a).strip()
    return a.rstrip(".").strip()


# 1,234,567 or 32{,}349 (thousands), a decimal, a plain integer; \frac{a}{b} and a/b of integers.
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?$")
_DECIMAL = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)$")
_FRAC = re.compile(r"^(-?)\\frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}$|^(-?)\\frac\s*(\d)(\d)$")
_SLASH = re.compile(r"^(-?\d+)\s*/\s*(-?\d+)$")


def plain_number(text: str) -> tuple[Fraction, bool] | None:
    """``text`` as an exact number and whether it was written as a decimal with a fractional part
    (``0.0833``: a rounded value), or None when it is not a plain number. Reads integers (``7425000``,
    ``7,425,000``, ``32{,}349``), decimals, ``\\frac{a}{b}`` / ``\\frac12`` / ``a/b`` of integers, and a
    leading minus. Nothing else: ``2\\sqrt{3}`` is for the LaTeX grader."""
    s = text.strip()
    if re.search(r",\s", s):  # "32, 349" is a list of two numbers, "32,349" one
        return None
    s = s.replace(" ", "")
    if s.startswith("+"):
        s = s[1:]
    if _THOUSANDS.match(s):
        s = s.replace("{,}", "").replace(",", "")
    if _DECIMAL.match(s):
        return Fraction(s), "." in s and s.rstrip("0").rstrip(".") != s.split(".")[0]
    m = _FRAC.match(s)
    if m:
        sign, num, den = (m.group(1), m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5), m.group(6))
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return (-value if sign else value), False
    m = _SLASH.match(s)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2))), False
    return None


DECIMAL_PLACES = 6  # a decimal matches a fraction when both round alike here (math-verify's float_rounding)


def numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    """Two plain numbers (see `plain_number`) equal: exactly, or where one side is a rounded decimal and
    the other is not, at `DECIMAL_PLACES` (``0.0833333`` is 1/12; ``1.33`` is not 4/3). Never a relative
    tolerance: 123457 is not 123456."""
    (x, x_rounded), (y, y_rounded) = a, b
    if x == y:
        return True
    if x_rounded == y_rounded:
        return False
    return round(x, DECIMAL_PLACES) == round(y, DECIMAL_PLACES)


__all__ = ["DECIMAL_PLACES", "boxes", "last_boxed", "numbers_equal", "plain_number", "strip_units"]
