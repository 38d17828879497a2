"""A real `mlflow server` stopped in the middle of a local sweep: the sweep trains through the
outage and ends with one line about the parent run's status; while the server is down a new
sweep and a report refuse at once (bounded by MLflow's own retry settings), naming the URI and
creating nothing, and `suite status` still answers from the run dirs; once the server is back,
`suite sync` sends the cell trained in the dark and re-running the sweep records the parent
FINISHED: every cell's every step is in MLflow once."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from _sweep_helpers import TINY, child_env, write_sweep
from mlflow_server import MlflowServer

pytestmark = pytest.mark.long  # the long tier (pyproject.toml, markers)

SUITE = [sys.executable, "-m", "suite.cli"]


@pytest.mark.slow  # ~90 s quiet: a server started twice and a two-cell sweep
def test_a_server_stopped_mid_sweep(tmp_path, monkeypatch):
    server = MlflowServer(tmp_path / "server")
    server.start()
    try:
        _outage(tmp_path, monkeypatch, server)
    finally:
        server.stop()


def _outage(tmp_path, monkeypatch, server):
    monkeypatch.setenv("SUITE_CACHE", str(tmp_path / "cache"))
    env = {**child_env(), "MLFLOW_TRACKING_URI": server.uri}
    runs = tmp_path / "runs"
    path = write_sweep(tmp_path / "dark.yaml", {
        "name": "dark", "base": [*TINY, "steps=6", f"out_dir={runs}"],
        "matrix": {"seed": [0, 1]}, "launcher": {"max_parallel": 1, "poll_s": 0.5}})

    def suite(*argv, **kw):
        return subprocess.run([*SUITE, *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
                              **kw)

    proc = subprocess.Popen([*SUITE, "sweep", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:  # the event: cell 0 finished
            if any((d / "summary.json").exists() for d in runs.glob("grpo-*")):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the sweep ended before the outage could begin"
        # at once: cell 1 needs seconds to start and train, the parent's status comes after it
        server.crash()
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "[2/2] done" in out, out
    assert f"MLflow at {server.uri} did not take the parent run's status FINISHED" in out, out
    assert "Traceback" not in out, out
    dirs = sorted(runs.glob("grpo-*"))
    assert len(dirs) == 2 and all((d / "summary.json").is_file() for d in dirs)

    # the server is down: refusals in one line naming it, nothing created; status answers
    other = write_sweep(tmp_path / "other.yaml", {"name": "other", "base": [*TINY, f"out_dir={runs}"],
                                                  "matrix": {"seed": [0]}})
    t0 = time.monotonic()
    refused = suite("sweep", str(other))
    took = time.monotonic() - t0
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"the MLflow tracking server at {server.uri} does not answer" in refused.stderr, refused.stderr
    assert not (runs / "_sweeps" / "other").exists()
    report = suite("report", str(path), "--out", str(tmp_path / "report"), "--no-notebook")
    assert report.returncode == 2 and server.uri in report.stderr, report.stderr
    assert not (tmp_path / "report").exists()
    status = suite("status", str(path))
    assert status.returncode == 0 and "done 2  (of 2)" in status.stdout, status.stdout + status.stderr
    # the refusal's time is MLflow's settings at work (seconds), not its defaults (minutes)
    assert took < 120, took

    server.start()
    for d in dirs:  # idempotent: the cell trained in the dark sends its steps, the other nothing
        synced = suite("sync", str(d))
        assert synced.returncode == 0, synced.stderr
    again = suite("sweep", str(path))
    assert again.returncode == 0 and "nothing to submit: 2/2 done" in again.stdout, again.stdout + again.stderr
    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name("suite")
    every = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in every if r.data.tags.get("suite.kind") == "sweep"]
    assert parent.info.status == "FINISHED"
    children = [r for r in every if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["seed"] for r in children) == ["0", "1"] and len(every) == 3
    for r in children:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/acc")] == [1, 2, 3, 4, 5, 6]
