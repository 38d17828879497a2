"""suite.verl.reward: the scorer of the held-out sets verl has no scorer for (Minerva-Math,
OlympiadBench, OpenR1-Math), on the published answer forms, equivalent forms and the known traps
(units, nested \\boxed{}, fractions against decimals, rounding), each against a hand-decided verdict."""

from __future__ import annotations

import pytest

from suite.verl.reward import compute_score, correct, last_boxed, strip_units

pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")
pytestmark = pytest.mark.verl

# (response, ground truth as the published file has it, right?)
CASES = [
    # the published forms, answered the same way
    ("\\boxed{7}", "7", True),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ("\\boxed{4.5 \\times 10^{-7}}", "4.5 \\times 10^{-7}", True),
    # equivalent forms
    ("\\boxed{0.5}", "\\frac{1}{2}", True),  # a fraction as its exact decimal
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}", True),
    ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}", True),
    ("\\boxed{3.00}", "3", True),
    ("\\boxed{(1, 2)}", "(1,2)", True),
    ("\\boxed{4.5\\times10^{-7}}", "4.5 \\times 10^{-7}", True),
    # units: stripped from either side, never a reason to fail or to pass
    ("\\boxed{5 \\text{ cm}}", "5", True),
    ("\\boxed{3\\,\\mathrm{m/s}}", "3", True),
    ("\\boxed{30^\\circ}", "30", True),
    ("\\boxed{25\\%}", "25", True),
    ("\\boxed{6 \\text{ cm}}", "5", False),
    # nested boxes: the innermost content
    ("\\boxed{\\boxed{3}}", "3", True),
    ("first \\boxed{4}, then \\boxed{\\boxed{3}}", "3", True),
    # traps that must stay wrong
    ("\\boxed{1.33}", "\\frac{4}{3}", False),  # a rounded decimal is not the fraction
    ("\\boxed{\\frac{1}{3}}", "0.5", False),
    ("\\boxed{-7}", "7", False),
    ("the answer is 7", "7", False),  # no \boxed{}: not graded as right
    ("\\boxed{}", "7", False),
    ("\\boxed{7", "7", False),  # unbalanced
]


@pytest.mark.parametrize("data_source", ["minerva_math", "olympiadbench", "openr1_math"])
@pytest.mark.parametrize("response, truth, right", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_suite_sources_grade_the_forms_and_traps(data_source, response, truth, right):
    score = compute_score(data_source, f"Let me think. {response}", truth)
    assert score == (1.0 if right else 0.0), (data_source, response, truth)


def test_helpers_on_hand_made_strings():
    assert last_boxed("a \\boxed{x^{2}} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\fbox{5}") == "5" and last_boxed("none") is None
    assert strip_units("$5 \\text{ cm}$") == "5" and strip_units("3\\,\\mathrm{m/s^2}") == "3"
    assert strip_units("\\text{yes}") == "yes"
    assert correct({"score": -1.0, "acc": False}) is False and correct({"score": 1.0}) is True and correct(1.0)


def test_other_sources_are_verls_own():
    from verl.utils.reward_score import default_compute_score

    for ds, response, truth in (("openai/gsm8k", "#### 72", "72"), ("aime2024", "Answer: 72", "72"),
                                ("HuggingFaceH4/MATH-500", "\\boxed{\\frac12}", "\\frac{1}{2}")):
        assert compute_score(ds, response, truth) == default_compute_score(ds, response, truth)
    with pytest.raises(NotImplementedError):
        compute_score("no-such-source", "\\boxed{1}", "1")
