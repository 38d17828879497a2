"""Tests of the character tokenizer and the synthetic tasks (suite.embedded.tokenizer / tasks).

The trace checks re-derive every number independently of the generator: each equation is
re-evaluated from its text, and an arithmetic prompt is evaluated by Python's own parser.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suite.embedded.tasks import (
    flawed_response,
    resolve_flaw_op,
    ARITH_LEVELS,
    DEFAULT_DIFFICULTY,
    EVAL_FRACTION,
    FINAL_OPS,
    HELD_OUT_PROMPTS,
    MAX_VALUE,
    WORD_LEVELS,
    Example,
    extract_answer,
    flaw_ops,
    make_split,
    make_task,
    prompt_split,
    sample_split,
)
from suite.embedded.tokenizer import CHARS, CharTokenizer

ALL_LEVELS = [("arith", d) for d in ARITH_LEVELS] + [("word", d) for d in WORD_LEVELS]
STEP_RE = re.compile(r"([0-9]+)([-+*/])([0-9]+)=([0-9]+)")
DEFAULT_MAX_NEW_TOKENS = 32  # the default RL run's generation budget (rollout.max_new_tokens in suite.config)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def parse_trace(response: str) -> tuple[list[tuple[int, str, int, int]], str]:
    """Split a trace into its equations and the text after '#', checking the format strictly."""
    *eqs, final = response.split(";")
    assert final.startswith("#"), response
    steps = []
    for eq in eqs:
        m = STEP_RE.fullmatch(eq)
        assert m, f"malformed step {eq!r} in {response!r}"
        steps.append((int(m[1]), m[2], int(m[3]), int(m[4])))
    return steps, final[1:]


def reference_value(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else a / b


def draw(task_name: str, difficulty: int, seed: int, n: int = 20) -> list[Example]:
    task, rng = make_task(task_name, difficulty), random.Random(seed)
    return [task.sample(rng) for _ in range(n)]


# --- tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_ids_and_specials():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 3 + len(CHARS) == len(set(CHARS)) + 3
    assert tok.encode("12+7*3=", add_bos=True, add_eos=True)[0] == tok.bos_id
    assert tok.encode("1", add_eos=True)[-1] == tok.eos_id
    ids = [tok.bos_id, *tok.encode("#33"), tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "#33"
    assert tok.decode(ids, skip_special=False) == "<bos>#33<eos><pad>"
    assert tok.encode("") == []


def test_tokenizer_errors_name_the_offender():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="'%'"):
        tok.encode("12%3")
    with pytest.raises(ValueError, match="token id 81"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError):
        tok.decode([-1])


@settings(max_examples=40, deadline=None)
@given(seed=seeds)
def test_tokenizer_round_trips_all_task_text(seed):
    tok = CharTokenizer()
    for name, d in ALL_LEVELS:
        for ex in draw(name, d, seed, n=5):
            for text in (ex.prompt, ex.response, ex.answer):
                ids = tok.encode(text)
                assert len(ids) == len(text)  # one token per character: budgets in chars hold
                assert tok.decode(ids) == text


# --- traces ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,difficulty", ALL_LEVELS)
@settings(max_examples=25, deadline=None)
@given(seed=seeds)
def test_trace_is_correct_and_verifies(name, difficulty, seed):
    task = make_task(name, difficulty)
    for ex in draw(name, difficulty, seed):
        steps, final = parse_trace(ex.response)
        # the task's own trace earns the reward, and the answer is the last step's result
        assert task.verify(ex.response, ex)
        assert final == ex.answer == str(steps[-1][3])
        # the difficulty knob fixes the number of reasoning steps
        assert len(steps) == task.n_steps
        prompt_numbers = {int(x) for x in re.findall(r"[0-9]+", ex.prompt)}
        results: set[int] = set()
        for a, op, b, r in steps:
            assert reference_value(a, op, b) == r, ex  # exact, so "/" is exact division
            assert 0 <= r <= MAX_VALUE
            # every operand is read off the prompt or is an earlier result
            # ("doubles"/"twice"/"half" -> 2, "triples" -> 3 in word problems)
            for x in (a, b):
                assert x in prompt_numbers or x in results or (name == "word" and x in (2, 3))
            results.add(r)
        assert len(ex.prompt) <= task.max_prompt_chars
        assert len(ex.response) <= task.max_response_chars
        if name == "arith":
            assert ex.prompt.endswith("=")
            assert "/" not in ex.prompt
            assert eval(ex.prompt[:-1], {"__builtins__": {}}) == int(ex.answer)  # noqa: S307


def test_splits_are_pinned():
    """Golden values: a change here changes every dataset (and invalidates warm-start caches),
    so it must be deliberate."""
    assert make_split(make_task("arith", 2), 2, seed=0, split="train") == [
        Example("10+7+5=", "10+7=17;17+5=22;#22", "22"),
        Example("8+4*4=", "4*4=16;8+16=24;#24", "24"),
    ]
    assert make_split(make_task("word", 2), 2, seed=0, split="train") == [
        Example(
            "Ivy has 7 bags of 3 apples, keeps 6, shares the rest equally among 3. Each?",
            "7*3=21;21-6=15;15/3=5;#5",
            "5",
        ),
        Example("Val has 6 boxes of 8 cards and 6 more, loses 4. Cards?",
                "6*8=48;48+6=54;54-4=50;#50", "50"),
    ]  # fmt: skip


def test_parentheses_from_difficulty_3():
    rng = random.Random(0)
    assert any("(" in make_task("arith", 3).sample(rng).prompt for _ in range(200))
    assert not any("(" in make_task("arith", 2).sample(rng).prompt for _ in range(200))


@pytest.mark.parametrize("name", ["arith", "word"])
def test_difficulty_knob_raises_steps_and_lengths(name):
    levels = sorted(ARITH_LEVELS if name == "arith" else WORD_LEVELS)
    steps, mean_len = [], []
    for d in levels:
        exs = draw(name, d, seed=1, n=300)
        steps.append({len(parse_trace(e.response)[0]) for e in exs})
        mean_len.append(sum(len(e.response) for e in exs) / len(exs))
    assert all(len(s) == 1 for s in steps)
    counts = [s.pop() for s in steps]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)
    assert mean_len == sorted(mean_len)
    if name == "word":
        assert counts == [2, 3, 4]  # GSM8K-style: 2-4 reasoning steps


def test_word_templates_all_appear():
    prompts = [e.prompt for e in draw("word", 2, seed=3, n=600)]
    for marker in ("Change?", "Each?", "years", "Left?", "boxes of", "has"):
        assert sum(marker in p for p in prompts) >= 40, marker


def test_default_difficulty_fits_the_generation_budget():
    for name, d in DEFAULT_DIFFICULTY.items():
        task = make_task(name, d)
        assert task.max_response_tokens == task.max_response_chars + 1 <= DEFAULT_MAX_NEW_TOKENS
        exs = draw(name, d, seed=7, n=2000)
        assert max(len(e.response) for e in exs) <= 28
        assert max(len(e.prompt) for e in exs) <= (80 if name == "word" else 12)


# --- verifier ----------------------------------------------------------------------------------

EX = Example(prompt="12+7*3=", response="7*3=21;12+21=33;#33", answer="33")


@pytest.mark.parametrize(
    "text",
    [
        "7*3=21;12+21=33;#33",
        "#33",
        "# 33 \n",
        "#33<eos>",
        "#33<eos>#34 junk after the end",
        "#33<pad><pad>",
        "#12;#33",  # the LAST marker counts
        "wrong steps are not checked;#33",
        "#033",
    ],
)
def test_verify_accepts(text):
    assert make_task("arith", 2).verify(text, EX)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "33",
        "7*3=21;12+21=33;",
        "#",
        "#34",
        "#-33",
        "#33#",
        "#33;",
        "#33.",
        "#33 34",
        "#3 3",
        "#33x",
        "#33;#34",
        "#+33",
        "#3.3e1",
        "#٣٣",  # non-ASCII digits
        "#33" + "0" * 5000,
        "<eos>#33",
    ],
)
def test_verify_rejects(text):
    assert not make_task("arith", 2).verify(text, EX)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=60))
def test_verify_never_raises(text):
    task = make_task("word", 2)
    assert task.verify(text, EX) in (True, False)
    assert task.verify(text + "#33", EX) == (extract_answer(text + "#33") == 33)


def test_verify_handles_non_text():
    assert not make_task("arith", 1).verify(None, EX)  # type: ignore[arg-type]


# --- splits ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,difficulty", [("arith", 2), ("word", 2), ("word", 1)])
def test_splits_are_disjoint_and_deterministic(name, difficulty):
    task = make_task(name, difficulty)
    train = make_split(task, 1000, seed=0, split="train")
    evals = make_split(task, 200, seed=0, split="eval")
    assert len(train) == 1000 and len(evals) == 200
    assert len({e.prompt for e in evals}) == 200  # held-out prompts are distinct
    assert not {e.prompt for e in train} & {e.prompt for e in evals}
    assert all(prompt_split(e.prompt) == "train" for e in train)
    assert all(prompt_split(e.prompt) == "eval" for e in evals)
    # another seed draws other prompts but still never crosses splits
    train1 = make_split(task, 1000, seed=1, split="train")
    assert train1 != train
    assert not {e.prompt for e in train1} & {e.prompt for e in evals}
    assert make_split(task, 1000, seed=0, split="train") == train
    assert make_split(task, 200, seed=0, split="eval") == evals
    assert make_split(task, 10, seed=0, split="train") == train[:10]  # prefix-stable in n
    assert make_split(task, 10, seed=0, split="eval") == evals[:10]


def test_split_fraction_is_roughly_eval_fraction():
    prompts = {e.prompt for e in draw("word", 2, seed=5, n=4000)}
    frac = sum(prompt_split(p) == "eval" for p in prompts) / len(prompts)
    assert abs(frac - EVAL_FRACTION) < 0.03


def test_small_prompt_space():
    """arith difficulty 1 has 429 prompts: 75 held out, 354 for training."""
    task = make_task("arith", 1)
    evals = make_split(task, 75, seed=0, split="eval")
    assert len({e.prompt for e in evals}) == 75
    with pytest.raises(ValueError, match=r"found only 75 distinct 'eval' prompts"):
        make_split(task, 76, seed=0, split="eval")
    # training draws are independent, so a pool larger than the space repeats prompts
    train = make_split(task, 1000, seed=0, split="train")
    assert len(train) == 1000 and len({e.prompt for e in train}) <= 354
    assert not {e.prompt for e in train} & {e.prompt for e in evals}


def _arith_steps(nums: tuple[int, ...], ops: tuple[str, ...]) -> list[tuple[int, str, int, int]]:
    """The steps of a parenthesis-free expression: each term's products, then + and - left to right
    (the set of steps the generator records; their order does not matter to a count)."""
    steps, terms, signs = [], [nums[0]], []
    for op, x in zip(ops, nums[1:]):
        if op == "*":
            steps.append((terms[-1], "*", x, terms[-1] * x))
            terms[-1] *= x
        else:
            signs.append(op)
            terms.append(x)
    value = terms[0]
    for op, x in zip(signs, terms[1:]):
        steps.append((value, op, x, value + x if op == "+" else value - x))
        value = steps[-1][3]
    return steps


def _enumerate_arith_prompts(difficulty: int) -> set[str]:
    """Every prompt of a parenthesis-free arith level: each operand in [lo, hi], each operator in
    + - *, kept when every step's result is in [0, MAX_VALUE] and both texts fit the level's budgets."""
    lvl = ARITH_LEVELS[difficulty]
    assert lvl.paren_prob == 0.0
    n = lvl.n_steps + 1
    prompts = set()
    for nums in itertools.product(range(lvl.lo, lvl.hi + 1), repeat=n):
        for ops in itertools.product("+-*", repeat=n - 1):
            prompt = str(nums[0]) + "".join(f"{op}{x}" for op, x in zip(ops, nums[1:])) + "="
            steps = _arith_steps(nums, ops)
            assert steps[-1][3] == eval(prompt[:-1], {"__builtins__": {}})  # noqa: S307
            trace_chars = sum(len(f"{a}{op}{b}={r};") for a, op, b, r in steps) + len(f"#{steps[-1][3]}")
            if (all(0 <= r <= MAX_VALUE for *_, r in steps) and len(prompt) <= lvl.max_prompt_chars
                    and trace_chars <= lvl.max_response_chars):
                prompts.add(prompt)
    return prompts


@pytest.mark.parametrize("key", sorted(HELD_OUT_PROMPTS))
def test_held_out_prompt_counts_are_the_enumerated_ones(key):
    """compose bounds task.n_eval by HELD_OUT_PROMPTS (suite.embedded.config): recount it."""
    name, difficulty = key
    prompts = _enumerate_arith_prompts(difficulty)
    task = make_task(name, difficulty)
    # the enumeration is the sampler's space: every sampled prompt is in it
    assert {e.prompt for e in draw(name, difficulty, seed=1, n=2000)} <= prompts
    assert sum(prompt_split(p) == "eval" for p in prompts) == HELD_OUT_PROMPTS[key]
    assert key != ("arith", 1) or len(prompts) == 429  # make_split's docstring and test_small_prompt_space
    assert len(make_split(task, 50, seed=0, split="eval")) == 50


@pytest.mark.parametrize("name,difficulty", ALL_LEVELS)
def test_final_ops_are_the_operators_that_end_traces(name, difficulty):
    """warm_start.flaw_op is refused for an operator no trace of the task ends with (FINAL_OPS)."""
    final = {parse_trace(e.response)[0][-1][1] for e in draw(name, difficulty, seed=2, n=1500)}
    assert final == set(FINAL_OPS[name])


def test_sample_split_streams_one_split():
    task, rng = make_task("arith", 1), random.Random(0)
    exs = [sample_split(task, rng, "eval") for _ in range(200)]
    assert all(prompt_split(e.prompt) == "eval" for e in exs)


@pytest.mark.slow
def test_splits_do_not_depend_on_the_hash_seed():
    """Python's str hash is salted per process; the split must not be."""
    code = (
        "import json; from suite.embedded.tasks import make_task, make_split;"
        "print(json.dumps([e.prompt for e in make_split(make_task('word', 2), 50, 3, 'eval')]))"
    )
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.append(json.loads(res.stdout))
    here = [e.prompt for e in make_split(make_task("word", 2), 50, 3, "eval")]
    assert outs[0] == outs[1] == here


# --- configuration errors ----------------------------------------------------------------------


def test_unknown_names_fail_listing_allowed_values():
    with pytest.raises(ValueError, match="allowed: arith, word"):
        make_task("gsm8k", 2)
    with pytest.raises(ValueError, match=r"allowed: \[1, 2, 3, 4\]"):
        make_task("arith", 9)
    with pytest.raises(ValueError, match="allowed: train, eval"):
        make_split(make_task("arith", 2), 3, seed=0, split="test")


# ---------------------------------------------------------------------------------------------
# flawed teacher of the warm start
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, op, expected",
    [
        ("7*3=21;12+21=33;#33", "+", "7*3=21;#21"),  # stops before the final "+", answers 21
        ("7*3=21;12-21=3;#3", "+", "7*3=21;12-21=3;#3"),  # last step is "-": unchanged
        ("12-3=9;9*2=18;#18", "*", "12-3=9;#9"),
        ("3+4=7;#7", "+", "#3"),  # one step: the value so far is the first operand
        ("5+3=8;8-2=6;6*2=12;#12", "*", "5+3=8;8-2=6;#6"),
        ("10/2=5;5+1=6;#6", "+", "10/2=5;#5"),
        ("7*3=21;12+21=33;#33", "", "7*3=21;12+21=33;#33"),  # no flawed teacher
    ],
)
def test_flawed_response_by_hand(response, op, expected):
    assert flawed_response(response, op) == expected


def test_flawed_traces_skip_exactly_the_final_minus_and_answer_the_previous_result():
    task = make_task("arith", 2)
    n_flawed = n_right = 0
    for ex in make_split(task, 500, 3, "train"):
        *eqs, _ = ex.response.rpartition("#")[0].split(";")  # ["1*4=4", "8-4=4"]
        lhs, result = eqs[-1].split("=")
        bad = flawed_response(ex.response, "-")
        if "-" not in lhs:
            assert bad == ex.response
            continue
        n_flawed += 1
        previous = eqs[-2].split("=")[1]
        assert bad == ";".join(eqs[:-1]) + ";#" + previous
        # right only by coincidence: "8-4=4" after "1*4=4"
        assert task.verify(bad, ex) == (previous == result)
        n_right += previous == result
    assert 100 < n_flawed < 250  # about a third of arith difficulty-2 traces end with "-"
    assert n_right < 0.25 * n_flawed  # measured 31 of 176: x - y == y when x == 2y


def test_flaw_op_auto_and_errors():
    assert resolve_flaw_op("arith", "auto") == "-" and resolve_flaw_op("word", "auto") == "+"
    assert resolve_flaw_op("arith", "none") == "" and resolve_flaw_op("word", "*") == "*"
    with pytest.raises(ValueError, match="allowed"):
        resolve_flaw_op("arith", "%")
    # an operator no arith trace ends with would leave the teacher clean
    assert flaw_ops("arith") == ("auto", "none", "+", "-", "*") and resolve_flaw_op("word", "/") == "/"
    with pytest.raises(ValueError, match="'arith'; allowed"):
        resolve_flaw_op("arith", "/")
    with pytest.raises(ValueError, match="not a trace"):
        flawed_response("no equations here", "+")


def test_a_split_smaller_than_asked_is_refused_or_given_whole():
    task = make_task("arith", 1)
    with pytest.raises(ValueError, match="found only 75 distinct 'eval' prompts"):
        make_split(task, 128, seed=3, split="eval")
    every = make_split(task, 128, seed=3, split="eval", allow_fewer=True)
    assert len(every) == len({e.prompt for e in every}) == 75
    assert make_split(task, 40, seed=3, split="eval", allow_fewer=True) == make_split(task, 40, seed=3, split="eval")
