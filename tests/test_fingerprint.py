"""scripts/fingerprint.py, the refactor check: two processes running the same code agree
bit for bit, and one changed value is named."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fingerprint.py"
CELL = "grpo-fp32-kl-ref"


def _run(out: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "run", "--out", str(out), "--cells", CELL],
                   check=True, capture_output=True, text=True, timeout=300)


def _compare(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "compare", str(a), str(b)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow  # ~15 s quiet: two processes train every fingerprint cell
def test_two_processes_agree_and_a_changed_value_is_named(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _run(a)
    _run(b)
    same = _compare(a, b)
    assert same.returncode == 0, same.stdout + same.stderr
    assert f"{CELL}: bit-identical" in same.stdout

    record = json.loads((b / f"{CELL}.json").read_text())
    step = sorted(record["metrics"], key=int)[-1]
    record["metrics"][step]["actor/pg_loss"] = "0" * 16
    (b / f"{CELL}.json").write_text(json.dumps(record))
    diff = _compare(a, b)
    assert diff.returncode == 1
    assert f"DIFFERENT at step {step}: actor/pg_loss" in diff.stdout

    record["metrics"][step]["actor/pg_loss"] = \
        json.loads((a / f"{CELL}.json").read_text())["metrics"][step]["actor/pg_loss"]
    key = sorted(k for k in record["checkpoint"] if k.startswith("/actor/"))[0]
    record["checkpoint"][key] = "changed"
    (b / f"{CELL}.json").write_text(json.dumps(record))
    diff = _compare(a, b)
    assert diff.returncode == 1 and f"checkpoint {key}" in diff.stdout
    os.remove(b / f"{CELL}.json")
    assert "present on one side only" in _compare(a, b).stdout
