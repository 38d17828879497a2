"""verl 0.9.1's PRIME math grader (``verl.utils.reward_score.prime_math``), the grader the suite routed
Minerva, OlympiadBench, OpenR1 and AMC to before it had its own. Its pi and matrix branches ``eval()``
the answer, so it runs only in suite.scoring.sandbox's sealed workers, and only to be measured against
(benchmarks/grader_agreement.py); no data source is graded by it."""

from __future__ import annotations


def warm() -> None:
    score("\\boxed{1}", "1")


def score(solution_str: str, ground_truth: str) -> float:
    from verl.utils.reward_score import prime_math

    return float(bool(prime_math.compute_score(solution_str, ground_truth)[0]))  # (correct, format, answer)
