"""suite.verl.reward: verl's reward-function door to suite.scoring (what verl runs and `suite eval` grades
with). The graders' own cases are in tests/scoring/test_graders.py."""

from __future__ import annotations

import pytest

from suite.scoring import UnknownSource
from suite.verl.reward import SUITE_SOURCES, compute_score

pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")
pytestmark = pytest.mark.verl


def test_verls_scorers_stay_verls_and_the_boxed_sets_are_the_suites():
    from verl.utils.reward_score import default_compute_score

    for ds, response, truth in (("openai/gsm8k", "#### 72", "72"), ("openai/gsm8k", "#### 71", "72"),
                                ("aime2024", "Answer: 72", "72"), ("aime2024", "Answer: 27", "72")):
        assert compute_score(ds, response, truth) == default_compute_score(ds, response, truth)
    for ds in SUITE_SOURCES + ("HuggingFaceH4/MATH-500", "numina_amc_aime"):
        assert compute_score(ds, "so \\boxed{0.5}", "\\frac{1}{2}", {"split": "test"}) == 1.0
        assert compute_score(ds, "so \\boxed{5}", "500") == 0.0  # verl's PRIME grader says 1.0 (a percent rule)


def test_a_source_without_a_grader_is_refused_not_sent_to_verls_default():
    for ds in ("codecontests", "no-such-source"):  # verl would run codecontests' code, or raise NotImplementedError
        with pytest.raises(UnknownSource, match=f"data_source '{ds}' has no grader"):
            compute_score(ds, "\\boxed{1}", "1")
