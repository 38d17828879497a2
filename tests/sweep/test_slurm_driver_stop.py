"""A `suite sweep --wait` driver of a SLURM job array, stopped with SIGTERM: it cancels the array
tasks it submitted (submitit's cancel: scancel), waits until SLURM has ended them, ends their
MLflow runs KILLED and the parent KILLED. Real dev cluster (`slurm_cluster`), real sqlite MLflow."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from _sweep_helpers import TINY, child_env, write_sweep
from suite.tracking.rundir import recorded_mlflow_run_id

pytestmark = [pytest.mark.long, pytest.mark.slurm, pytest.mark.slow]
SUITE = [sys.executable, "-m", "suite.cli"]


def test_sigterm_to_a_waiting_slurm_driver_cancels_its_array(slurm_cluster, tmp_path, sweep_env):
    uri, runs = sweep_env
    path = write_sweep(tmp_path / "st.yaml", {
        "name": "st", "base": [*TINY, "steps=400", "ckpt_every=50", f"out_dir={runs}"],
        "matrix": {"seed": [0, 1, 2]},
        "launcher": {"name": "slurm", "profile": "dev", "max_parallel": 2, "poll_s": 1}})
    proc = subprocess.Popen([*SUITE, "sweep", str(path), "--wait"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=tmp_path)
    state = runs / "_sweeps" / "st"
    try:
        deadline = time.monotonic() + 300
        # a cell running with its MLflow run made (mlflow_run.json is written before the run exists)
        while not any(recorded_mlflow_run_id(d) for d in runs.glob("grpo-*")):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "no cell started"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 130
        text = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "cancelling 3 job(s)" in text, text
    ids = [json.loads(x)["job_id"] for x in (state / "jobs.jsonl").read_text().splitlines()]
    array = ids[0].split("_")[0]
    assert slurm_cluster.run("squeue", "-h", "-j", array, check=False).stdout.strip() == ""  # nothing left
    client = MlflowClient(uri)
    all_runs = client.search_runs([client.get_experiment_by_name("suite").experiment_id])
    parent = next(r for r in all_runs if r.data.tags.get("suite.kind") == "sweep")
    assert parent.info.status == "KILLED"
    children = [r for r in all_runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert children and all(r.info.status == "KILLED" for r in children), [r.info.status for r in children]
    st = subprocess.run([*SUITE, "status", str(path)], capture_output=True, text=True, env=child_env(),
                        cwd=tmp_path, timeout=300)
    assert "cancelled 3  (of 3)" in st.stdout, st.stdout
