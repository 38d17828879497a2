"""The suite's answer scorer in verl's reward-function signature, `compute_score(data_source,
solution_str, ground_truth, extra_info)`: what verl runs as ``reward.custom_reward_function`` (set by the
translator) and what ``suite eval`` grades with, so training reward and evaluation score one way.

It is a thin door to suite.scoring: each data source's registered grader (``suite-math-verify`` for the
boxed math sets, verl's own GSM8K and DAPO scorers for theirs), the boxed math graded in a sealed worker
pool that cannot write, connect, start a program or run text as code. A data source no grader is
registered for is refused (`suite.scoring.UnknownSource`), never handed to verl's
``default_compute_score``, which would send code sets to a code runner and numina_* to a grader that
``eval``-s answers. verl calls this from several threads at once; the pool grades them in parallel.

Nothing here imports verl at import time: the module is loaded by path in verl's reward workers.
"""

from __future__ import annotations

from suite.scoring import correct, grade, grader_for
from suite.scoring.answers import last_boxed, strip_units

# data_source of the held-out sets suite.verl.data writes that verl has no scorer of its own for
SUITE_SOURCES = ("minerva_math", "olympiadbench", "openr1_math")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """verl's reward-function signature: the data source's registered grader (suite.scoring)."""
    return grade(str(data_source), str(solution_str), ground_truth)


__all__ = ["SUITE_SOURCES", "compute_score", "correct", "grader_for", "last_boxed", "strip_units"]
