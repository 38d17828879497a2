"""The suite's answer scorer: `compute_score(data_source, solution_str, ground_truth, extra_info)`,
verl's reward-function signature, used by verl runs (``reward.custom_reward_function``, set by the
translator) and by ``suite eval``, so training reward and evaluation score one way.

The held-out sets verl has no scorer for (`SUITE_SOURCES`: Minerva-Math, OlympiadBench and
OpenR1-Math, written by ``suite data prepare``) are graded here: the last ``\\boxed{}`` of the
response (nested boxes read inside out), units and formatting stripped from both sides
(``\\text{ cm}``, ``\\mathrm{m/s}``, ``^\\circ``, ``\\%``, thin spaces), then verl's PRIME math
grader (string normalisation, then sympy and numeric equality: ``\\frac12 == 0.5``, ``2\\sqrt3 ==
\\sqrt{12}``, but a rounded ``1.33 != \\frac43``). Every other data source goes to verl's own
``default_compute_score`` unchanged (GSM8K's ``####``, MATH's normalised ``\\boxed{}``, DAPO's
``Answer:`` line), so the runs that scored before score the same. Scores are 1.0 / 0.0 (DAPO's
scorer gives +1 / -1, which ``correct`` reads as right / wrong).

Nothing here imports verl at import time: the module is loaded by path in verl's reward workers.
"""

from __future__ import annotations

import re

# data_source -> benchmark of the held-out sets this module grades (suite.verl.data writes them)
SUITE_SOURCES = ("minerva_math", "olympiadbench", "openr1_math")

# A trailing unit in \text{...} / \mathrm{...} / \mbox{...} (letters, spaces, /, ^, digits, ~ and .):
# "5 \text{ cm}", "3\,\mathrm{m/s^2}"; degrees and percent signs; LaTeX spacing.
_UNIT = re.compile(r"\\(?:text|mathrm|mbox|textrm|operatorname)\s*\{\s*~?[A-Za-z][A-Za-z\s/^.\d~-]*\}\s*$")
_SPACING = re.compile(r"\\[,;:! ]|~")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; for
    nested boxes (``\\boxed{\\boxed{3}}``) the innermost, i.e. the last one opened."""
    found = list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))
    if not found:
        return None
    start = found[-1].end()
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip() or None
    return None  # unbalanced


def strip_units(answer: str) -> str:
    """``answer`` without a trailing unit, degree or percent sign, dollar signs and LaTeX spacing."""
    a = answer.strip().strip("$").strip()
    a = re.sub(r"\^\s*\{?\\circ\}?", "", a)
    a = a.replace("\\%", "").replace("%", "").replace("\\$", "")
    a = _SPACING.sub(" ", a).strip()
    whole = re.fullmatch(r"\\text\{(.*)\}", a)
    if whole:  # a whole answer in \text{} is its text, not a unit
        return whole.group(1).strip()
    for _ in range(2):  # "5 \text{ m} \text{ s}" style units
        a = _UNIT.sub("", a).strip()
    return a


def equivalent(given: str, truth: str) -> bool:
    """Whether two final answers are the same mathematical object (verl's PRIME math grader on
    the unit-stripped strings)."""
    from verl.utils.reward_score.prime_math import grade_answer, math_equal

    a, b = strip_units(given), strip_units(truth)
    if not a:
        return False
    if a == b or grade_answer(a, b):
        return True
    try:
        return bool(math_equal(a, b, timeout=True))
    except Exception:  # sympy on arbitrary model output: any failure is "not shown equal"
        return False


def score_boxed(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response's last ``\\boxed{}`` is equivalent to the ground truth, else 0.0."""
    given = last_boxed(solution_str)
    return float(given is not None and equivalent(given, str(ground_truth)))


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """verl's reward-function signature: the suite's sets here, every other data source by verl."""
    if data_source in SUITE_SOURCES:
        return score_boxed(solution_str, ground_truth)
    from verl.utils.reward_score import default_compute_score

    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


def correct(score) -> bool:
    """Whether a score (a number, or verl's dict with ``score``) says the answer is right: > 0."""
    value = score.get("score", 0.0) if isinstance(score, dict) else score
    return float(value) > 0


__all__ = ["SUITE_SOURCES", "compute_score", "correct", "equivalent", "last_boxed", "score_boxed", "strip_units"]
