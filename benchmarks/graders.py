"""The math graders side by side: agreement with public adjudicated cases, and speed (a development
benchmark: not installed with the package; run from a checkout).

    python benchmarks/graders.py [--parts agreement,speed] [--n 600] [--json]

- agreement: the answer-equivalence cases of Math-Verify's own test suite (Hugging Face, MIT licence),
  read from the source distribution of math-verify 0.9.0 on PyPI (downloaded once with pip into
  ~/.cache/suite/grader-cases; nothing of it is in this repository). Each ``(gold, prediction, expected)``
  triple of a ``pytest.mark.parametrize`` list is read with ``ast.literal_eval`` (literals only). The
  single-answer core: gold and prediction each one short answer (at most 80 characters, no prose), the
  prediction put in a ``\\boxed{}`` as the prompts ask. Each grader that grades boxed math in this
  suite, before and after, scores every case; printed: agreement, false positives (graded right where the
  case says wrong) and false negatives, per data-source group. Math-Verify was developed against these
  cases, so its row is an upper bound for it; the suite's own parts (box reading, units, exact numbers,
  the sandbox's refusals) are what can still lose agreement there.
- speed: responses of ~1.5 KB in the style of MATH solutions (prose, LaTeX steps, a final \\boxed{}),
  their answers drawn from MATH-500's kinds (integers, fractions, decimals, radicals, expressions,
  intervals, tuples), half right, half wrong. Responses per second for verl's PRIME grader in this
  process (the suite's grader before), the suite's grader in this process, and ``suite.scoring.grade_many``
  (the sealed worker pool, one worker per core), measured one after another in this run.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path.home() / ".cache" / "suite" / "grader-cases"
SDIST = "math-verify==0.9.0"
CORE_CHARS = 80


def _sdist_tests() -> Path:
    root = CACHE / "math_verify-0.9.0"
    if not (root / "tests").is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d",
                        str(CACHE), SDIST], check=True)
        import tarfile

        with tarfile.open(CACHE / "math_verify-0.9.0.tar.gz") as tar:
            tar.extractall(CACHE, filter="data")
    return root / "tests"


def public_cases() -> list[tuple[str, str, bool, str]]:
    """(gold, prediction, expected, test file) of every literal parametrize list with those three names."""
    out = []
    for path in sorted(_sdist_tests().glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            is_list = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "parametrize"
            if not (is_list and len(node.args) >= 2):
                continue
            try:
                names = ast.literal_eval(node.args[0])
                rows = ast.literal_eval(node.args[1])
            except ValueError:
                continue
            names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
            if not {"gold", "pred", "expected"} <= set(names):
                continue
            g, p, e = names.index("gold"), names.index("pred"), names.index("expected")
            out += [(str(r[g]), str(r[p]), bool(r[e]), path.name) for r in rows]
    return out


_DELIMS = re.compile(r"^\s*(?:\$\$|\$|\\\[|\\\()\s*(.*?)\s*(?:\$\$|\$|\\\]|\\\))\s*\.?\s*$", re.S)


def _one_answer(text: str) -> str | None:
    from suite.scoring.answers import last_boxed

    boxed = last_boxed(text)
    if boxed is not None:
        return boxed if len(boxed) <= CORE_CHARS else None
    m = _DELIMS.match(text)
    body = (m.group(1) if m else text).strip()
    if not body or len(body) > CORE_CHARS or "$" in body or re.search(r"[A-Za-z]{3,}\s+[A-Za-z]{3,}", body):
        return None  # prose, or several math spans: not a single answer
    return body


def core_cases() -> list[tuple[str, str, bool, str]]:
    seen, out = set(), []
    for gold, pred, expected, where in public_cases():
        g, p = _one_answer(gold), _one_answer(pred)
        if g is None or p is None or (g, p) in seen:
            continue
        seen.add((g, p))
        out.append((g, p, expected, where))
    return out


def _verl_math_reward(response: str, truth: str) -> float:
    from verl.utils.reward_score import math_reward

    return float(math_reward.compute_score(response, truth))


GROUPS = {  # data sources -> the grader before (what 6cb3086 routed them to)
    "minerva_math, olympiadbench, openr1_math, numina_* (AMC)": "verl-prime-math",
    "lighteval/MATH, MATH-500": "verl-math-reward",
}


def agreement() -> dict:
    from suite.scoring import grade_many

    cases = core_cases()
    items = [("minerva_math", f"The answer is $\\boxed{{{p}}}$.", g) for g, p, _, _ in cases]
    verdicts = {
        "suite-math-verify": grade_many(items),
        "verl-prime-math": grade_many(items, grader="verl-prime-math"),
        "verl-math-reward": [_verl_math_reward(r, t) for _, r, t in items],
    }
    rows = []
    for group, before in GROUPS.items():
        for when, grader in (("before", before), ("after", "suite-math-verify")):
            got = [v > 0 for v in verdicts[grader]]
            fp = sum(g and not c[2] for g, c in zip(got, cases))
            fn = sum(c[2] and not g for g, c in zip(got, cases))
            rows.append({"data sources": group, "when": when, "grader": grader, "cases": len(cases),
                         "agree": len(cases) - fp - fn, "agreement": (len(cases) - fp - fn) / len(cases),
                         "false positives": fp, "false negatives": fn})
    missed = [(c[0], c[1], c[2]) for c, v in zip(cases, verdicts["suite-math-verify"]) if (v > 0) != c[2]]
    return {"source": f"{SDIST} sdist tests/ (single-answer core: {len(cases)} of {len(public_cases())} cases)",
            "rows": rows, "suite_disagreements": missed}


# -- speed ------------------------------------------------------------------------------------------------

ANSWERS = [  # (truth, a right form, a wrong form): MATH-500's kinds of final answer
    ("42", "42", "24"), ("\\frac{3}{4}", "\\frac34", "\\frac{4}{3}"), ("0.25", "\\frac{1}{4}", "0.2"),
    ("2\\sqrt{3}", "\\sqrt{12}", "3\\sqrt{2}"), ("x^2+2x+1", "(x+1)^2", "x^2+1"), ("[-2,7)", "[-2, 7)", "(-2,7]"),
    ("(3,-1)", "(3, -1)", "(-1,3)"), ("\\frac{\\pi}{6}", "\\frac{\\pi}{6}", "\\frac{\\pi}{3}"),
    ("1024", "1,024", "1042"),
    ("-5", "-5", "5"), ("12\\sqrt{2}", "12\\sqrt2", "12\\sqrt3"), ("\\text{(C)}", "\\text{(C)}", "\\text{(B)}"),
]
PROSE = ("We first note that the expression can be simplified. Let $a = {a}$ and $b = {b}$; then "
         "$a^2 + b^2 = {s}$ and \\[ \\frac{{a+b}}{{2}} = \\frac{{{t}}}{{2}}. \\] Substituting back into the original "
         "equation gives $3x - {a} = {b}$, so $x = \\frac{{{t}}}{{3}}$. ")


def responses(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        truth, right, wrong = ANSWERS[i % len(ANSWERS)]
        body = ""
        while len(body) < 1450:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            body += PROSE.format(a=a, b=b, s=a * a + b * b, t=a + b)
        out.append(("minerva_math", f"{body}Therefore the answer is $\\boxed{{{right if i % 2 else wrong}}}$.", truth))
    return out


def _rate(fn, items) -> tuple[float, list]:
    t0 = time.perf_counter()
    got = fn(items)
    return len(items) / (time.perf_counter() - t0), got


def speed(n: int) -> dict:
    from suite.scoring import grade_many, grading_pool
    from suite.scoring import math_equal
    from suite.scoring import prime

    items = responses(n)
    math_equal.warm()
    prime.warm()
    grading_pool().score([("suite.scoring.math_equal", "score", "\\boxed{1}", "1")])  # workers up and sealed
    before, b = _rate(lambda it: [prime.score(r, t) for _, r, t in it], items)
    one, o = _rate(lambda it: [math_equal.score(r, t) for _, r, t in it], items)
    pool, p = _rate(grade_many, items)
    assert o == p, "the pool graded otherwise than the same grader in this process"
    right = [i % 2 == 1 for i in range(n)]
    return {"responses": n, "chars_mean": sum(len(r) for _, r, _ in items) / n,
            "verl-prime-math, this process": before, "suite-math-verify, this process": one,
            f"suite-math-verify, grade_many ({grading_pool().workers} workers)": pool,
            "speed-up, this process": one / before, "speed-up, pool": pool / before,
            "prime agrees with the intended verdict": sum((x > 0) == r for x, r in zip(b, right)) / n,
            "suite agrees with the intended verdict": sum((x > 0) == r for x, r in zip(o, right)) / n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="agreement,speed")
    ap.add_argument("--n", type=int, default=600, help="responses in the speed part")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = {}
    if "agreement" in args.parts:
        result["agreement"] = agreement()
    if "speed" in args.parts:
        result["speed"] = speed(args.n)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    if "agreement" in result:
        a = result["agreement"]
        print(f"agreement with {a['source']}")
        print(f"{'data sources':<58} {'when':<7} {'grader':<18} {'agree':>11} {'FP':>4} {'FN':>4}")
        for r in a["rows"]:
            print(f"{r['data sources']:<58} {r['when']:<7} {r['grader']:<18} "
                  f"{r['agree']:>4}/{r['cases']:<4} {100 * r['agreement']:5.1f}% {r['false positives']:>4} "
                  f"{r['false negatives']:>4}")
        print(f"suite-math-verify disagrees on {len(a['suite_disagreements'])}:")
        for g, p, e in a["suite_disagreements"]:
            print(f"  gold {g!r} pred {p!r}: expected {e}")
    if "speed" in result:
        for k, v in result["speed"].items():
            print(f"{k:<48} {v:10.2f}" if isinstance(v, float) else f"{k:<48} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
