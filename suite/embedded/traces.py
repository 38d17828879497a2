"""Reasoning traces of the synthetic tasks: the example type, checked equations, answers, flaws.

The format (suite.embedded.tasks explains why): one ``a<op>b=r`` equation per reasoning step,
each followed by ``;``, then ``#`` and the final answer (``"7*3=21;12+21=33;#33"``). Every value
is a non-negative integer <= ``MAX_VALUE``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from suite.embedded.tokenizer import EOS, PAD

MAX_VALUE = 999  # bound on every operand, intermediate result and answer (at most 3 digits)
ANSWER_MARKER = "#"  # the final answer follows the last marker of a response
STEP_SEP = ";"  # ends every step equation of a trace

Step = tuple[int, str, int, int]  # (a, op, b, result) of one equation "a<op>b=result"


@dataclass(frozen=True)
class Example:
    """One task instance: ``prompt`` is the model input, ``response`` the target trace
    (intermediate equations, then ``#answer``; no ``<eos>``), ``answer`` the integer answer as
    a decimal string."""

    prompt: str
    response: str
    answer: str


@dataclass(frozen=True)
class Level:
    """The knobs of one difficulty level of one task."""

    n_steps: int  # reasoning steps = equations in the trace (arith: operations)
    lo: int  # smallest number drawn for the prompt
    hi: int  # largest number drawn for the prompt
    paren_prob: float  # arith only: probability of one parenthesised sub-expression
    max_prompt_chars: int  # longest prompt allowed (chars = tokens); longer draws are rejected
    max_response_chars: int  # longest trace allowed, answer included, <eos> excluded


class Reject(Exception):
    """A draw broke a constraint (negative, too large, inexact division, too long): redraw."""


def apply_op(a: int, op: str, b: int) -> Step:
    """One checked equation; raises ``Reject`` unless the result is an integer in range."""
    if op == "+":
        r = a + b
    elif op == "-":
        r = a - b
    elif op == "*":
        r = a * b
    elif op == "/":
        if b == 0 or a % b:
            raise Reject
        r = a // b
    else:
        raise ValueError(f"unknown operator {op!r}")
    if not 0 <= r <= MAX_VALUE:
        raise Reject
    return (a, op, b, r)


def format_trace(steps: list[Step]) -> str:
    """``[(7,'*',3,21), (12,'+',21,33)]`` -> ``"7*3=21;12+21=33;#33"``."""
    eqs = "".join(f"{a}{op}{b}={r}{STEP_SEP}" for a, op, b, r in steps)
    return f"{eqs}{ANSWER_MARKER}{steps[-1][3]}"


_ANSWER_RE = re.compile(r"-?[0-9]{1,12}")  # ASCII digits only (str.isdigit admits "²")


def extract_answer(response_text: str) -> int | None:
    """The integer after the last ``#`` of ``response_text`` (text from the first ``<eos>`` or
    ``<pad>`` on is ignored), or ``None`` when there is none or it is followed by junk."""
    if not isinstance(response_text, str):
        return None
    for stop in (EOS, PAD):
        response_text = response_text.split(stop, 1)[0]
    _, marker, tail = response_text.rpartition(ANSWER_MARKER)
    if not marker:
        return None
    tail = tail.strip()
    if not _ANSWER_RE.fullmatch(tail):
        return None
    return int(tail)


_EQ_RE = re.compile(r"^([0-9]+)([-+*/])([0-9]+)=([0-9]+)$")


def flawed_response(response: str, op: str) -> str:
    """The trace a *flawed teacher* writes: when the last equation of ``response`` applies
    ``op``, it stops one step short and answers with the value it has so far (the previous
    step's result, or the first operand of a one-step trace); any other trace is unchanged.

    Why: the papers start RL from pretrained models that know the procedure but make
    systematic, prompt-dependent mistakes, which an exact-answer reward can correct. A small
    model warm-started on clean traces only makes the errors of under-training (arithmetic
    facts it has not yet memorised), which a sparse reward teaches far more slowly than SFT:
    after a clean warm start of the tiny model, RL left held-out accuracy flat at lr 3e-5 and
    lowered it at lr 1e-4, while with this teacher (the default, ``warm_start.flaw_op=auto``)
    the default run's RL raises it (docs/bench.md, "Measurements behind the code").
    A warm start that imitates this teacher on part of the data gives the policy one
    learnable, generalising blind spot ("skip the final ``+``"), as a base model has.

    ``"7*3=21;12+21=33;#33"`` with op ``"+"`` -> ``"7*3=21;#21"``; ``"3+4=7;#7"`` -> ``"#3"``.
    """
    if not op:
        return response
    eqs = response.rpartition(ANSWER_MARKER)[0].split(STEP_SEP)[:-1]  # ["7*3=21", "12+21=33"]
    parsed = [_EQ_RE.match(e) for e in eqs]
    if not parsed or any(m is None for m in parsed):
        raise ValueError(f"not a trace of equations: {response!r}")
    if parsed[-1].group(2) != op:
        return response
    so_far = parsed[-2].group(4) if len(parsed) > 1 else parsed[0].group(1)
    return "".join(e + STEP_SEP for e in eqs[:-1]) + ANSWER_MARKER + so_far
