"""tests/xdist_groups.py under a real `pytest -n 2`: tests sharing a module fixture run on one
worker, which builds the fixture once; tests sharing nothing still spread over both workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CONFTEST = 'pytest_plugins = ["xdist_groups"]\n'
TEST_FILE = '''
import json, os, time
import pytest

LOG = os.environ["GROUPS_LOG"]


def _log(**kw):
    with open(LOG, "a") as f:
        f.write(json.dumps({"worker": os.environ["PYTEST_XDIST_WORKER"], **kw}) + "\\n")


@pytest.fixture(scope="module")
def costly():
    _log(built="costly")
    return 1


@pytest.mark.parametrize("i", range(8))
def test_shares(costly, i):
    time.sleep(0.1)
    _log(test=f"shares{i}")


@pytest.mark.parametrize("i", range(8))
def test_alone(i):
    time.sleep(0.1)
    _log(test=f"alone{i}")
'''


@pytest.mark.slow  # ~5 s: a pytest session with two xdist workers
def test_tests_sharing_a_module_fixture_run_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_groups.py").write_text(TEST_FILE)
    log = tmp_path / "log.jsonl"
    env = dict(os.environ, GROUPS_LOG=str(log), PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    built = [r for r in rows if r.get("built")]
    shared = {r["worker"] for r in rows if r.get("test", "").startswith("shares")}
    assert len(built) == 1 and shared == {built[0]["worker"]}, rows
    assert len([r for r in rows if r.get("test")]) == 16
    assert {r["worker"] for r in rows} == {"gw0", "gw1"}, rows  # the rest is still spread
