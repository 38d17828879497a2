"""GSM8K-style word problems of the ``word`` task: levels and six templates.

Terse so that difficulty 2 fits 80 prompt / 28 response characters; each template draws a
prompt and the trace of equations that solves it (suite.embedded.traces).
"""

from __future__ import annotations

import random

from suite.embedded.traces import Level, Reject, Step, apply_op

# Word problems: difficulty d has d+1 reasoning steps (2-4, as GSM8K's short problems).
WORD_LEVELS: dict[int, Level] = {
    1: Level(n_steps=2, lo=2, hi=9, paren_prob=0.0, max_prompt_chars=72, max_response_chars=24),
    2: Level(n_steps=3, lo=2, hi=9, paren_prob=0.0, max_prompt_chars=80, max_response_chars=28),
    3: Level(n_steps=4, lo=2, hi=20, paren_prob=0.0, max_prompt_chars=112, max_response_chars=48),
}

NAMES: tuple[str, ...] = (
    "Ann", "Bo", "Cy", "Di", "Ed", "Fay", "Gus", "Hal", "Ivy", "Jo",
    "Kim", "Lu", "Max", "Ned", "Pam", "Raj", "Sam", "Tom", "Uma", "Val",
)  # fmt: skip
ITEMS: tuple[str, ...] = (
    "pens", "eggs", "cards", "books", "cups", "nuts", "beads", "coins", "shells", "apples",
)  # fmt: skip


def _inventory(rng: random.Random, lvl: Level) -> tuple[str, list[Step]]:
    """"Ann has 5 pens, buys 3, loses 2, doubles them. Pens?" -> a chain of k moves."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    v = start = rng.randint(lvl.lo, lvl.hi)
    steps, moves = [], []
    for _ in range(lvl.n_steps):
        verb = rng.choice(("buys", "gets", "finds", "loses", "sells", "doubles", "triples"))
        if verb in ("doubles", "triples"):
            op, b, text = "*", 2 if verb == "doubles" else 3, f"{verb} them"
        else:
            b = rng.randint(lvl.lo, lvl.hi)
            op, text = ("-" if verb in ("loses", "sells") else "+"), f"{verb} {b}"
        steps.append(apply_op(v, op, b))
        v = steps[-1][3]
        moves.append(text)
    return f"{name} has {start} {item}, {', '.join(moves)}. {item.capitalize()}?", steps


def _shopping(rng: random.Random, lvl: Level) -> tuple[str, list[Step]]:
    """Buying at a unit price, paying with a round sum: "... pays 20. Change?"."""
    num = lambda: rng.randint(lvl.lo, lvl.hi)  # noqa: E731
    name, item, item2 = rng.choice(NAMES), *rng.sample(ITEMS, 2)
    a, p = num(), num()
    steps = [apply_op(a, "*", p)]
    if lvl.n_steps == 2:
        what = f"{a} {item} at {p} each"
    elif lvl.n_steps == 3:
        q = num()
        steps.append(apply_op(steps[-1][3], "+", q))
        what = f"{a} {item} at {p} each and a bag at {q}"
    else:
        b, q = num(), num()
        steps.append(apply_op(b, "*", q))
        steps.append(apply_op(steps[0][3], "+", steps[1][3]))
        what = f"{a} {item} at {p} each and {b} {item2} at {q} each"
    cost = steps[-1][3]
    paid = (cost // 10 + 1) * 10 + 10 * rng.randint(0, 1)  # a round sum above the cost
    steps.append(apply_op(paid, "-", cost))
    return f"{name} buys {what}, pays {paid}. Change?", steps


def _sharing(rng: random.Random, lvl: Level) -> tuple[str, list[Step]]:
    """Sharing equally, exact division only: "... shares them equally among 3. Each?"."""
    num = lambda: rng.randint(lvl.lo, lvl.hi)  # noqa: E731
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = num(), num()
    steps = [apply_op(a, "*", b)]
    if lvl.n_steps == 2:
        have, rest = f"{a} bags of {b} {item}", "them"
    elif lvl.n_steps == 3:
        c = num()
        steps.append(apply_op(steps[-1][3], "-", c))
        have, rest = f"{a} bags of {b} {item}, keeps {c}", "the rest"
    else:
        c, e = num(), num()
        steps.append(apply_op(steps[-1][3], "+", c))
        steps.append(apply_op(steps[-1][3], "-", e))
        have, rest = f"{a} bags of {b} {item} and {c} more, keeps {e}", "the rest"
    total = steps[-1][3]
    divisors = [d for d in range(2, 10) if total % d == 0 and total > 0]
    if not divisors:
        raise Reject
    d = rng.choice(divisors)
    steps.append(apply_op(total, "/", d))
    return f"{name} has {have}, shares {rest} equally among {d}. Each?", steps


def _groups(rng: random.Random, lvl: Level) -> tuple[str, list[Step]]:
    """Groups of items plus loose ones: "Di has 3 boxes of 5 eggs and 4 more. Eggs?"."""
    num = lambda: rng.randint(lvl.lo, lvl.hi)  # noqa: E731
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = num(), num()
    steps = [apply_op(a, "*", b)]
    if lvl.n_steps == 4:
        c, d, e = num(), num(), num()
        steps.append(apply_op(c, "*", d))
        steps.append(apply_op(steps[0][3], "+", steps[1][3]))
        steps.append(apply_op(steps[-1][3], "-", e))
        have = f"{a} boxes of {b} {item} and {c} bags of {d}, loses {e}"
    else:
        c = num()
        steps.append(apply_op(steps[-1][3], "+", c))
        have = f"{a} boxes of {b} {item} and {c} more"
        if lvl.n_steps == 3:
            e = num()
            steps.append(apply_op(steps[-1][3], "-", e))
            have += f", loses {e}"
    return f"{name} has {have}. {item.capitalize()}?", steps


def _age(rng: random.Random, lvl: Level) -> tuple[str, list[Step]]:
    """Ages relative to one another, then a shift in time: "... Gus in 4 years?"."""
    people = rng.sample(NAMES, lvl.n_steps)
    v = rng.randint(lvl.lo, lvl.hi)
    text, steps = [f"{people[0]} is {v}."], []
    for prev, who in zip(people, people[1:]):  # n_steps - 1 relations
        rel = rng.choice(("older", "younger", "twice"))
        if rel == "twice":
            steps.append(apply_op(v, "*", 2))
            text.append(f"{who} is twice {prev}'s age.")
        else:
            b = rng.randint(lvl.lo, lvl.hi)
            steps.append(apply_op(v, "+" if rel == "older" else "-", b))
            text.append(f"{who} is {b} {rel} than {prev}.")
        v = steps[-1][3]
    b = rng.randint(lvl.lo, lvl.hi)
    if rng.random() < 0.5:
        steps.append(apply_op(v, "+", b))
        text.append(f"{people[-1]} in {b} years?")
    else:
        steps.append(apply_op(v, "-", b))
        text.append(f"{people[-1]} {b} years ago?")
    return " ".join(text), steps


def _savings(rng: random.Random, lvl: Level) -> tuple[str, list[Step]]:
    """Saving at a weekly rate, then spending: "Jo saves 4 a week for 3 weeks, spends 5. Left?"."""
    num = lambda: rng.randint(lvl.lo, lvl.hi)  # noqa: E731
    name = rng.choice(NAMES)
    a, b, c = num(), num(), num()
    steps = [apply_op(a, "*", b)]
    head = f"{name} saves {a} a week for {b} weeks"
    if lvl.n_steps >= 3:
        s = num()
        steps.append(apply_op(s, "+", steps[-1][3]))
        head = f"{name} has {s}, saves {a} a week for {b} weeks"
    steps.append(apply_op(steps[-1][3], "-", c))
    tail = f"spends {c}"
    if lvl.n_steps == 4:
        steps.append(apply_op(steps[-1][3], "/", 2))
        tail += ", gives half away"
    return f"{head}, {tail}. Left?", steps


WORD_TEMPLATES = (_inventory, _shopping, _sharing, _groups, _age, _savings)
