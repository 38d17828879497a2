"""suite.scoring: the graders behind every score. The answer forms and traps of public equivalence cases
(Math-Verify's and verl's PRIME grader's known failures), each with a hand-decided verdict; code in a
box that runs in verl's PRIME grader and does not in the suite's; the sealed workers' refusals."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from suite.scoring import GRADERS, UnknownSource, correct, grade_many, grader_for
from suite.scoring.answers import boxes, last_boxed, numbers_equal, plain_number, strip_units

BOXED_SOURCES = ("minerva_math", "olympiadbench", "openr1_math", "numina_amc_aime", "HuggingFaceH4/MATH-500",
                 "lighteval/MATH")

# (answer in the box, ground truth, right?)
CASES = [
    # wrong answers a grader with a percent rule or a relative tolerance accepts
    ("5", "500", False), ("0.05", "5", False), ("123457", "123456", False), ("0.28", "28\\%", False),
    ("x+\\frac{2}{7}", "\\frac{x+2}{7}", False), ("11a+c", "7 = 11a+c", False), ("1112122_3", "1112112_3", False),
    ("1.33", "\\frac{4}{3}", False), ("\\frac{1}{3}", "0.5", False), ("-7", "7", False), ("6 \\text{ cm}", "5", False),
    # right answers in other forms
    ("0.0833333", "\\frac{1}{12}", True), ("32,\\!349", "32349", True), ("11,\\! 111,\\! 100", "11111100", True),
    ("32, 349", "32349", False), ("7,425,000", "7425000", True),
    ("(3,2)", "(p,q)=(3,2)", True), ("x \\in [-2,7]", "[-2,7]", True), ("28 percent", "28\\%", True),
    ("28", "28\\%", True), ("\\{3,1,2\\}", "\\{1,2,3\\}", True), ("3, 1, 2", "1,2,3", True),
    ("0.5", "\\frac{1}{2}", True), ("\\dfrac12", "\\frac{1}{2}", True), ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("3.00", "3", True), ("(1, 2)", "(1,2)", True), ("4.5\\times10^{-7}", "4.5 \\times 10^{-7}", True),
    ("5 \\text{ cm}", "5", True), ("3\\,\\mathrm{m/s}", "3", True), ("30^\\circ", "30", True), ("25\\%", "25", True),
    ("\\text{Evelyn}", "\\text{Evelyn}", True), ("k = \\frac{1}{3}", "\\frac13", True),
]


@pytest.mark.parametrize("answer, truth, right", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_boxed_math_sets_accept_forms_and_refuse_traps(answer, truth, right):
    items = [(ds, f"Let me think. So the answer is $\\boxed{{{answer}}}$.", truth) for ds in BOXED_SOURCES]
    assert grade_many(items) == [1.0 if right else 0.0] * len(BOXED_SOURCES), (answer, truth)


def test_responses_without_a_final_answer_score_zero_and_boxes_read_as_published():
    empty = ("the answer is 3", "\\boxed{}", "\\boxed{3", "\\boxed{3} then \\boxed{}", "\\boxed{4} then \\boxed{3", "")
    items = [("minerva_math", r, "3") for r in empty]
    assert grade_many(items) == [0.0] * len(items)
    right = [("olympiadbench", r, t) for r, t in (("\\boxed{\\boxed{3}}", "3"),
                                                  ("first \\boxed{4}, then \\boxed{3}", "3"),
                                                  ("$x = \\boxed{1}$ or $x = \\boxed{3}$", "1, 3"),
                                                  ("\\boxed{1} and \\boxed{3}", "\\{1,3\\}"))]
    assert grade_many(right) == [1.0] * len(right)
    # several boxes count together only for a list truth
    assert grade_many([("olympiadbench", "\\boxed{1} and \\boxed{3}", "13")]) == [0.0]
    assert boxes("a \\boxed{x^{2}} b \\fbox{5} c $\\boxed 7$") == ["x^{2}", "5", "7"]
    assert last_boxed("\\boxed{4} \\boxed{7") is None and last_boxed("no box") is None


def test_plain_numbers_are_exact():
    assert plain_number("7,425,000") == (7425000, False) and plain_number("32{,}349") == (32349, False)
    assert plain_number("-\\frac{3}{4}") == (plain_number("-0.75")[0], False) and plain_number("2\\sqrt3") is None
    assert numbers_equal(plain_number("0.0833333"), plain_number("1/12"))
    assert not numbers_equal(plain_number("0.08333"), plain_number("1/12"))  # fewer places than the rounding
    assert not numbers_equal(plain_number("1000001"), plain_number("1000000"))
    assert strip_units("$5 \\text{ cm}$") == "5" and strip_units("28 percent") == "28"
    assert strip_units("\\text{yes}") == "yes"


def test_every_source_has_one_grader_and_unknown_sources_are_refused():
    assert grader_for("openai/gsm8k").name == "verl-gsm8k" and grader_for("aime2024").name == "verl-math-dapo"
    assert all(grader_for(ds).name == "suite-math-verify" for ds in BOXED_SOURCES)
    for ds in ("codecontests", "apps", "no-such-source", ""):
        with pytest.raises(UnknownSource, match="has no grader"):
            grade_many([(ds, "\\boxed{1}", "1")])
    label = GRADERS["suite-math-verify"].label()
    assert label.startswith("suite-math-verify (math-verify 0.9.0, latex2sympy2_extended ")
    assert correct({"score": -1.0}) is False and correct({"score": 1.0}) and correct(1.0) and not correct(0.0)


@pytest.mark.verl
def test_code_in_a_box_runs_in_verls_prime_grader_and_not_in_the_suites():
    """The box's text opens a file for writing when verl's PRIME grader eval()s it (shown in a child
    process, bare); graded by the suite (its grader, and PRIME's inside the sealed workers) nothing is written."""
    pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")
    # no underscore in the path: PRIME's base rule (``12_3``) would stop at one before its eval
    target = Path("/tmp") / f"suiteboxtest{uuid.uuid4().hex}"
    try:
        _code_in_a_box(target)
    finally:
        target.unlink(missing_ok=True)


def _code_in_a_box(target: Path) -> None:
    box = f"so \\boxed{{\\pi*0+open('{target}','w').write('x')}}"
    bare = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from verl.utils.reward_score import prime_math
        prime_math.compute_score({box!r}, "\\\\pi")""")], capture_output=True, text=True, timeout=300)
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert target.exists(), "the payload no longer runs in verl's PRIME grader: this test proves nothing"
    target.unlink()

    from suite.scoring import _comparison_sandbox

    assert grade_many([("numina_amc_aime", box, "\\pi")]) == [0.0]
    assert grade_many([("numina_amc_aime", box, "\\pi")], grader="verl-prime-math") == [0.0]
    assert not target.exists()
    assert _comparison_sandbox().refused >= 1  # the sealed worker refused PRIME's open(..., 'w')


def test_sealed_worker_refuses_writing_network_programs_and_code_from_text(tmp_path):
    """The audit hook of a grading worker, installed in a child process (a hook cannot be removed)."""
    script = textwrap.dedent(f"""
        import os, socket, subprocess, sys
        from suite.scoring import sandbox, math_equal
        math_equal.warm()
        sys.addaudithook(sandbox._audit)
        tries = {{
            "write": lambda: open({str(tmp_path / 'w')!r}, "w"),
            "append": lambda: open({str(tmp_path / 'a')!r}, "a"),
            "os.open": lambda: os.open({str(tmp_path / 'o')!r}, os.O_WRONLY | os.O_CREAT),
            "remove": lambda: os.remove({str(tmp_path / 'keep')!r}),
            "socket": lambda: socket.socket(),
            "program": lambda: subprocess.run(["true"]),
            "system": lambda: os.system("true"),
            "eval": lambda: eval("open('x', 'w')"),
            "exec": lambda: exec("import os"),
            "dunder": lambda: eval("().__class__.__base__"),
            "sympify": lambda: __import__("sympy").sympify("open('x')"),
        }}
        for name, call in tries.items():
            try:
                call()
                print("ALLOWED", name)
            except PermissionError:
                print("refused", name)
        print(open({str(tmp_path / 'keep')!r}).read(), math_equal.equivalent("2\\\\sqrt{{3}}", "\\\\sqrt{{12}}"),
              math_equal.equivalent("(3,2)", "(p,q)=(3,2)"))
        """)
    (tmp_path / "keep").write_text("readable")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("ALLOWED")] == []
    assert len([ln for ln in lines if ln.startswith("refused")]) == 11
    assert lines[-1] == "readable True True"  # reading files and grading still work
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"]


def test_choice_answers_read_the_letter_the_response_ends_on():
    from suite.scoring.choice import choice

    cases = [("so \\boxed{C}", "C"), ("\\boxed{\\text{(B)}}", "B"), ("The answer is (D).", "D"), ("Answer: A", "A"),
             ("the answer is B; no, the answer is C", "C"), ("answer: **E**", "E"), ("The correct option is J.", "J"),
             ("\\boxed{42}", None), ("the answer is a dog", None), ("no letter", None)]
    assert [choice(r) for r, _ in cases] == [want for _, want in cases]
    assert grade_many([("gpqa", "\\boxed{B}", "B"), ("mmlu-pro", "The answer is (J)", "J"),
                       ("arc-c", "Answer: C", "D")]) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="one letter A-J"):
        grade_many([("arc-c", "\\boxed{B}", "42")])


def test_code_answers_run_sandboxed_pass_fail_loop_and_reach_no_network(tmp_path):
    """LiveCodeBench-style code: a right program passes every test, a wrong one fails, an endless loop and a
    sleep are stopped by the time limits, and a program that connects to a server listening on loopback
    (here, in this test) or writes a file does neither."""
    import json
    import socket

    from suite.scoring import code as C

    tests = json.dumps({"tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 7\n", "output": "12"}],
                        "time_limit_s": 1})
    program = "```python\n{}\n```".format
    target = tmp_path / "written"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        answers = {
            "right": program("a, b = map(int, input().split())\nprint(a + b)"),
            "wrong": program("a, b = map(int, input().split())\nprint(a - b)"),
            "loop": program("while True:\n    pass"),
            "sleep": program("import time\ntime.sleep(60)"),
            "network": program(f"import socket\nsocket.create_connection(('127.0.0.1', {port})).send(b'x')\n"
                               "a, b = map(int, input().split())\nprint(a + b)"),
            "write": program(f"open({str(target)!r}, 'w').write('x')\na, b = map(int, input().split())\nprint(a + b)"),
            "none": "I would loop over the input.",
        }
        got = {k: grade_many([("livecodebench", v, tests)])[0] for k, v in answers.items()}
        with pytest.raises(socket.timeout):
            server.accept()  # nothing connected
    assert got == {"right": 1.0, "wrong": 0.0, "loop": 0.0, "sleep": 0.0, "network": 0.0, "write": 0.0, "none": 0.0}
    assert not target.exists()
    assert C.extract_code("```\nprint(1)\n``` then ```python\nprint(2)\n```") == "print(2)\n"
