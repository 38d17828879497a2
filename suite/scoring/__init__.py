"""Graders: which grader scores each data source, and the grading itself, safe and in parallel.

A grader is a registry entry (`GRADERS`): its name and version go into every eval record and MLflow run
beside the score it produced. Each data source the suite writes or routes is mapped to one grader
(`SOURCES`, `grader_for`); any other data source is refused, never handed to a default that might run
what the model wrote (verl's ``default_compute_score`` sends unknown code sets to a code runner).

- ``suite-math-verify`` (suite.scoring.math_equal): the boxed math sets (MATH / MATH-500, AIME and AMC in
  the boxed template, Minerva-Math, OlympiadBench, OpenR1-Math, NuminaMath's sources). It parses the
  model's LaTeX with a CAS, so it runs only in the sealed worker pool of suite.scoring.sandbox.
- ``verl-gsm8k`` and ``verl-math-dapo``: verl's own scorers for GSM8K's ``####`` line and DAPO's
  ``Answer:`` line, kept because they are the papers' (FlashRL's GSM8K script, DAPO's recipe). Both
  compare strings with regular expressions and run nothing, so they run in the caller.
- ``suite-choice`` (suite.scoring.choice): the option letter of ARC-Challenge, GPQA and MMLU-Pro answers;
  text only, in the caller.
- ``suite-code`` (suite.scoring.code): LiveCodeBench's generated code run on its tests, each run in a child
  process of its own with resource limits, no network and an audit hook; started from the caller.
- ``verl-prime-math``: verl 0.9.1's PRIME math grader, which ``eval``-s parts of the answer; routed from no
  data source, kept only to be measured against (benchmarks/grader_agreement.py), and only in the sandbox.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import threading
from dataclasses import dataclass
from importlib import metadata


class UnknownSource(ValueError):
    """A data source no grader is registered for."""


@dataclass(frozen=True)
class Grader:
    name: str
    module: str  # where ``function(response, ground_truth)`` lives
    function: str
    sandboxed: bool  # parses model text with a CAS: runs only in suite.scoring.sandbox's sealed workers
    package: str  # the distribution whose version is the grader's version
    about: str

    def version(self) -> str:
        if self.name == "suite-math-verify":
            from suite.scoring.math_equal import version

            return version()
        if self.module.startswith("suite."):  # the suite's own code: its version
            return f"suite {metadata.version('suite')}"
        return f"{self.package} {metadata.version(self.package)}"

    def label(self) -> str:
        """``name (version)``: what a record says produced a score."""
        return f"{self.name} ({self.version()})"


GRADERS: dict[str, Grader] = {g.name: g for g in (
    Grader("suite-math-verify", "suite.scoring.math_equal", "score", True, "math-verify",
           "the last \\boxed{} answer: exact plain numbers, then Math-Verify's LaTeX equivalence"),
    Grader("verl-gsm8k", "verl.utils.reward_score.gsm8k", "compute_score", False, "verl",
           "the number after GSM8K's '####' (verl's scorer, FlashRL's GSM8K protocol)"),
    Grader("verl-math-dapo", "verl.utils.reward_score.math_dapo", "compute_score", False, "verl",
           "DAPO's 'Answer:' line, normalised and compared as a string (+1 / -1)"),
    Grader("suite-choice", "suite.scoring.choice", "score", False, "suite",
           "the option letter of the last \\boxed{} or 'answer is (X)' (ARC-c, GPQA, MMLU-Pro); text only"),
    Grader("suite-code", "suite.scoring.code", "score", False, "suite",
           "the last ```python block run on every test in a sandboxed child (LiveCodeBench); 1 when all pass"),
    Grader("verl-prime-math", "suite.scoring.prime", "score", True, "verl",
           "verl 0.9.1's PRIME math grader: for comparison only (it eval()s answers; sandboxed)"),
)}

# data_source -> grader (exact names; `PREFIXES` for families)
SOURCES: dict[str, str] = {
    "openai/gsm8k": "verl-gsm8k",
    "math_dapo": "verl-math-dapo", "math": "verl-math-dapo", "math_dapo_reasoning": "verl-math-dapo",
    **{s: "suite-math-verify" for s in (
        "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
        "minerva_math", "olympiadbench", "openr1_math",
        "numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc", "numina_cn_k12",
        "numina_olympiads")},
    **{s: "suite-choice" for s in ("arc-c", "gpqa", "mmlu-pro")},
    "livecodebench": "suite-code",
}
PREFIXES: dict[str, str] = {"aime": "verl-math-dapo"}  # verl reads every aime* source with DAPO's scorer


def grader_for(data_source: str) -> Grader:
    """The grader of ``data_source``; `UnknownSource` naming the known ones otherwise."""
    name = SOURCES.get(data_source) or next((g for p, g in PREFIXES.items() if data_source.startswith(p)), None)
    if name is None:
        known = ", ".join(sorted(SOURCES)) + ", " + ", ".join(f"{p}*" for p in PREFIXES)
        raise UnknownSource(f"data_source {data_source!r} has no grader; the graded ones are {known}")
    return GRADERS[name]


@functools.lru_cache(maxsize=None)
def _function(grader: Grader):
    return getattr(importlib.import_module(grader.module), grader.function)


_sandbox = None
_sandbox_lock = threading.Lock()


def grading_pool():
    """This process's sealed grading pool (started on first use, one worker per core up to 8, or
    $SUITE_GRADING_WORKERS; closed at exit)."""
    global _sandbox
    with _sandbox_lock:
        if _sandbox is None:
            from suite.scoring.sandbox import Sandbox

            _sandbox = Sandbox(tuple(g.module for g in GRADERS.values() if g.sandboxed and g.package != "verl"))
            atexit.register(_sandbox.close)
        return _sandbox


def grade_many(items: list[tuple[str, str, str]], grader: str | None = None) -> list:
    """Each (data_source, response, ground_truth) graded by its source's grader (or by ``grader``, a
    `GRADERS` name): the grader's own result (1.0 / 0.0; verl-math-dapo's dict with ``score`` +1 / -1).
    Sandboxed graders run in parallel over this process's pool."""
    chosen = [GRADERS[grader] if grader else grader_for(ds) for ds, _, _ in items]
    out: list = [None] * len(items)
    boxed = [i for i, g in enumerate(chosen) if g.sandboxed]
    for i, g in enumerate(chosen):
        if not g.sandboxed:
            out[i] = _function(g)(items[i][1], str(items[i][2]))
    if boxed:
        pool = grading_pool() if all(chosen[i].package != "verl" for i in boxed) else _comparison_sandbox()
        scores = pool.score([(chosen[i].module, chosen[i].function, items[i][1], str(items[i][2])) for i in boxed])
        for i, s in zip(boxed, scores):
            out[i] = s
    return out


@functools.lru_cache(maxsize=1)
def _comparison_sandbox():
    from suite.scoring.sandbox import Sandbox

    pool = Sandbox(tuple(g.module for g in GRADERS.values() if g.sandboxed))
    atexit.register(pool.close)
    return pool


def grade(data_source: str, response: str, ground_truth) -> float | dict:
    """One response graded (verl's reward-function call); see `grade_many`."""
    return grade_many([(data_source, response, str(ground_truth))])[0]


def correct(score) -> bool:
    """Whether a grader's result says the answer is right: > 0 (a number, or verl's dict's ``score``)."""
    value = score.get("score", 0.0) if isinstance(score, dict) else score
    return float(value) > 0


__all__ = ["GRADERS", "Grader", "SOURCES", "UnknownSource", "correct", "grade", "grade_many", "grader_for",
           "grading_pool"]
