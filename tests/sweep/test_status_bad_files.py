"""`suite status` (and `suite sweep`) on a damaged sweep state dir: jobs.jsonl and parent_run.json
name the file, line and problem, exit 2, no traceback. A torn last line (its writer killed
mid-write) is not damage: it is skipped, and the next append cuts it off."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _sweep_helpers import TINY, write_sweep

from suite.cli import main
from suite.sweep.spec import load_sweep
from suite.launch.state_files import append_job, read_jobs


@pytest.fixture
def sweep(tmp_path, sweep_env):
    path = write_sweep(tmp_path / "s.yaml", {"name": "st", "base": [*TINY, f"out_dir={tmp_path / 'runs'}"],
                                             "matrix": {"seed": [0, 1]}})
    sw = load_sweep(str(path))
    (tmp_path / "runs" / "_sweeps" / "st").mkdir(parents=True)
    return sw


def _status(capsys, sw):
    try:
        code = main(["status", sw.path])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _rec(sw, i, **kw):
    return {"cell": i, "run_id": sw.cells[i].run_id, "job_id": "123", "launcher": "local", **kw}


BAD_JOBS = {
    "not JSON in the middle": (lambda sw: "{oops\n" + json.dumps(_rec(sw, 0)) + "\n", ["line 1", "not JSON"]),
    "a list, not a record": (lambda sw: "[1, 2]\n", ["line 1", "a JSON list, not a record"]),
    "no run id": (lambda sw: json.dumps({"cell": 0, "job_id": "1"}) + "\n", ["line 1: run_id: field required"]),
    "cell not an integer": (lambda sw: json.dumps({**_rec(sw, 0), "cell": "0"}) + "\n",
                            ["line 1: cell: must be a valid integer, got '0'"]),
    "an empty job id": (lambda sw: json.dumps({**_rec(sw, 0), "job_id": ""}) + "\n",
                        ["line 1: job_id: String should have at least 1 character"]),
    "not UTF-8": (lambda sw: "\udcff\n", ["not UTF-8"]),
}


@pytest.mark.parametrize("what", list(BAD_JOBS))
def test_a_damaged_jobs_file_is_named(what, sweep, capsys):
    text, words = BAD_JOBS[what]
    jobs = Path(sweep.state_dir) / "jobs.jsonl"
    jobs.write_bytes(text(sweep).encode("utf-8", "surrogateescape"))
    code, out, err = _status(capsys, sweep)
    assert code == 2 and str(jobs) in err and all(w in err for w in words), err
    assert "Traceback" not in err
    # the driver refuses it too, before submitting anything
    try:
        code = main(["sweep", sweep.path])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and str(jobs) in err, err
    assert not any(os.path.exists(c.run_dir) for c in sweep.cells)


def test_an_unreadable_jobs_file_is_named(sweep, capsys):
    jobs = Path(sweep.state_dir) / "jobs.jsonl"
    jobs.mkdir()
    code, out, err = _status(capsys, sweep)
    assert code == 2 and f"{jobs}: cannot read the sweep state file" in err, err


def test_a_torn_last_line_is_skipped_and_cut_by_the_next_append(sweep, capsys, tmp_path):
    jobs = Path(sweep.state_dir) / "jobs.jsonl"
    jobs.write_text(json.dumps(_rec(sweep, 0, cancelled=True)) + "\n" + '{"cell": 1, "run_')
    assert [r["cell"] for r in read_jobs(jobs)] == [0]
    code, out, err = _status(capsys, sweep)
    assert code == 0 and "cancelled 1" in out, out + err
    append_job(jobs, _rec(sweep, 1, cancelled=True))
    assert jobs.read_text().splitlines()[1] == json.dumps(_rec(sweep, 1, cancelled=True))
    assert [r["cell"] for r in read_jobs(jobs)] == [0, 1]


def test_a_damaged_parent_record_is_named_when_status_reads_it(sweep, capsys):
    for c in sweep.cells:  # every cell done: status then reads the parent run's status, through its record
        os.makedirs(c.run_dir)
        (Path(c.run_dir) / "summary.json").write_text("{}")
    parent = Path(sweep.state_dir) / "parent_run.json"
    parent.write_text("{truncated")
    code, out, err = _status(capsys, sweep)
    assert code == 2 and f"{parent}: not JSON" in err and "Traceback" not in err, err
