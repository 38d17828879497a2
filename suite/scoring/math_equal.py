"""Whether a boxed answer equals the ground truth: exact plain numbers first, then Hugging Face's
Math-Verify on the LaTeX (https://github.com/huggingface/Math-Verify, pinned in pyproject.toml).

Math-Verify is asked only through its LaTeX extraction (``LatexExtractionConfig``): latex2sympy2's
ANTLR parser builds sympy objects from the text as data. Its ``ExprExtractionConfig`` is never used,
because it hands the text to ``sympy.parse_expr``, i.e. Python's ``eval`` (verl 0.9.1's own
``reward_score/math_verify.py`` uses it on model output). Its time limits (``signal.alarm``) apply in
the main thread of a process, which is where suite.scoring.sandbox runs this module; elsewhere it runs
without them and the sandbox's own limit applies.

What it accepts and refuses, on the answer inside the last ``\\boxed{}``:

- plain numbers compare exactly (``7,425,000`` = ``7425000``, ``3.00`` = ``3``, ``\\frac12`` = ``0.5``);
  a rounded decimal matches a fraction at 6 places (``0.0833333`` = ``1/12``, ``1.33`` != ``4/3``);
  never a relative tolerance (123457 != 123456) and never a percent rule (5 != 500, 0.05 != 5);
- units, degrees and percent signs are dropped from both sides, never applied;
- everything else is Math-Verify's symbolic equality: ``2\\sqrt3`` = ``\\sqrt{12}``, sets and
  unordered lists in any order, intervals (``x \\in [-2,7]`` = ``[-2,7]``), labelled tuples
  (``(3,2)`` = ``(p,q)=(3,2)``), while ``x+\\frac27`` != ``\\frac{x+2}{7}`` and ``11a+c`` != ``7 = 11a+c``;
- a set answer may come as several boxes (``\\boxed{1}, \\boxed{3}``) when the truth is a list.
"""

from __future__ import annotations

import functools
from importlib import metadata

from suite.scoring.answers import boxes, numbers_equal, plain_number, strip_units

NAME = "suite-math-verify"
PARSE_TIMEOUT_S = 5  # Math-Verify's own limits per parse / per comparison (signal.alarm; main thread only)
VERIFY_TIMEOUT_S = 5


def version() -> str:
    """This grader's version: the Math-Verify and latex2sympy2 releases it runs on."""
    return (f"math-verify {metadata.version('math-verify')}, "
            f"latex2sympy2_extended {metadata.version('latex2sympy2_extended')}")


def _timeouts() -> tuple[int | None, int | None]:
    import threading

    main = threading.current_thread() is threading.main_thread()
    return (PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S) if main else (None, None)


@functools.lru_cache(maxsize=1)
def _config():
    from math_verify import LatexExtractionConfig

    return [LatexExtractionConfig(boxed_match_priority=0)]


def _parse(latex: str):
    import logging

    from math_verify import parse

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice, per call
    return parse(f"${latex}$", _config(), parsing_timeout=_timeouts()[0])


@functools.lru_cache(maxsize=4096)
def _parsed_truth(truth: str):
    return _parse(truth)  # a benchmark's few hundred truths, each parsed once per process


def equivalent(given: str, truth: str) -> bool:
    """Whether the answer ``given`` is the same mathematical object as ``truth`` (both answer strings,
    not whole responses)."""
    a, b = strip_units(given), strip_units(truth)
    if not a or not b:
        return False
    if a == b or a.replace(" ", "") == b.replace(" ", ""):
        return True
    x, y = plain_number(a), plain_number(b)
    if x is not None and y is not None:
        return numbers_equal(x, y)
    from math_verify import verify

    gold, pred = _parsed_truth(b), _parse(a)
    if not gold or not pred:
        return False
    try:
        return bool(verify(gold, pred, timeout_seconds=_timeouts()[1]))
    except Exception:  # noqa: BLE001 - sympy on arbitrary model output: any failure is "not shown equal"
        return False


def _is_list(truth: str) -> bool:
    """A comma at the top level, or a set ``\\{a, b\\}``: an answer several boxes may give together."""
    if truth.startswith("\\{") and truth.endswith("\\}"):
        truth = truth[2:-2]
    depth = 0
    for ch in truth:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            return True
    return False


def score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response's last ``\\boxed{}`` (or, for a list truth, its boxes together) is
    equivalent to ``ground_truth``, else 0.0. A response without a box scores 0."""
    found = boxes(solution_str)
    if not found or not found[-1]:
        return 0.0
    truth = str(ground_truth)
    if equivalent(found[-1], truth):
        return 1.0
    if len(found) > 1 and _is_list(strip_units(truth)):
        return float(equivalent(", ".join(b for b in found if b), truth))
    return 0.0





def warm() -> None:
    """Import and exercise the parser and the comparison (the sandbox calls this before it seals a worker:
    sympy and the ANTLR parser load modules lazily on first use)."""
    for given, truth in (("\\frac{1}{2}", "0.5"), ("x^2+\\sqrt{3}", "\\sqrt{3}+x^{2}"), ("[1,2)", "\\{1,2\\}"),
                         ("(1,2)", "(a,b)=(1,2)"), ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\pi")):
        equivalent(given, truth)
__all__ = ["NAME", "equivalent", "score", "version", "warm"]
