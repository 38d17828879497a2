"""`suite data prepare NAME --src FILE --out DIR`: a local copy of a public math dataset as verl's RL parquet.

verl's trainer reads rows of `data_source`, `prompt` (chat messages), `ability`, `reward_model`
({style, ground_truth}) and `extra_info` ({split, index}). `verl.utils.reward_score.default_compute_score`
picks the scorer from `data_source` alone, so every dataset here writes only data_source values that
function dispatches (each listed in its `Source.data_sources`; the tests score a right and a wrong answer
for each). Nothing is downloaded: the user points --src at the published file they already have.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from suite.scoring.answers import last_boxed

# The prompt suffixes of verl's examples/data_preprocess/gsm8k.py and math_dataset.py.
GSM8K_SUFFIX = ' Let\'s think step by step and output the final answer after "####".'
BOXED_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."
# DAPO-Math-17k's prompt (its `prompt` column; DAPO's AIME validation set asks the same way)
DAPO_TEMPLATE = ("Solve the following math problem step by step. The last line of your response should be of the form "
                 "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
                 "Remember to put your answer on its own line after \"Answer:\".")


class DataError(ValueError):
    """A file that cannot become the named dataset; the message names the file and the column or row."""


class _RowError(ValueError):
    """One record that cannot be converted; `prepare` adds the file and the row index."""


@dataclass(frozen=True)
class Source:
    """One dataset: the columns it reads, how a record becomes (data_source, messages, ground_truth)."""

    published: str  # where the schema comes from, for messages and docs
    required: tuple[tuple[str, ...], ...]  # each column with its accepted spellings; the first is the name used
    optional: tuple[str, ...]  # read when present (MATH-500's `answer`)
    split: str  # the default --split: how the papers use it (train or test)
    data_sources: tuple[str, ...]  # every data_source it may write; each dispatched by default_compute_score
    convert: Callable[[dict, frozenset], tuple[str, list[dict], str]]  # (record, columns present) -> row parts
    any_of: tuple[str, ...] = ()  # at least one of these optional columns must be present
    dedup_prompts: bool = False  # keep only the first row of each prompt


def _text(value, column: str) -> str:
    """A cell as a non-empty string; integer answers (AIME's 72, AMC's 27.0) as their digits."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise _RowError(f"column {column!r} is {value!r}, not a non-empty string or number")
    return value.strip()


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def _gsm8k(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
    # the ground truth as verl's gsm8k example and scorer read it: the number after "#### ", commas removed
    found = re.findall(r"#### (\-?[0-9\.\,]+)", _text(rec["answer"], "answer"))
    if not found:
        raise _RowError("column 'answer' has no final '#### <number>'")
    return "openai/gsm8k", _user(_text(rec["question"], "question") + GSM8K_SUFFIX), found[-1].replace(",", "")


def _math(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
    prompt = _user(_text(rec["problem"], "problem") + BOXED_SUFFIX)
    if "answer" in columns:  # MATH-500 ships the extracted answer
        return "HuggingFaceH4/MATH-500", prompt, _text(rec["answer"], "answer")
    answer = last_boxed(_text(rec["solution"], "solution"))
    if answer is None:
        raise _RowError("column 'solution' has no \\boxed{...} answer")
    return "DigitalLearningGmbH/MATH-lighteval", prompt, answer


def _dapo(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
    prompt = rec["prompt"]
    if not (isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt)):
        raise _RowError("column 'prompt' is not a non-empty list of {role, content} messages")
    reward = rec["reward_model"]
    if not isinstance(reward, dict) or "ground_truth" not in reward:
        raise _RowError("column 'reward_model' has no 'ground_truth'")
    # the published prompt asks for "Answer: ..." on the last line, which math_dapo's scorer reads; the file's
    # own data_source column (math_dapo) only identifies the schema
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    return "math_dapo", messages, _text(reward["ground_truth"], "reward_model.ground_truth")


def _boxed(data_source: str) -> Callable[[dict, frozenset], tuple[str, list[dict], str]]:
    def convert(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
        return data_source, _user(_text(rec["problem"], "problem") + BOXED_SUFFIX), _text(rec["answer"], "answer")

    return convert


def _dapo_template(data_source: str) -> Callable[[dict, frozenset], tuple[str, list[dict], str]]:
    """A competition set in DAPO-Math-17k's own prompt (the "Answer:" line its scorer reads), as
    DAPO validates on AIME: a policy trained on that template is asked the same way."""
    def convert(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
        prompt = _user(DAPO_TEMPLATE.format(_text(rec["problem"], "problem")))
        return data_source, prompt, _text(rec["answer"], "answer")

    return convert


def _final_answer(rec: dict, columns: frozenset) -> str:
    """The ground truth of a record: its `answer`, else OlympiadBench's `final_answer` (a list: the
    first, $ signs stripped), else the last \boxed{} of its `solution`."""
    if "answer" in columns and rec.get("answer") not in (None, ""):
        return _text(rec["answer"], "answer")
    if "final_answer" in columns and rec.get("final_answer") not in (None, "", []):
        value = rec["final_answer"]
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        return _text(value, "final_answer").strip("$").strip()
    if "solution" in columns and isinstance(rec.get("solution"), str):
        found = last_boxed(rec["solution"])
        if found is not None:
            return found
    raise _RowError("no answer: column 'answer' or 'final_answer' empty, and no \\boxed{...} in 'solution'")


def _suite_scored(data_source: str) -> Callable[[dict, frozenset], tuple[str, list[dict], str]]:
    """A held-out set graded by suite.verl.reward (a data_source verl has no scorer for)."""
    def convert(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
        return data_source, _user(_text(rec["problem"], "problem") + BOXED_SUFFIX), _final_answer(rec, columns)

    return convert


_PROBLEM_ANSWER = (("problem", "Problem"), ("answer", "Answer"))

# QaRL's out-of-distribution columns (Table 1): multiple choice graded by suite.scoring.choice, code by
# suite.scoring.code. QaRL's prompts are not published; these ask for the letter in a box, or one code block.
CHOICE_SUFFIX = "\n\nAnswer with the letter of the correct option within \\boxed{}."
CODE_SUFFIX = ("\n\nRead the input from standard input and write the answer to standard output. Give your solution "
               "as one ```python code block.")


def _lettered(question: str, options: list[str]) -> list[dict]:
    from suite.scoring.choice import LETTERS

    if not 2 <= len(options) <= len(LETTERS):
        raise _RowError(f"{len(options)} options; a question has 2 to {len(LETTERS)}")
    body = "\n".join(f"{LETTERS[i]}. {_text(o, 'option')}" for i, o in enumerate(options))
    return _user(f"{question}\n\n{body}{CHOICE_SUFFIX}")


def _arc(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
    choices = rec["choices"]
    if not isinstance(choices, dict) or not isinstance(choices.get("text"), (list, tuple)):
        raise _RowError("column 'choices' is not {text: [...], label: [...]}")
    labels = [str(x) for x in choices.get("label") or []]
    key = _text(rec["answerKey"], "answerKey")
    if key not in labels:
        raise _RowError(f"answerKey {key!r} is none of the labels {labels}")
    from suite.scoring.choice import LETTERS

    return "arc-c", _lettered(_text(rec["question"], "question"), list(choices["text"])), LETTERS[labels.index(key)]


def _gpqa(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
    import hashlib
    import random

    from suite.scoring.choice import LETTERS

    question = _text(rec["Question"], "Question")
    right = _text(rec["Correct Answer"], "Correct Answer")
    options = [right] + [_text(rec[f"Incorrect Answer {i}"], f"Incorrect Answer {i}") for i in (1, 2, 3)]
    # GPQA ships the right answer first: a fixed shuffle per question (seeded by its text) places it
    random.Random(hashlib.sha256(question.encode()).digest()).shuffle(options)
    return "gpqa", _lettered(question, options), LETTERS[options.index(right)]


def _mmlu_pro(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
    options = rec["options"]
    if not isinstance(options, (list, tuple)):
        raise _RowError("column 'options' is not a list")
    from suite.scoring.choice import LETTERS

    answer = _text(rec["answer"], "answer").upper()
    if answer not in LETTERS[:len(options)]:
        raise _RowError(f"answer {answer!r} is not one of the {len(options)} options' letters")
    return "mmlu-pro", _lettered(_text(rec["question"], "question"), list(options)), answer


def _stdin_tests(value, column: str) -> list[dict]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            # LiveCodeBench's private tests may be a base64 zlib pickle: unpickling runs code, so it is not read
            raise _RowError(f"column {column!r} is not JSON (a pickled test set is not read: unpickling runs code)"
                            ) from None
    if not isinstance(value, list):
        raise _RowError(f"column {column!r} is not a list of tests")
    out = []
    for t in value:
        if not (isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)):
            raise _RowError(f"column {column!r} holds a test that is not {{input, output}} strings")
        if t.get("testtype", "stdin") != "stdin":
            raise _RowError(f"column {column!r} holds a {t['testtype']!r} test; only stdin tests are run")
        out.append({"input": t["input"], "output": t["output"]})
    return out


def _livecodebench(rec: dict, columns: frozenset) -> tuple[str, list[dict], str]:
    from suite.scoring.code import TIME_LIMIT_S

    tests = _stdin_tests(rec["public_test_cases"], "public_test_cases")
    if "private_test_cases" in columns and rec.get("private_test_cases") not in (None, "", "[]"):
        tests += _stdin_tests(rec["private_test_cases"], "private_test_cases")
    if not tests:
        raise _RowError("no tests")
    truth = json.dumps({"tests": tests, "time_limit_s": TIME_LIMIT_S})
    return "livecodebench", _user(_text(rec["question_content"], "question_content") + CODE_SUFFIX), truth


# default_compute_score (verl/utils/reward_score/__init__.py) dispatches: "openai/gsm8k" -> gsm8k.py (the number
# after ####); the MATH names -> math_reward.py (last \boxed{}, MATH string normalisation: \frac12 == \dfrac{1}{2});
# "math_dapo", "math" and "aime*" -> math_dapo.py ("Answer:" line, else the last \boxed{} compared verbatim);
# "numina_*" -> prime_math (last \boxed{} or "answer is", sympy equality).
SOURCES: dict[str, Source] = {
    "gsm8k": Source("openai/gsm8k", (("question",), ("answer",)), (), "train", ("openai/gsm8k",), _gsm8k),
    "math": Source("hendrycks MATH / HuggingFaceH4/MATH-500", (("problem",),), ("answer", "solution"), "test",
                   ("HuggingFaceH4/MATH-500", "DigitalLearningGmbH/MATH-lighteval"), _math,
                   any_of=("answer", "solution")),
    "dapo-math-17k": Source("BytedTsinghua-SIA/DAPO-Math-17k", (("data_source",), ("prompt",), ("reward_model",)),
                            (), "train", ("math_dapo",), _dapo, dedup_prompts=True),
    # DeepScaleR's answers are MATH-style LaTeX (\frac{1}{2}, 2\sqrt{3}) asked for in \boxed{}: math_reward's
    # normalised comparison accepts equivalent spellings where math_dapo's verbatim one would not. "lighteval/MATH"
    # is the one MATH name `math` never writes, so per-data_source metrics keep the two apart.
    "deepscaler": Source("agentica-org/DeepScaleR-Preview-Dataset", _PROBLEM_ANSWER, (), "train",
                         ("lighteval/MATH",), _boxed("lighteval/MATH")),
    # AIME answers are integers 0-999, so math_dapo's verbatim \boxed{} comparison is exact enough.
    "aime24": Source("AIME 2024 (problem, answer)", _PROBLEM_ANSWER, (), "test", ("aime2024",), _boxed("aime2024")),
    "aime25": Source("AIME 2025 (problem, answer)", _PROBLEM_ANSWER, (), "test", ("aime2025",), _boxed("aime2025")),
    # no "amc" scorer exists; numina_amc_aime is the name that says AMC, and prime_math grades 27 == 27.0.
    "amc": Source("AMC 2023 (problem, answer)", _PROBLEM_ANSWER, (), "test", ("numina_amc_aime",),
                  _boxed("numina_amc_aime")),
    # AIME in DAPO's "Answer:" template (QuRL's DAPO setting trains on that template); math_dapo reads
    # the "Answer:" line, which every aime* data_source selects
    "aime24-dapo": Source("AIME 2024 (problem, answer), in DAPO-Math-17k's prompt", _PROBLEM_ANSWER, (), "test",
                          ("aime2024",), _dapo_template("aime2024")),
    "aime25-dapo": Source("AIME 2025 (problem, answer), in DAPO-Math-17k's prompt", _PROBLEM_ANSWER, (), "test",
                          ("aime2025",), _dapo_template("aime2025")),
    # MATH-500 alone (HuggingFaceH4/MATH-500: its `answer` column), MATH's normalised \boxed{} scorer
    "math500": Source("HuggingFaceH4/MATH-500", _PROBLEM_ANSWER, ("solution",), "test",
                      ("HuggingFaceH4/MATH-500",), _math),
    # Minerva-Math and OlympiadBench answers carry units, decimals and LaTeX forms verl has no scorer
    # for: suite.verl.reward grades them (units stripped, PRIME's equivalence); their own data_source
    # names keep each benchmark's metrics apart
    "minerva": Source("Minerva-Math (problem or question; answer, or solution with \\boxed{})",
                      (("problem", "question"),), ("answer", "solution"), "test", ("minerva_math",),
                      _suite_scored("minerva_math"), any_of=("answer", "solution")),
    "olympiadbench": Source("OlympiadBench (question; final_answer list, or answer)", (("problem", "question"),),
                            ("answer", "final_answer", "solution"), "test", ("olympiadbench",),
                            _suite_scored("olympiadbench"), any_of=("answer", "final_answer")),
    # QaRL's training set: OpenR1-Math-220k's schema (problem, answer), the 46K subset it trains on
    # QaRL's out-of-distribution columns (Table 1: pass@1; LiveCodeBench pass@4), graded by suite.scoring
    "arc-c": Source("allenai/ai2_arc ARC-Challenge (question, choices {text, label}, answerKey)",
                    (("question",), ("choices",), ("answerKey",)), (), "test", ("arc-c",), _arc),
    "gpqa": Source("Idavidrein/gpqa (Question, Correct Answer, Incorrect Answer 1-3)",
                   (("Question",), ("Correct Answer",), ("Incorrect Answer 1",), ("Incorrect Answer 2",),
                    ("Incorrect Answer 3",)), (), "test", ("gpqa",), _gpqa),
    "mmlu-pro": Source("TIGER-Lab/MMLU-Pro (question, options, answer letter)",
                       (("question",), ("options",), ("answer",)), (), "test", ("mmlu-pro",), _mmlu_pro),
    "livecodebench": Source("livecodebench/code_generation_lite (question_content, public_test_cases and "
                            "private_test_cases as JSON stdin tests)", (("question_content",), ("public_test_cases",)),
                            ("private_test_cases",), "test", ("livecodebench",), _livecodebench),
    "openr1-math": Source("open-r1/OpenR1-Math-220k schema (problem, answer): QaRL's OpenR1-Math-46K",
                          _PROBLEM_ANSWER, ("solution",), "train", ("openr1_math",), _suite_scored("openr1_math"),
                          dedup_prompts=True),
}


def _columns(source: Source, name: str, src: Path, present: list[str]) -> dict[str, str]:
    """The file's column for each canonical name the source reads; a missing required one is a DataError."""
    chosen, missing = {}, []
    for spellings in source.required:
        hit = next((s for s in spellings if s in present), None)
        if hit is None:
            missing.append("/".join(spellings))
        else:
            chosen[spellings[0]] = hit
    if source.any_of and not set(source.any_of) & set(present):
        missing.append(" or ".join(source.any_of))
    if missing:
        raise DataError(f"{src}: not the {name} schema ({source.published}): missing column(s) "
                        f"{', '.join(missing)}; it has {', '.join(present) or 'no columns'}")
    chosen.update({c: c for c in source.optional if c in present})
    return chosen


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("needs pyarrow, which the verl extra brings: pip install -e '.[verl]'") from None
    return pa, pq


def read_records(source: Source, name: str, src: Path) -> tuple[list[dict], frozenset]:
    """The records of a .parquet or JSON (.jsonl lines, or a .json array) file, keyed by canonical column name."""
    if not src.is_file():
        raise DataError(f"{src}: no such file")
    suffix = src.suffix.lower()
    if suffix == ".parquet":
        pa, pq = _pyarrow()
        try:
            cols = _columns(source, name, src, pq.read_schema(src).names)
            rows = pq.read_table(src, columns=list(cols.values())).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{src}: not a readable parquet file: {exc}") from None
    elif suffix in (".jsonl", ".json"):
        try:
            text = src.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{src}: cannot read: {exc}") from None
        rows = _parse_json(text, src)
        present = list(dict.fromkeys(k for r in rows for k in r))
        cols = _columns(source, name, src, present)
    else:
        raise DataError(f"{src}: unknown file type {suffix!r}; expected .parquet, .jsonl or .json")
    if not rows:
        raise DataError(f"{src}: no rows")
    return [{c: r.get(f) for c, f in cols.items()} for r in rows], frozenset(cols)


def _parse_json(text: str, src: Path) -> list[dict]:
    if text.lstrip().startswith("["):  # deepscaler.json is one array
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{src}: not valid JSON: {exc}") from None
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{src}: line {n}: not valid JSON: {exc}") from None
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise DataError(f"{src}: record {bad} is not a JSON object")
    return rows


def convert(name: str, src: str | os.PathLike, split: str | None = None) -> tuple[list[dict], int]:
    """The verl rows of dataset NAME read from src, and how many repeated prompts were dropped."""
    if name not in SOURCES:
        raise DataError(f"unknown dataset {name!r}; choose from {', '.join(SOURCES)}")
    if split not in (None, "train", "test"):
        raise DataError(f"split {split!r}: choose train or test")
    source, src = SOURCES[name], Path(src)
    split = split or source.split
    records, columns = read_records(source, name, src)
    rows, seen, dropped = [], set(), 0
    for i, rec in enumerate(records):
        try:
            data_source, prompt, truth = source.convert(rec, columns)
        except _RowError as exc:
            raise DataError(f"{src}: row {i} ({name}): {exc}") from None
        if source.dedup_prompts:
            key = tuple((m["role"], m["content"]) for m in prompt)
            if key in seen:
                dropped += 1
                continue
            seen.add(key)
        rows.append({"data_source": data_source, "prompt": prompt, "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": truth},
                     "extra_info": {"split": split, "index": len(rows)}})
    return rows, dropped


def prepare(name: str, src: str | os.PathLike, out_dir: str | os.PathLike, split: str | None = None, *,
            force: bool = False) -> Path:
    """Write OUT_DIR/NAME-SPLIT.parquet; on any error a DataError and nothing written. An existing
    output is replaced only with `force` (a dataset prepared once is what runs were trained on)."""
    from suite.tracking.fscheck import writable_problem

    pa, pq = _pyarrow()
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--out {out_dir}: exists and is not a directory")
    source = SOURCES.get(name)
    if source is not None and split in (None, "train", "test"):  # else convert names the bad value
        path = out_dir / f"{name}-{split or source.split}.parquet"
        if path.exists() and not force:
            raise DataError(f"{path} exists (prepared before); pass --force to replace it, or choose another --out")
        if (problem := writable_problem(path, "--out")) is not None:
            raise DataError(problem)
    rows, dropped = convert(name, src, split)
    split = rows[0]["extra_info"]["split"]
    path = out_dir / f"{name}-{split}.parquet"
    tmp = None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, path)  # atomic: a reader never sees half a file
    except OSError as exc:
        raise DataError(f"{path}: cannot write: {exc}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
    sources = ", ".join(sorted({r["data_source"] for r in rows}))
    note = f"; dropped {dropped} repeated prompts" if dropped else ""
    print(f"wrote {len(rows)} rows to {path} (data_source {sources}, split {split}{note})")
    if repeats := _repeats(rows):  # kept (the file is the benchmark as given), but never silently
        pairs = ", ".join(f"{a} = {b}" for a, b in repeats[:5]) + (" ..." if len(repeats) > 5 else "")
        what = "a held-out set scores each copy, so that problem weighs more in the accuracy" if split == "test" \
            else "each copy is trained on"
        print(f"note: {len(repeats)} row(s) repeat an earlier row's prompt (rows {pairs}); kept as the source has "
              f"them: {what}; check {src}")
    return path


def _repeats(rows: list[dict]) -> list[tuple[int, int]]:
    """(first row, repeating row) for every row whose prompt an earlier row has."""
    first: dict[tuple, int] = {}
    out = []
    for i, r in enumerate(rows):
        key = tuple((m["role"], m["content"]) for m in r["prompt"])
        if key in first:
            out.append((first[key], i))
        else:
            first[key] = i
    return out


def cmd_prepare(args: argparse.Namespace) -> int:
    try:
        prepare(args.name, args.src, args.out, args.split, force=args.force)
    except DataError as exc:
        print(f"suite data prepare: {exc}", file=sys.stderr)
        return 2
    return 0


PREPARE_HELP = """Convert a local copy of a public math dataset into verl's RL parquet (OUT/NAME-SPLIT.parquet).

    suite data prepare gsm8k --src gsm8k/main/train-00000-of-00001.parquet --out data
    suite data prepare aime24 --src aime_2024.jsonl --out data          # split test

Inputs: .parquet, .jsonl, or .json (lines or one array). docs/verl.md lists each NAME's columns,
the data_source written and the verl scorer it selects.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "data", help="prepare datasets for the verl backend",
        description="Convert a local copy of a public dataset (no hub is reached) into verl's RL parquet, with the\n"
                    "data_source its grader is chosen by (docs/verl.md has the table): `suite data prepare -h`.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="data_command", required=True)
    pp = verbs.add_parser("prepare", help="convert a local public math dataset into verl's RL parquet",
                          description=PREPARE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    pp.add_argument("name", metavar="NAME", choices=tuple(SOURCES), help="the dataset: " + ", ".join(SOURCES))
    pp.add_argument("--src", required=True, help="the local file in the dataset's published schema")
    pp.add_argument("--out", required=True, help="output directory (created if absent)")
    defaults = ", ".join(f"{n} {s.split}" for n, s in SOURCES.items())
    pp.add_argument("--split", choices=("train", "test"), default=None,
                    help=f"recorded in extra_info and the file name; by default {defaults}")
    pp.add_argument("--force", action="store_true", help="replace OUT/NAME-SPLIT.parquet if it exists")
    pp.set_defaults(func=cmd_prepare)
