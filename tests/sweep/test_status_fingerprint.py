"""`suite status` uses a launch's record without composing only when the record's fingerprint of
what composition depends on (suite.sweep.fingerprint) is the one computed now; anything that may
change a run id (the suite's code, an environment variable composition reads, the machine's ISA
cap) sends it back to composing, and what it then shows is what composing gives."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _sweep_helpers import TINY, child_env, write_sweep

from suite.config import Config
from suite.sweep import fingerprint
from suite.sweep.recorded import DEFAULT_OUT_DIR, RecordedCell, out_dir_of
from suite.sweep.spec import load_sweep
from suite.sweep.states import write_state_files

REPO = Path(__file__).resolve().parents[2]

# launch: compose every cell and write the record; status: what `suite status` loads
SCRIPT = """
import json, sys
from suite.sweep.spec import load_sweep
from suite.sweep.states import write_state_files
from suite.sweep.recorded import RecordedCell
path, mode = sys.argv[1], sys.argv[2]
if mode == "launch":
    write_state_files(load_sweep(path))
    ids = [c.run_id for c in load_sweep(path).cells]
else:
    s = load_sweep(path, recorded=True)
    ids = [c.run_id for c in s.cells]
    print(json.dumps({"recorded": all(isinstance(c, RecordedCell) for c in s.cells[1:]),
                      "composed": "torch" in sys.modules or "suite.config" in sys.modules, "ids": ids}))
    ids = [c.run_id for c in load_sweep(path).cells]
print(json.dumps({"full": ids}))
"""


@pytest.fixture
def sweep(tmp_path, sweep_env):
    return write_sweep(tmp_path / "s.yaml", {"name": "fp", "base": [*TINY, f"out_dir={tmp_path / 'runs'}"],
                                             "matrix": {"seed": [0, 1], "quant": ["int8", "bf16"]}})


def test_the_record_is_used_uncomposed_when_nothing_changed(sweep):
    full = load_sweep(str(sweep))
    write_state_files(full)
    rec = json.loads((Path(full.state_dir) / "matrix.json").read_text())
    assert "suite/config.py" in rec["composition"]["files"] and "suite/core/quant.py" in rec["composition"]["files"]
    got = load_sweep(str(sweep), recorded=True)
    assert all(isinstance(c, RecordedCell) and c._cfg is None for c in got.cells)  # not even cell 0 composed
    assert [(c.run_id, c.run_dir, c.overrides, c.steps) for c in got.cells] == \
        [(c.run_id, c.run_dir, c.overrides, c.steps) for c in full.cells]
    assert (got.state_dir, got.tracking_uri, got.experiment) == (full.state_dir, full.tracking_uri, full.experiment)


@pytest.mark.parametrize("env", [{"ATEN_CPU_CAPABILITY": "avx2"}, {"MLFLOW_TRACKING_URI": "sqlite:///other.db"}])
def test_an_environment_composition_reads_sends_status_back_to_composing(sweep, monkeypatch, env):
    """The ISA cap changes the resolved kernels (and so run ids on a VNNI / BF16 CPU); the tracking
    URI changes where the parent run is. Either way status must show what composing shows."""
    write_state_files(load_sweep(str(sweep)))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got = load_sweep(str(sweep), recorded=True)
    assert not all(isinstance(c, RecordedCell) and c._cfg is None for c in got.cells)
    want = load_sweep(str(sweep))
    assert [c.run_id for c in got.cells] == [c.run_id for c in want.cells]
    assert got.tracking_uri == want.tracking_uri


def test_an_old_record_or_a_changed_file_list_falls_back_to_composing_the_first_cell(sweep):
    full = load_sweep(str(sweep))
    write_state_files(full)
    path = Path(full.state_dir) / "matrix.json"
    rec = json.loads(path.read_text())
    for composition in (None, {"files": ["suite/no_such_module.py"], "digest": rec["composition"]["digest"]},
                        {"files": rec["composition"]["files"], "digest": "0" * 64}):
        rec["composition"] = composition
        path.write_text(json.dumps(rec))
        got = load_sweep(str(sweep), recorded=True)
        assert got.cells[0]._cfg is not None  # composed: its run id checked the record
        assert all(isinstance(c, RecordedCell) for c in got.cells[1:])
        assert [c.run_id for c in got.cells] == [c.run_id for c in full.cells]


def _run(tree: Path, sweep: Path, mode: str) -> list[dict]:
    env = {**child_env(), "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(sweep), mode], env=env, cwd=sweep.parent,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_a_changed_default_in_the_code_is_caught(tmp_path, sweep):
    """A copy of the suite launches; then its config.py changes: a comment (run ids unchanged) and
    a default (train.lr: every run id changes). Status in a fresh process, with that copy."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "suite", tree / "suite", ignore=shutil.ignore_patterns("__pycache__"))
    launched = _run(tree, sweep, "launch")[0]["full"]
    same = _run(tree, sweep, "status")
    assert same[0] == {"recorded": True, "composed": False, "ids": launched}

    config = tree / "suite" / "config.py"
    text = config.read_text()
    config.write_text(text + "\n# a comment: the fingerprint changes, the run ids do not\n")
    commented = _run(tree, sweep, "status")
    assert commented[0] == {"recorded": True, "composed": True, "ids": launched}  # checked by composing cell 0

    old = "    lr: float = 3e-5  # actor AdamW"
    assert old in text
    config.write_text(text.replace(old, "    lr: float = 4e-5  # actor AdamW"))
    changed = _run(tree, sweep, "status")
    assert changed[0]["recorded"] is False and changed[0]["ids"] == changed[1]["full"]
    assert not set(changed[0]["ids"]) & set(launched)  # every run id changed with the default


def test_status_looks_for_the_record_where_composing_puts_it():
    assert DEFAULT_OUT_DIR == Config().out_dir
    assert out_dir_of(["steps=3"]) == DEFAULT_OUT_DIR
    assert out_dir_of(["out_dir=/a/b", "seed=1", "out_dir=c"]) == "c"  # the last one wins, as in Hydra
    for unsure in (["out_dir=${oc.env:X}/runs"], ["out_dir='a b'"], ["~out_dir"], ["out_dir=a,b"]):
        assert out_dir_of(unsure) is None


def test_the_digest_reads_the_environment_the_sources_and_the_sweep_name(monkeypatch, tmp_path):
    files = fingerprint.loaded_files()
    assert files and "suite/sweep/fingerprint.py" in files
    base = fingerprint.digest(files, "name: x\n", [])
    assert base is not None and fingerprint.digest(files, "name: x\n", []) == base
    assert fingerprint.digest(files, "name: y\n", []) != base
    assert fingerprint.digest(files, "name: x\n", ["steps=2"]) != base
    # a variable named by an interpolation of the sweep file is read too
    text = "name: x\nbase: [out_dir='${oc.env:FP_TEST_DIR}/runs']\n"
    monkeypatch.setenv("FP_TEST_DIR", "/a")
    a = fingerprint.digest(files, text, [])
    monkeypatch.setenv("FP_TEST_DIR", "/b")
    assert fingerprint.digest(files, text, []) != a
    monkeypatch.chdir(tmp_path)  # a relative out_dir is relative to it
    assert fingerprint.digest(files, "name: x\n", []) != base


STATUS = """
import sys
from suite.cli import main
rc = main(["status", sys.argv[1]])
print("mlflow imported:", "mlflow" in sys.modules, "torch imported:", "torch" in sys.modules, "rc", rc)
"""


def test_status_of_an_ended_sweep_reads_the_parent_status_the_driver_recorded(sweep):
    """Every cell done: status names a parent run still RUNNING (asking MLflow), and takes an end
    the driver recorded from parent_run.json, without importing MLflow."""
    from mlflow.tracking import MlflowClient

    from suite.sweep.parent import parent_run, parent_status, set_parent_status

    full = load_sweep(str(sweep))
    write_state_files(full)
    rid = parent_run(full)
    for c in full.cells:  # the cells' end as a finished run leaves it (suite.tracking.rundir.is_finished)
        Path(c.run_dir).mkdir(parents=True)
        (Path(c.run_dir) / "summary.json").write_text("{}")

    def status() -> str:
        out = subprocess.run([sys.executable, "-c", STATUS, str(sweep)], env=child_env(), cwd=Path.cwd(),  # as launched
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout

    hint = "marks the MLflow parent run FINISHED"
    out = status()
    assert hint in out and "mlflow imported: True torch imported: False rc 0" in out  # RUNNING: asked MLflow
    set_parent_status(full, "FINISHED")
    assert json.loads((Path(full.state_dir) / "parent_run.json").read_text())["status"] == "FINISHED"
    assert MlflowClient(full.tracking_uri).get_run(rid).info.status == "FINISHED"
    out = status()
    assert hint not in out and "done 4  (of 4)" in out and "mlflow imported: False torch imported: False" in out
    set_parent_status(full, "RUNNING")  # a re-launch: the record of the end goes first
    assert "status" not in json.loads((Path(full.state_dir) / "parent_run.json").read_text())
    assert parent_status(full) == "RUNNING" and hint in status()
    MlflowClient(full.tracking_uri).set_terminated(rid, status="KILLED")  # as the driver's guard ends it
    assert parent_status(full) == "KILLED" and hint not in status()
