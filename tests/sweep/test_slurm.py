"""The SLURM launcher against the real dev cluster (`slurm_cluster`, slurm/dev-cluster.sh):
a job array with a failing cell, shell-quoting of values, cancel, and preemption/requeue
resuming from the checkpoint with no lost or duplicated steps."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import checkpoint_barrier
from _sweep_helpers import TINY, child_env, write_sweep
from suite.tracking.rundir import recorded_mlflow_run_id

pytestmark = [pytest.mark.long, pytest.mark.slurm, pytest.mark.slow]
SUITE = [sys.executable, "-m", "suite.cli"]


def _suite(*args, cwd, timeout=600):
    return subprocess.run([*SUITE, *args], capture_output=True, text=True, env=child_env(), cwd=cwd,
                          timeout=timeout)


def _jobs(state: Path) -> list[dict]:
    return [json.loads(x) for x in (state / "jobs.jsonl").read_text().splitlines()]


def _wait(cond, timeout_s: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    raise TimeoutError(f"{what} within {timeout_s} s")


def _children(uri: str):
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("suite").experiment_id])
    parents = [r for r in runs if r.data.tags.get("suite.kind") == "sweep"]
    return client, parents, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def test_job_array_with_a_failing_cell_lands_in_mlflow(slurm_cluster, tmp_path, sweep_env):
    uri, runs = sweep_env
    canary = tmp_path / "canary"
    canary.mkdir()
    base = {k: v for k, v in (x.split("=", 1) for x in TINY)}
    base.update({"out_dir": str(runs),
                 # values that a shell would execute: they must arrive in the run literally
                 "tracking.run_name": "$(touch pwned)", "+tracking.tags.note": f"; rm -rf {canary}"})
    path = write_sweep(tmp_path / "arr.yaml", {
        "name": "arr", "base": base, "matrix": {"seed": [0, 1]},
        # validates, then raises in the run: the warm-start cache cannot be created under /dev/null
        "include": [{"seed": 2, "warm_start.cache_dir": "/dev/null/warmstart"}],
        "launcher": {"name": "slurm", "profile": "dev", "max_parallel": 3, "poll_s": 1}})
    out = _suite("sweep", str(path), "--wait", cwd=tmp_path, timeout=900)
    assert out.returncode == 1, out.stdout + out.stderr  # one cell failed
    assert "submitted 3 cells as SLURM job array" in out.stdout
    state = runs / "_sweeps" / "arr"
    jobs = _jobs(state)
    arrays = {j["job_id"].split("_")[0] for j in jobs}
    assert len(arrays) == 1, jobs
    array = arrays.pop()
    assert sorted(j["job_id"] for j in jobs) == [f"{array}_{i}" for i in range(3)]
    st = _suite("status", str(path), cwd=tmp_path)
    lines = {ln.split()[0]: ln for ln in st.stdout.splitlines() if ln.strip()[:1].isdigit()}
    assert " done " in lines["0"] and " done " in lines["1"]
    assert " failed " in lines["2"] and "NotADirectoryError" in lines["2"]
    assert "done 2  failed 1  (of 3)" in st.stdout
    client, parents, children = _children(uri)
    assert len(parents) == 1 and parents[0].info.run_name == "arr" and parents[0].info.status == "FAILED"
    assert ({a.path for a in client.list_artifacts(parents[0].info.run_id)}
            >= {"sweep.yaml", "matrix.json", "matrix.csv"})
    by_cell = {r.data.tags["cell"]: r for r in children}
    assert set(by_cell) == {"0", "1", "2"}
    assert by_cell["0"].info.status == by_cell["1"].info.status == "FINISHED"
    assert by_cell["2"].info.status == "FAILED" and "Not a directory" in by_cell["2"].data.tags["error"]
    for r in children:
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id and r.data.tags["sweep"] == "arr"
        assert r.info.run_name == "$(touch pwned)"  # literal: no shell ever saw it
        assert r.data.tags["note"] == f"; rm -rf {canary}"
        assert r.data.tags["slurm_job_id"] in {j["job_id"] for j in jobs}  # the array task that ran it
        assert Path(r.data.tags["job_log"]).is_file()
    assert canary.is_dir() and not list(tmp_path.rglob("pwned"))
    script = next((state / "submitit").glob("*_submission.sh")).read_text()
    assert "touch" not in script and "rm -rf" not in script  # the cell travels as a pickle
    # each task is named after its cell in squeue / sacct
    assert {j["job_id"]: slurm_cluster.run("sacct", "-j", j["job_id"], "-X", "-n", "-o", "JobName%40").stdout.strip()
            for j in jobs} == {f"{array}_{i}": f"arr:{i}" for i in range(3)}
    # re-run: the failed cell is not re-submitted without --retry-failed, nothing else to do
    again = _suite("sweep", str(path), cwd=tmp_path)
    assert again.returncode == 1 and "submitting 0" in again.stdout
    assert len(_jobs(state)) == 3
    # --retry-failed: cell 2 alone, a job whose id says nothing of the cell; its name and status do
    retry = _suite("sweep", str(path), "--retry-failed", "--wait", cwd=tmp_path, timeout=900)
    assert retry.returncode == 1 and "submitting 1" in retry.stdout, retry.stdout + retry.stderr
    new = _jobs(state)[3]
    assert new["cell"] == 2 and not new["job_id"].endswith("_2")
    name = slurm_cluster.run("sacct", "-j", new["job_id"], "-X", "-n", "-o", "JobName%40").stdout.strip()
    assert name == "arr:2", name
    st = _suite("status", str(path), cwd=tmp_path)
    line = next(ln for ln in st.stdout.splitlines() if ln.split()[:1] == ["2"])
    assert line.split()[1:3] == ["failed", new["job_id"]], st.stdout
    # `suite eval` of the sweep scores its two finished cells as SLURM jobs (the sweep's launcher)
    ev = _suite("eval", str(path), "--precision", "fp32", "--benchmarks", "arith-d2", cwd=tmp_path, timeout=900)
    assert ev.returncode == 0, ev.stdout + ev.stderr
    assert "2 finished cell(s) of 3" in ev.stdout and "submitted 2 SLURM job(s)" in ev.stdout, ev.stdout
    from suite.evaluation import read_results

    for cell in ("0", "1"):
        run_dir = Path(by_cell[cell].data.tags["run_dir"]) if "run_dir" in by_cell[cell].data.tags else next(
            d for d in runs.glob("grpo-*") if (d / "summary.json").is_file()
            and json.loads((d / "mlflow_run.json").read_text())["run_id"] == by_cell[cell].info.run_id)
        (score,) = read_results(run_dir, 4)
        assert score.acc == json.loads((run_dir / "summary.json").read_text())["final_acc"]  # its own level, fp32
    assert list((runs / "_sweeps" / "arr" / "eval").glob("*_log.out"))  # submitit's logs of the eval jobs


def test_cancelled_sweep_ends_cleanly(slurm_cluster, tmp_path, sweep_env):
    uri, runs = sweep_env
    path = write_sweep(tmp_path / "can.yaml", {
        "name": "can", "base": [*TINY, "steps=400", "ckpt_every=50", f"out_dir={runs}"],
        "matrix": {"seed": [0, 1, 2]},
        "launcher": {"name": "slurm", "profile": "dev", "max_parallel": 2}})
    out = _suite("sweep", str(path), cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr  # submitted, not waited for
    state = runs / "_sweeps" / "can"
    ids = [j["job_id"] for j in _jobs(state)]
    # two run (array throttle %2), one waits
    _wait(lambda: sum(slurm_cluster.sacct_state(j).startswith("RUNNING") for j in ids) >= 1
          and any(recorded_mlflow_run_id(d) for d in runs.glob("grpo-*")), 180, "a cell running with its MLflow run")
    c = _suite("cancel", str(path), cwd=tmp_path)
    assert c.returncode == 0, c.stdout + c.stderr
    assert c.stdout.count("cancelled cell") == 3
    # tasks that started have their own sacct row; a never-started one is in the `ID_[k]` row
    started = [j for j in ids if slurm_cluster.sacct_state(j)]
    assert started
    for j in started:
        assert slurm_cluster.wait_state(j, ["CANCELLED"], timeout_s=60).startswith("CANCELLED")
    _wait(lambda: slurm_cluster.run("squeue", "-h", "-j", ids[0].split("_")[0], check=False).stdout.strip() == "",
          60, "the array gone from the queue")
    st = _suite("status", str(path), cwd=tmp_path)
    assert "cancelled 3  (of 3)" in st.stdout, st.stdout
    client, parents, children = _children(uri)
    assert parents[0].info.status == "KILLED"
    assert children and all(r.info.status == "KILLED" for r in children)


def test_preempted_run_requeues_and_resumes_from_its_checkpoint(slurm_cluster, tmp_path, sweep_env, monkeypatch):
    """Interrupted twice: submitit's preemption signal (USR2: checkpoint() + scontrol requeue),
    then a real preemption by a job of the higher-priority partition "urgent" (SLURM requeues).
    The run ends with every step exactly once in metrics.jsonl and in MLflow. Each interruption
    lands while the run holds at a barrier after a checkpoint (steps 2 and 4): events, not speed."""
    N = 12
    barrier = checkpoint_barrier.install(monkeypatch, tmp_path, (2, 4), when="after")

    uri, runs = sweep_env
    path = write_sweep(tmp_path / "pre.yaml", {
        "name": "pre", "base": [*TINY, f"steps={N}", "ckpt_every=2", "eval_every=4", f"out_dir={runs}"],
        "matrix": {"seed": [0]}, "launcher": {"name": "slurm", "profile": "dev"}})
    out = _suite("sweep", str(path), cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr
    state = runs / "_sweeps" / "pre"
    (job,) = _jobs(state)
    jid = job["job_id"]
    log_path = state / "submitit" / f"{jid}_0_log.out"
    try:
        _wait(lambda: barrier.reached(2), 300, "the run at its step-2 checkpoint")
        # Preemption as submitit's own test helper (SlurmJob._interrupt, private) simulates it:
        # SIGTERM, then the USR2 that submitit's handler answers with checkpoint() + requeue. SLURM
        # delivers each scancel's signal asynchronously, so USR2 waits until the TERM has landed:
        # a TERM still on its way killed the `scontrol requeue` that USR2's handler had started
        # (CI, 2026-12-04: "died with SIGTERM", the job never requeued).
        slurm_cluster.run("scancel", "--signal", "TERM", jid)
        _wait(lambda: "Bypassing signal SIGTERM" in log_path.read_text(), 60, "the job's SIGTERM handler")
        slurm_cluster.run("scancel", "--signal", "USR2", jid)
        _wait(lambda: barrier.reached(4), 420, "the requeued run at its step-4 checkpoint")
        assert "resuming from step 2" in log_path.read_text()
        urgent = slurm_cluster.run("sbatch", "--parsable", "-p", "urgent", "-c", str(slurm_cluster.n_cpus),
                                   "--wrap", "sleep 2").stdout.strip()
        slurm_cluster.wait_state(urgent, ["COMPLETED"], timeout_s=120)
        run_dir = next(iter(runs.glob("grpo-*")))
        _wait(lambda: (run_dir / "summary.json").exists(), 420, "the run finished after the requeues")
    finally:  # never leave a job waiting at a barrier
        barrier.release_all()

    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(0, N + 1))  # none lost, none duplicated
    log = log_path.read_text()
    assert "requeueing (resumes from the last checkpoint)" in log  # our checkpoint() ran
    assert "resuming from step 2" in log and "resuming from step 4" in log, log
    client, parents, children = _children(uri)
    assert len(children) == 1 and children[0].info.status == "FINISHED"
    for key in ("train/acc", "timing_s/step"):
        hist = sorted(m.step for m in client.get_metric_history(children[0].info.run_id, key))
        assert hist == list(range(1, N + 1)), (key, hist)
    st = _suite("status", str(path), cwd=tmp_path)
    assert "done 1  (of 1)" in st.stdout
