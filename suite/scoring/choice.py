"""Multiple-choice answers (ARC-Challenge, GPQA, MMLU-Pro): the option letter a response ends on, against the
truth's letter. String work only (regular expressions), so it runs in the caller.

The letter is read, in this order, from the last ``\\boxed{...}`` (``\\boxed{C}``, ``\\boxed{\\text{(C)}}``), else
the last "answer is (C)" / "Answer: C" phrase; a response naming none scores 0. Letters A-J (MMLU-Pro has ten
options); the prompts `suite data prepare` writes ask for the letter in a box.
"""

from __future__ import annotations

import re

from suite.scoring.answers import last_boxed

LETTERS = "ABCDEFGHIJ"
_BOXED_LETTER = re.compile(r"^\s*(?:\\text\{|\\textbf\{|\\mathrm\{)?\s*\(?\s*([A-J])\s*\)?\s*\}?\s*[.:]?\s*"
                           r"(?:[\s:.)-].*)?$", re.S)
_PHRASE = re.compile(r"(?i:answer|option|choice)\s*(?i:is|:)?\s*(?:\*\*)?\s*[\(\[]?\s*([A-J])\s*[\)\]]?(?![A-Za-z])")


def choice(response: str) -> str | None:
    """The option letter the response answers with, or None."""
    boxed = last_boxed(response)
    if boxed is not None:
        m = _BOXED_LETTER.match(boxed)
        return m.group(1) if m else None
    found = [m.group(1).upper() for m in _PHRASE.finditer(response)]
    return found[-1] if found else None


def score(response: str, ground_truth: str) -> float:
    """1.0 when the response's letter is the truth's (one letter, A-J), else 0.0."""
    truth = str(ground_truth).strip().upper()
    if len(truth) != 1 or truth not in LETTERS:
        raise ValueError(f"a multiple-choice ground truth is one letter A-J, got {ground_truth!r}")
    return float(choice(response) == truth)


__all__ = ["LETTERS", "choice", "score"]
