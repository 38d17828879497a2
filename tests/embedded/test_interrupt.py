"""Ctrl-C on `suite run`: one line (no traceback), the MLflow run KILLED, and the exact command that
resumes it; following that command finishes the run with every step once.

The SIGINT is sent while the run is held at its step-4 checkpoint (tests/checkpoint_barrier.py), so
it lands at a known point however fast the machine steps."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

import checkpoint_barrier
from test_run import TINY

pytestmark = pytest.mark.long  # the long tier (pyproject.toml, markers)


@pytest.mark.slow
def test_ctrl_c_ends_the_run_killed_and_names_the_command_that_resumes_it(tmp_path, monkeypatch):
    barrier = checkpoint_barrier.install(monkeypatch, tmp_path, (4,), when="after")
    db = tmp_path / "mlflow.db"
    argv = ["run", *TINY, "--no-progress", f"out_dir={tmp_path / 'runs'}",  # an option among the overrides
            f"warm_start.cache_dir={tmp_path / 'cache'}", f"tracking.tracking_uri=sqlite:///{db}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(checkpoint_barrier.interactive("suite.cli", *argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 600
    while not barrier.reached(4):  # the event: the run holds at its step-4 checkpoint
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the run never reached its step-4 checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = checkpoint_barrier.communicate(proc, 300, barrier=barrier)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("suite run:")]
    assert len(lines) == 1, err
    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("suite").experiment_id])
    assert run.info.status == "KILLED"
    assert lines[0].startswith(f"suite run: interrupted; MLflow run {run.info.run_id} marked KILLED. Resume from "
                               "the last checkpoint (step 4) with: suite run "), lines[0]
    command = lines[0].split(" with: ", 1)[1]
    assert shlex.split(command) == ["suite", *argv]  # exactly what was typed, options where they were

    barrier.release_all()
    done = subprocess.run([sys.executable, "-m", "suite.cli", *shlex.split(command)[1:]], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/acc")]
    assert sorted(steps) == list(range(1, 7)), steps  # every step once: none lost, none twice
