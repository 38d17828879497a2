"""docs/architecture.md's "What each verb refuses", counted from the tests that check the refusals,
so the table cannot claim a refusal no test makes.

    python scripts/refusals_table.py          # print the table
    python scripts/refusals_table.py --write  # put it into docs/architecture.md (between its markers)

Sources: tests/test_bad_inputs.py (`suite run` configs), tests/test_bad_inputs_verbs.py (sweep and
tune files, verb flags), tests/test_verb_refusals.py (inputs on disk and around the machine, a
class per verb) and tests/test_env_faults.py (read-only and full file systems under a run).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- refusals:begin (scripts/refusals_table.py) -->", "<!-- refusals:end -->"
VERBS = ("run", "sweep", "status", "cancel", "tune", "report", "export", "data", "uaq", "eval", "sync", "bench")


def _tests_module(name: str):
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def _words(test_name: str) -> str:
    return test_name.removeprefix("test_").replace("_", " ")


def collect() -> dict[str, dict[str, int]]:
    """verb -> kind of refusal -> number of tested inputs."""
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for cls, _overrides, _key in _tests_module("test_bad_inputs").BAD:
        table["run"][f"config: {cls}"] += 1
    for cls, argv, _text, _names in _tests_module("test_bad_inputs_verbs").BAD:
        table[argv[0]][cls] += 1
    for klass in _tests_module("test_verb_refusals").CLASSES:
        verb = re.sub(r"(?<!^)(?=[A-Z])", " ", klass.__name__.removeprefix("Test")).lower().split()[0]
        for name, _ in inspect.getmembers(klass, inspect.isfunction):
            if name.startswith("test_"):
                table[verb][_words(name)] += 1
    env = _tests_module("test_env_faults")
    for name, _ in inspect.getmembers(env, inspect.isfunction):
        if name.startswith("test_"):
            table["run"]["file system: " + _words(name)] += 1
    return table


def render(table: dict[str, dict[str, int]]) -> str:
    lines = [BEGIN, "", "| verb | inputs refused (tested) | what |", "|---|---:|---|"]
    order = [v for v in VERBS if v in table] + sorted(set(table) - set(VERBS))
    for verb in order:
        kinds = table[verb]
        what = "; ".join(f"{k} ({n})" for k, n in sorted(kinds.items()))
        lines.append(f"| `suite {verb}` | {sum(kinds.values())} | {what} |")
    total = sum(sum(k.values()) for k in table.values())
    lines += ["", f"{total} tested inputs in all: each ends in exit 2 with one message naming the input and no "
              "traceback; a refusal leaves nothing created, and a disk that fills mid-run leaves the run resumable "
              "from its last checkpoint. The verbs' own test files (tests/*/test_*bad_files.py, "
              "test_data_prepare.py, test_export.py, test_eval_inputs.py) check more.", "", END]
    return "\n".join(lines)


def write(text: str) -> None:
    doc = DOC.read_text(encoding="utf-8")
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    DOC.write_text(doc[:start] + text + doc[end:], encoding="utf-8")


def current() -> str:
    doc = DOC.read_text(encoding="utf-8")
    return doc[doc.index(BEGIN):doc.index(END) + len(END)]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    text = render(collect())
    if args.write:
        write(text)
    else:
        print(text)
