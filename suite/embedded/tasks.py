"""Verifiable synthetic tasks of the embedded backend: multi-step arithmetic and word problems.

Why: the papers train on GSM8K / AIME, where reward is an exact-answer check on a reasoning
trace. At CPU scale we need the same structure (a prompt, a multi-step trace, a final answer a
program can check) with a prompt space a ~3M-parameter model can learn in minutes, generated
from a seed so no data is downloaded and every run can rebuild its splits exactly.

Trace format (the ``response`` of an ``Example``): one ``a<op>b=r`` equation per reasoning step,
in evaluation order, each followed by ``;``, then ``#`` and the final answer::

    prompt   "12+7*3="                               (task "arith")
    response "7*3=21;12+21=33;#33"

    prompt   "Ann has 5 pens, buys 3, loses 2, doubles them. Pens?"   (task "word")
    response "5+3=8;8-2=6;6*2=12;#12"

``<op>`` is one of ``+ - * /`` (``/`` is exact division, word problems only). Every value in a
trace is a non-negative integer <= ``MAX_VALUE``. In training sequences the tokenizer's
``<eos>`` follows the response: the trainer and warm start append it, the rollout engine stops
on it; ``Example.response`` itself never contains it.

Reward: ``Task.verify`` reads the text after the LAST ``#`` (up to ``<eos>``), strips
whitespace, and compares it as an integer to the answer; anything else (no ``#``, empty,
trailing junk such as ``#33.`` or ``#33x``) is simply wrong. Intermediate steps are not
checked, as in GSM8K-style outcome rewards (QuRL/QaRL use exact-answer rewards).

Difficulty: ``ARITH_LEVELS`` / ``WORD_LEVELS`` below hold every knob (steps, number range,
parentheses, length budgets) in one place. The default RL run samples at most 32 new tokens, so
at the default difficulty (2 for both tasks) every response fits 28 characters and
``Task.max_response_tokens`` (response + ``<eos>``) is 29.

Splits: a prompt belongs to "train" or "eval" by a keyed SHA-256 of its text (never Python's
salted ``hash``), so held-out prompts are never trained on, whatever ``n`` or seed. An eval set
is ``n`` distinct prompts (an error if the split has fewer); a train pool is ``n`` independent
draws, so it may repeat prompts when the space is small (see ``make_split``).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from suite.config import FLAW_OPS
from suite.embedded.traces import (  # noqa: F401  (re-exported: the tasks' public names)
    ANSWER_MARKER,
    MAX_VALUE,
    STEP_SEP,
    Example,
    Level,
    Reject,
    Step,
    apply_op,
    extract_answer,
    flawed_response,
    format_trace,
)
from suite.embedded.word_problems import WORD_LEVELS, WORD_TEMPLATES

TASK_NAMES: tuple[str, ...] = ("arith", "word")
SPLITS: tuple[str, ...] = ("train", "eval")
DEFAULT_DIFFICULTY: dict[str, int] = {"arith": 2, "word": 2}

EVAL_FRACTION = 0.2  # share of the prompt space held out for evaluation (by prompt hash)
_MAX_SAMPLE_TRIES = 10_000  # rejection-sampling attempts before declaring a level impossible

# Arithmetic: difficulty d has d+1 operands (d operations). Default 2: "12+7*3=".
ARITH_LEVELS: dict[int, Level] = {
    1: Level(n_steps=1, lo=0, hi=12, paren_prob=0.0, max_prompt_chars=8, max_response_chars=16),
    2: Level(n_steps=2, lo=0, hi=12, paren_prob=0.0, max_prompt_chars=12, max_response_chars=28),
    3: Level(n_steps=3, lo=0, hi=20, paren_prob=0.5, max_prompt_chars=20, max_response_chars=48),
    4: Level(n_steps=4, lo=0, hi=30, paren_prob=0.5, max_prompt_chars=28, max_response_chars=64),
}

LEVELS: dict[str, dict[int, Level]] = {"arith": ARITH_LEVELS, "word": WORD_LEVELS}  # task -> difficulty -> level

# Distinct held-out prompts at the levels whose prompt space is small enough for `task.n_eval` to
# exceed it: make_split("eval") can return at most this many. Counted by enumerating every prompt
# (tests/embedded/test_tasks.py recounts them). The other levels' spaces are too large to enumerate
# (100k draws repeat fewer than 20% of their prompts): compose does not bound n_eval there, and
# make_split still refuses an n beyond the split.
HELD_OUT_PROMPTS: dict[tuple[str, int], int] = {("arith", 1): 75, ("arith", 2): 2917}

# The operators that end a trace of each task, at every difficulty: the ones a flawed teacher can
# skip (flawed_response acts on a trace's last equation). Arithmetic has no "/".
FINAL_OPS: dict[str, str] = {"arith": "+-*", "word": "+-*/"}


# ---------------------------------------------------------------------------------------------
# arith: expressions over + - * with precedence (and parentheses from difficulty 3)
# ---------------------------------------------------------------------------------------------


def _arith_problem(rng: random.Random, lvl: Level) -> tuple[str, list[Step]]:
    n = lvl.n_steps + 1
    toks: list[str] = [str(rng.randint(lvl.lo, lvl.hi))]
    for _ in range(n - 1):
        toks += [rng.choice("+-*"), str(rng.randint(lvl.lo, lvl.hi))]
    if n >= 3 and rng.random() < lvl.paren_prob:
        # wrap operands i..j (2 <= j-i+1 < n) in parentheses; operand k sits at toks[2k]
        i = rng.randrange(n - 1)
        j = rng.randint(i + 1, n - 1 if i > 0 else n - 2)
        toks.insert(2 * j + 1, ")")
        toks.insert(2 * i, "(")
    steps = _evaluate(toks)
    return "".join(toks) + "=", steps


def _evaluate(toks: list[str]) -> list[Step]:
    """Recursive-descent evaluation of an infix token list, recording one step per operation
    in evaluation order (parentheses first, then ``*``, then ``+``/``-``, left to right)."""
    steps: list[Step] = []
    pos = 0

    def atom() -> int:
        nonlocal pos
        tok = toks[pos]
        pos += 1
        if tok == "(":
            v = expr()
            assert toks[pos] == ")"
            pos += 1
            return v
        return int(tok)

    def term() -> int:
        nonlocal pos
        v = atom()
        while pos < len(toks) and toks[pos] == "*":
            pos += 1
            steps.append(apply_op(v, "*", atom()))
            v = steps[-1][3]
        return v

    def expr() -> int:
        nonlocal pos
        v = term()
        while pos < len(toks) and toks[pos] in "+-":
            op = toks[pos]
            pos += 1
            steps.append(apply_op(v, op, term()))
            v = steps[-1][3]
        return v

    expr()
    assert pos == len(toks)
    return steps


_TEMPLATES = {"arith": (_arith_problem,), "word": WORD_TEMPLATES}


# ---------------------------------------------------------------------------------------------
# Task, verification, splits
# ---------------------------------------------------------------------------------------------

# "auto": the operator that ends about a third of the traces at the default difficulty (2):
# arith "-" (33%; "+" ends 54%), word "+" (16%; "-" ends 62%).
DEFAULT_FLAW_OP: dict[str, str] = {"arith": "-", "word": "+"}


def flaw_ops(task_name: str) -> tuple[str, ...]:
    """The ``warm_start.flaw_op`` values of task ``task_name``: auto, none, and the operators
    that end its traces (an operator that never does would leave the teacher clean)."""
    return tuple(op for op in FLAW_OPS if len(op) > 1 or op in FINAL_OPS[task_name])


def resolve_flaw_op(task_name: str, flaw_op: str) -> str:
    """``warm_start.flaw_op`` -> the operator the flawed teacher skips ("" for none)."""
    if flaw_op not in flaw_ops(task_name):
        raise ValueError(f"flaw_op={flaw_op!r} for task {task_name!r}; allowed: {flaw_ops(task_name)}")
    if flaw_op == "auto":
        return DEFAULT_FLAW_OP[task_name]
    return "" if flaw_op == "none" else flaw_op


@dataclass(frozen=True)
class Task:
    """A verifiable task at one difficulty: draws examples, checks answers, states its budgets."""

    name: str
    difficulty: int
    level: Level

    @property
    def n_steps(self) -> int:
        """Equations in every trace of this task at this difficulty."""
        return self.level.n_steps

    @property
    def max_prompt_chars(self) -> int:
        return self.level.max_prompt_chars

    @property
    def max_response_chars(self) -> int:
        """Longest response trace (answer included, ``<eos>`` excluded); chars = tokens."""
        return self.level.max_response_chars

    @property
    def max_response_tokens(self) -> int:
        """New tokens a rollout needs to finish any target trace: the trace plus ``<eos>``.
        A ``max_new_tokens`` below this truncates correct answers."""
        return self.level.max_response_chars + 1

    def sample(self, rng: random.Random) -> Example:
        """One example drawn with ``rng`` (rejection sampling enforces the level's bounds)."""
        # Pick the template first and redraw within it, so rejections (e.g. no exact divisor)
        # do not shift the mix of templates towards the easy-to-satisfy ones.
        generate = rng.choice(_TEMPLATES[self.name])
        for _ in range(_MAX_SAMPLE_TRIES):
            try:
                prompt, steps = generate(rng, self.level)
            except Reject:
                continue
            response = format_trace(steps)
            if (
                len(prompt) <= self.level.max_prompt_chars
                and len(response) <= self.level.max_response_chars
            ):
                return Example(prompt=prompt, response=response, answer=str(steps[-1][3]))
        raise RuntimeError(
            f"task {self.name!r} difficulty {self.difficulty}: {generate.__name__} gave no valid "
            f"example in {_MAX_SAMPLE_TRIES} draws; the level's bounds are inconsistent: "
            f"{self.level}"
        )

    def verify(self, response_text: str, example: Example) -> bool:
        """Exact-answer reward: True iff the integer after the last ``#`` equals the answer.
        Never raises; malformed text is False."""
        got = extract_answer(response_text)
        return got is not None and got == int(example.answer)


def make_task(name: str, difficulty: int) -> Task:
    """The task ``name`` ("arith" | "word") at ``difficulty``: one of ``ARITH_LEVELS`` or
    ``WORD_LEVELS``."""
    if name not in LEVELS:
        raise ValueError(f"unknown task {name!r}; allowed: {', '.join(TASK_NAMES)}")
    levels = LEVELS[name]
    if difficulty not in levels:
        raise ValueError(
            f"task {name!r} has no difficulty {difficulty!r}; allowed: {sorted(levels)}"
        )
    return Task(name=name, difficulty=difficulty, level=levels[difficulty])


def prompt_split(prompt: str) -> str:
    """"train" or "eval" for ``prompt``: a SHA-256 of the text, stable across processes and
    machines, so a prompt has one split forever (``EVAL_FRACTION`` of prompts are "eval")."""
    digest = hashlib.sha256(b"suite.tasks.split:" + prompt.encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:8], "big") < EVAL_FRACTION * 2**64 else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")


def sample_split(task: Task, rng: random.Random, split: str) -> Example:
    """One example of ``split``, drawn with ``rng``: an endless stream of (possibly repeated)
    examples that never crosses splits, for callers that want more than ``make_split`` gives."""
    _check_split(split)
    while True:
        ex = task.sample(rng)
        if prompt_split(ex.prompt) == split:
            return ex


def make_split(task: Task, n: int, seed: int, split: str, *, allow_fewer: bool = False) -> list[Example]:
    """``n`` examples of ``split`` ("train" | "eval"), deterministic in (task, difficulty, seed,
    split). Train and eval prompts are disjoint by ``prompt_split`` for every n and seed.

    "eval": ``n`` distinct prompts, so each held-out prompt counts once in an accuracy. When
    the split has fewer than ``n`` prompts (arith difficulty 1 holds out 75 of its 429), this
    raises a ValueError saying how many exist, or with ``allow_fewer`` returns all of them.
    "train": ``n`` independent draws from the train split, i.e. the task's distribution with
    held-out prompts removed. Repeats are allowed: they are rare in large prompt spaces and
    unavoidable in small ones (arith difficulty 2 has ~11.5k train prompts), and the pool costs
    O(n) draws whatever the space.
    """
    _check_split(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    # random.Random seeds a str through SHA-512: stable across processes, unlike hash().
    rng = random.Random(f"suite.tasks:{task.name}:{task.difficulty}:{seed}:{split}")
    if split == "train":
        return [sample_split(task, rng, "train") for _ in range(n)]
    out: list[Example] = []
    seen: set[str] = set()
    # Declare the split exhausted after `patience` draws in a row without a new prompt. If the
    # split holds fewer than n prompts, drawn about uniformly (arith: exactly), each unseen one
    # has probability > 1/n per draw, so it is missed with probability < (1 - 1/n)^(20n) < e^-20.
    patience, stale = 500 + 20 * n, 0
    while len(out) < n:
        ex = sample_split(task, rng, split)
        if ex.prompt in seen:
            stale += 1
            if stale >= patience:
                if allow_fewer:
                    return out
                raise ValueError(
                    f"task {task.name!r} difficulty {task.difficulty}: found only {len(out)} "
                    f"distinct {split!r} prompts (asked for {n}; no new one in {patience} "
                    f"draws): the prompt space is too small. Use a smaller n or a higher "
                    f"difficulty."
                )
            continue
        stale = 0
        seen.add(ex.prompt)
        out.append(ex)
    return out
