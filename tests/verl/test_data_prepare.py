"""`suite data prepare`: small files in each dataset's published schema become verl's RL parquet, and
verl's own default_compute_score grades a right and a wrong answer for every data_source written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from suite.verl.data import BOXED_SUFFIX, GSM8K_SUFFIX, SOURCES, DataError, convert, last_boxed, prepare

pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")
pytestmark = pytest.mark.verl
pa = pytest.importorskip("pyarrow")  # verl brings it
pq = pytest.importorskip("pyarrow.parquet")

COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]

GSM8K = [{"question": "Natalia sold 48 clips in April and half as many in May. How many in total?",
          "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72"},
         {"question": "A farm has 1,234 cows.", "answer": "It is given.\n#### 1,234"}]
MATH = [{"problem": "What is $\\frac{2}{4}$?", "level": "Level 1", "type": "Prealgebra",
         "solution": "First $\\boxed{2}$ is wrong; reduce: $\\frac{2}{4} = \\boxed{\\frac{1}{2}}$."}]
MATH500 = [{"problem": "Compute $1+1$.", "solution": "So $1+1=\\boxed{2}$.", "answer": "2",
            "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"}]
DAPO_PROMPT = "Solve the following math problem step by step. The last line of your response should be of the form " \
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n" \
    "Remember to put your answer on its own line after \"Answer:\"."


def _dapo(problem: str, answer: str) -> dict:
    return {"data_source": "math_dapo", "prompt": [{"content": DAPO_PROMPT.format(problem), "role": "user"}],
            "ability": "MATH", "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"uuid-{problem}"}}


DAPO = [_dapo("What is 17 * 2?", "34"), _dapo("What is 17 * 2?", "34"), _dapo("What is 3^2?", "9"),
        _dapo("What is 17 * 2?", "34")]
DEEPSCALER = [{"problem": "Find $x$ if $2x = 1$.", "answer": "\\frac{1}{2}", "solution": "Divide: $x = 1/2$."}]
AIME = [{"ID": "2024-I-1", "Problem": "Find the remainder.", "Solution": "...", "Answer": 72}]
AMC = [{"id": 0, "problem": "How many?", "answer": 27.0, "url": "https://artofproblemsolving.com/"}]
# Minerva-Math as Qwen2.5-Math's evaluation files ship it (problem, solution with \boxed{}), and as a
# problem/answer file (rllm's); OlympiadBench as its published rows (question, final_answer list, unit)
MINERVA = [{"problem": "Compute the speed of the wave.", "solution": "So $v = \\boxed{3.0 \\times 10^{8}}$ m/s.",
            "type": "Physics (8.01)", "idx": 0}]
MINERVA_QA = [{"problem": "How long, in years?", "answer": "4.5"}]
OLYMPIAD = [{"id": 1606, "question": "Find the ratio.", "solution": ["It is $\\frac{1}{2}$."],
             "final_answer": ["$\\frac{1}{2}$"], "context": None, "is_multiple_answer": False, "unit": None,
             "answer_type": "Numerical", "subfield": "Algebra", "language": "English"}]
OPENR1 = [{"problem": "Find $n$ with $n^2 = 49$, $n > 0$.", "solution": "$n = 7$", "answer": "7",
           "problem_type": "Algebra", "question_type": "math-word-problem", "source": "olympiads", "uuid": "u1"}]


# QaRL's out-of-distribution sets, in their published schemas
ARC = [{"question": "Which is a gas at room temperature?", "answerKey": "B",
        "choices": {"text": ["iron", "oxygen", "salt", "wood"], "label": ["A", "B", "C", "D"]}}]
ARC_NUMBERED = [{"question": "Which is a planet?", "answerKey": "3",
                 "choices": {"text": ["the Moon", "the Sun", "Mars"], "label": ["1", "2", "3"]}}]
GPQA = [{"Question": "Which particle carries no charge?", "Correct Answer": "neutron", "Incorrect Answer 1": "proton",
         "Incorrect Answer 2": "electron", "Incorrect Answer 3": "positron"}]
MMLU_PRO = [{"question": "What is 2 + 2?", "options": ["3", "4", "5", "6", "7", "8", "9", "10", "11", "12"],
             "answer": "B"}]
_SUM = "```python\na, b = map(int, input().split())\nprint(a {} b)\n```"
LIVECODE = [{"question_content": "Read two integers and print their sum.",
             "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
             "private_test_cases": json.dumps([{"input": "5 7\n", "output": "12\n", "testtype": "stdin"}])}]


def _write(path, records):
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _cli(*args):
    code = "import sys; from suite.cli import main; sys.argv[0] = 'suite'; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, "data", "prepare", *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def _read(path):
    table = pq.read_table(path)
    assert table.column_names == COLUMNS
    return table.to_pylist()


def test_gsm8k_parquet_through_the_cli(tmp_path):
    src = _write(tmp_path / "train-00000-of-00001.parquet", GSM8K)
    proc = _cli("gsm8k", "--src", src, "--out", tmp_path / "out")
    out = tmp_path / "out" / "gsm8k-train.parquet"
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 2 rows to {out}" in proc.stdout and "openai/gsm8k" in proc.stdout
    rows = _read(out)
    assert rows[0] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": GSM8K[0]["question"] + GSM8K_SUFFIX}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0},
    }
    assert GSM8K_SUFFIX == " Let's think step by step and output the final answer after \"####\"."
    assert rows[1]["reward_model"]["ground_truth"] == "1234" and rows[1]["extra_info"]["index"] == 1
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["gsm8k-train.parquet"]  # no temp file left


def test_math_takes_the_last_boxed_answer_as_verl_extracts_it(tmp_path):
    from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed

    rows, _ = convert("math", _write(tmp_path / "math.jsonl", MATH))
    assert rows[0]["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert rows[0]["reward_model"]["ground_truth"] == "\\frac{1}{2}"
    assert rows[0]["reward_model"]["ground_truth"] == remove_boxed(last_boxed_only_string(MATH[0]["solution"]))
    assert rows[0]["prompt"][0]["content"] == "What is $\\frac{2}{4}$? Let's think step by step and output the " \
        "final answer within \\boxed{}."
    assert rows[0]["extra_info"] == {"split": "test", "index": 0}


def test_math500_uses_its_answer_column(tmp_path):
    rows, _ = convert("math", _write(tmp_path / "test.parquet", MATH500), split="train")
    assert rows[0]["data_source"] == "HuggingFaceH4/MATH-500"
    assert rows[0]["reward_model"]["ground_truth"] == "2" and rows[0]["extra_info"]["split"] == "train"


def test_last_boxed():
    assert last_boxed("$\\boxed{\\frac{1}{\\sqrt{2}}}$") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{1} then \\fbox{(2, 3)}") == "(2, 3)"
    assert last_boxed("so $\\boxed 5$.") == "5"
    assert last_boxed("\\boxed{\\frac{1}{2}") is None and last_boxed("no box") is None


def test_dapo_passes_through_and_keeps_the_first_of_each_prompt(tmp_path, capsys):
    path = prepare("dapo-math-17k", _write(tmp_path / "dapo.parquet", DAPO), tmp_path / "out")
    assert path == tmp_path / "out" / "dapo-math-17k-train.parquet"
    assert "wrote 2 rows" in capsys.readouterr().out
    rows = _read(path)
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": DAPO[i]["prompt"][0]["content"]}]
                                           for i in (0, 2)]
    assert [r["reward_model"] for r in rows] == [{"style": "rule", "ground_truth": a} for a in ("34", "9")]
    assert [r["extra_info"] for r in rows] == [{"split": "train", "index": i} for i in (0, 1)]
    assert {r["data_source"] for r in rows} == {"math_dapo"}


def test_a_held_out_set_with_a_repeated_problem_keeps_it_and_says_so(tmp_path, capsys):
    """A benchmark file is written as given (its copies score as it counts them), but a repeated prompt is named:
    it once weighed twice in a held-out accuracy without a word."""
    records = [AIME[0], {**AIME[0], "ID": "2024-I-2", "Problem": "Another."}, {**AIME[0], "ID": "2024-I-3"}]
    path = prepare("aime24", _write(tmp_path / "aime.jsonl", records), tmp_path / "out")
    out = capsys.readouterr().out
    assert len(_read(path)) == 3 and "wrote 3 rows" in out
    assert "note: 1 row(s) repeat an earlier row's prompt (rows 0 = 2); kept as the source has them: a held-out " \
           "set scores each copy" in out, out
    prepare("aime24", _write(tmp_path / "aime2.jsonl", records[:2]), tmp_path / "out2")
    assert "note:" not in capsys.readouterr().out  # no repeat, no note


def test_deepscaler_json_array_through_the_cli(tmp_path):
    src = tmp_path / "deepscaler.json"
    src.write_text(json.dumps(DEEPSCALER, indent=1))
    proc = _cli("deepscaler", "--src", src, "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = _read(tmp_path / "deepscaler-train.parquet")
    assert row["data_source"] == "lighteval/MATH" and row["reward_model"]["ground_truth"] == "\\frac{1}{2}"
    assert row["prompt"][0]["content"] == DEEPSCALER[0]["problem"] + BOXED_SUFFIX


@pytest.mark.parametrize("name, records, data_source, truth", [
    ("aime24", AIME, "aime2024", "72"), ("aime25", AIME, "aime2025", "72"), ("amc", AMC, "numina_amc_aime", "27")])
def test_competitions_accept_capitals_and_numeric_answers(tmp_path, name, records, data_source, truth):
    (row,) = convert(name, _write(tmp_path / f"{name}.parquet", records))[0]
    assert row["data_source"] == data_source and row["reward_model"]["ground_truth"] == truth
    assert row["prompt"][0]["content"] == records[0].get("problem", records[0].get("Problem")) + BOXED_SUFFIX
    assert row["extra_info"]["split"] == "test"


# For each dataset: a file, a right and a wrong response written the way its prompt asks for the answer.
SCORED = [
    ("gsm8k", GSM8K[:1], "48+24 = 72\n#### 72", "#### 71"),
    ("math", MATH, "It halves: $\\boxed{\\frac12}$", "$\\boxed{\\frac{1}{3}}$"),
    ("math", MATH500, "So \\boxed{2}.", "So \\boxed{3}."),
    ("dapo-math-17k", DAPO[:1], "17 * 2 = 34.\nAnswer: 34", "Answer: 35"),
    ("deepscaler", DEEPSCALER, "$x = \\boxed{\\dfrac{1}{2}}$", "$x = \\boxed{2}$"),
    ("aime24", AIME, "The remainder is \\boxed{72}.", "The remainder is \\boxed{27}."),
    ("aime25", AIME, "The remainder is \\boxed{72}.", "The remainder is \\boxed{27}."),
    ("amc", AMC, "There are \\boxed{27}.", "There are \\boxed{26}."),
    ("aime24-dapo", AIME, "So 72.\nAnswer: 72", "Answer: 27"),
    ("aime25-dapo", AIME, "So 72.\nAnswer: 72", "Answer: 27"),
    ("math500", MATH500, "So \\boxed{2}.", "So \\boxed{3}."),
    ("minerva", MINERVA, "$v=\\boxed{3 \\times 10^8 \\mathrm{~m/s}}$", "$\\boxed{3 \\times 10^{7}}$"),
    ("minerva", MINERVA_QA, "About \\boxed{4.50} years", "About \\boxed{4.6} years"),
    ("olympiadbench", OLYMPIAD, "The ratio is \\boxed{0.5}.", "The ratio is \\boxed{\\frac{1}{3}}."),
    ("openr1-math", OPENR1, "Thus $n=\\boxed{7}$.", "Thus $n=\\boxed{-7}$."),
    ("arc-c", ARC, "Oxygen: \\boxed{B}", "The answer is (C)."),
    ("arc-c", ARC_NUMBERED, "Answer: C", "\\boxed{A}"),
    ("gpqa", GPQA, lambda t: f"\\boxed{{{t}}}", lambda t: "\\boxed{%s}" % ("A" if t != "A" else "B")),
    ("mmlu-pro", MMLU_PRO, "The answer is (B).", "\\boxed{J}"),
    ("livecodebench", LIVECODE, _SUM.format("+"), _SUM.format("-")),
]


def _acc(result) -> float:
    """math_dapo returns {score: +-1, acc}; the others a float in [0, 1]."""
    return float(result["acc"]) if isinstance(result, dict) else result


def test_the_runs_scorer_grades_every_data_source_written(tmp_path):
    """suite.verl.reward.compute_score (what verl runs and `suite eval` call) grades a right and a
    wrong response for every data_source written: its registered grader (suite.scoring), verl's own
    scorer giving default_compute_score's result where that is the grader."""
    from verl.utils.reward_score import default_compute_score

    from suite.verl.reward import compute_score, grader_for

    written = set()
    for i, (name, records, right, wrong) in enumerate(SCORED):
        (row,) = convert(name, _write(tmp_path / f"{i}.jsonl", records))[0][:1]
        ds, truth = row["data_source"], row["reward_model"]["ground_truth"]
        right, wrong = (r(truth) if callable(r) else r for r in (right, wrong))  # GPQA's letter is the shuffle's
        assert _acc(compute_score(ds, right, truth)) == 1.0, (name, ds, right, truth)
        assert _acc(compute_score(ds, wrong, truth)) == 0.0, (name, ds, wrong, truth)
        if grader_for(ds).package == "verl":  # verl's own scorer, unchanged
            assert compute_score(ds, right, truth) == default_compute_score(ds, right, truth)
        written.add(ds)
    assert written == {ds for s in SOURCES.values() for ds in s.data_sources}


def test_dapo_aime_asks_in_dapos_template_and_olympiad_reads_final_answer(tmp_path):
    (row,) = convert("aime24-dapo", _write(tmp_path / "a.jsonl", AIME))[0]
    assert row["prompt"][0]["content"] == DAPO_PROMPT.format(AIME[0]["Problem"])  # DAPO-Math-17k's own words
    (row,) = convert("olympiadbench", _write(tmp_path / "o.jsonl", OLYMPIAD))[0]
    assert row["reward_model"]["ground_truth"] == "\\frac{1}{2}" and row["extra_info"]["split"] == "test"
    (row,) = convert("minerva", _write(tmp_path / "m.jsonl", MINERVA))[0]
    assert row["reward_model"]["ground_truth"] == "3.0 \\times 10^{8}"  # the solution's last \boxed{}


def test_another_schema_is_refused_naming_the_missing_column(tmp_path):
    src = _write(tmp_path / "gsm8k.jsonl", GSM8K)
    proc = _cli("aime24", "--src", src, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not the aime24 schema" in proc.stderr and "missing column(s) problem/Problem;" in proc.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match="missing column\\(s\\) answer or solution"):
        convert("math", _write(tmp_path / "p.parquet", [{"problem": "x"}]))


def test_an_unknown_name_lists_the_allowed_ones(tmp_path):
    proc = _cli("gsm9k", "--src", tmp_path / "x.jsonl", "--out", tmp_path / "out")
    assert proc.returncode == 2 and "'gsm9k'" in proc.stderr
    assert all(f"'{name}'" in proc.stderr for name in SOURCES)
    with pytest.raises(DataError, match="unknown dataset 'gsm9k'; choose from gsm8k, math, dapo-math-17k"):
        convert("gsm9k", tmp_path / "x.jsonl")


def test_an_unparseable_answer_names_the_row_and_writes_nothing(tmp_path):
    src = _write(tmp_path / "gsm8k.parquet", [GSM8K[0], {"question": "q", "answer": "no marker, 5"}])
    proc = _cli("gsm8k", "--src", src, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "row 1 (gsm8k): column 'answer' has no final '#### <number>'" in proc.stderr
    assert not (tmp_path / "out").exists()
    bad = [MATH[0], {"problem": "p", "solution": "the answer is 3"}]
    with pytest.raises(DataError, match="row 1 \\(math\\): column 'solution' has no \\\\boxed"):
        prepare("math", _write(tmp_path / "math.jsonl", bad), tmp_path / "out")
    with pytest.raises(DataError, match="row 0 \\(aime24\\): column 'answer' is None"):
        convert("aime24", _write(tmp_path / "aime.jsonl", [{"problem": "p", "answer": None}]))
    assert not (tmp_path / "out").exists()


def test_missing_or_unreadable_files_are_named(tmp_path):
    with pytest.raises(DataError, match="nope.parquet: no such file"):
        convert("gsm8k", tmp_path / "nope.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="bad.parquet: not a readable parquet file"):
        convert("gsm8k", tmp_path / "bad.parquet")
    (tmp_path / "bad.jsonl").write_text(json.dumps(GSM8K[0]) + "\n{oops\n")
    with pytest.raises(DataError, match="bad.jsonl: line 2: not valid JSON"):
        convert("gsm8k", tmp_path / "bad.jsonl")
    (tmp_path / "data.csv").write_text("question,answer\n")
    with pytest.raises(DataError, match="unknown file type '.csv'"):
        convert("gsm8k", tmp_path / "data.csv")
    with pytest.raises(DataError, match="data.csv: exists and is not a directory"):
        prepare("gsm8k", _write(tmp_path / "g.jsonl", GSM8K), tmp_path / "data.csv")


def test_an_existing_output_is_kept_unless_forced(tmp_path):
    """Prepared data is what runs trained on: a second `prepare` to the same file is refused, the
    file untouched, until --force replaces it."""
    src = _write(tmp_path / "g.jsonl", GSM8K)
    assert _cli("gsm8k", "--src", src, "--out", tmp_path / "out").returncode == 0
    out = tmp_path / "out" / "gsm8k-train.parquet"
    before = out.read_bytes()
    one = _write(tmp_path / "one.jsonl", GSM8K[:1])
    proc = _cli("gsm8k", "--src", one, "--out", tmp_path / "out")
    assert proc.returncode == 2 and f"{out} exists" in proc.stderr and "--force" in proc.stderr, proc.stderr
    assert out.read_bytes() == before and len(_read(out)) == 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gsm8k-train.parquet"]
    proc = _cli("gsm8k", "--src", one, "--out", tmp_path / "out", "--force")
    assert proc.returncode == 0, proc.stderr
    assert len(_read(out)) == 1


def test_out_of_distribution_sets_ask_for_a_letter_or_code_and_keep_their_answers(tmp_path):
    """QaRL's ARC-c, GPQA and MMLU-Pro become lettered options (GPQA's right answer, shipped first, placed by a
    shuffle fixed per question), LiveCodeBench its stdin tests as JSON; a pickled test set is not read."""
    (gpqa,) = convert("gpqa", _write(tmp_path / "g.jsonl", GPQA))[0]
    again = convert("gpqa", _write(tmp_path / "g2.jsonl", GPQA))[0][0]
    letter = gpqa["reward_model"]["ground_truth"]
    assert again["reward_model"]["ground_truth"] == letter and f"{letter}. neutron" in gpqa["prompt"][0]["content"]
    (arc,) = convert("arc-c", _write(tmp_path / "a.jsonl", ARC_NUMBERED))[0]
    assert arc["reward_model"]["ground_truth"] == "C" and "C. Mars" in arc["prompt"][0]["content"]
    (mmlu,) = convert("mmlu-pro", _write(tmp_path / "m.jsonl", MMLU_PRO))[0]
    assert "J. 12" in mmlu["prompt"][0]["content"] and mmlu["data_source"] == "mmlu-pro"
    (code,) = convert("livecodebench", _write(tmp_path / "c.jsonl", LIVECODE))[0]
    assert json.loads(code["reward_model"]["ground_truth"])["tests"] == [{"input": "1 2\n", "output": "3\n"},
                                                                         {"input": "5 7\n", "output": "12\n"}]
    pickled = [{**LIVECODE[0], "private_test_cases": "eJzLSM3JyVcozy/KSQEAGgQEXQ=="}]
    with pytest.raises(DataError, match="not JSON .a pickled test set is not read"):
        convert("livecodebench", _write(tmp_path / "p.jsonl", pickled))
    functional = [{**LIVECODE[0], "public_test_cases": json.dumps([{"input": "[1]", "output": "1",
                                                                     "testtype": "functional"}])}]
    with pytest.raises(DataError, match="'functional' test; only stdin tests are run"):
        convert("livecodebench", _write(tmp_path / "f.jsonl", functional))
