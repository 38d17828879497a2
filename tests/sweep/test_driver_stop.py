"""A sweep or tune driver that stops early (SIGTERM, a poll that raises) stops every job it
started, ends their MLflow runs KILLED and its parent KILLED or FAILED, and a re-run finishes
the rest without running a finished cell twice. Real `suite` processes, submitit's local
executor and a real sqlite MLflow store. Each driver is stopped while its cells hold at their
step-2 checkpoint (tests/checkpoint_barrier.py), so the runs are short and the stop always lands
mid-run, however fast the machine steps."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from procs import kill_procs_naming, procs_naming
import checkpoint_barrier
from _sweep_helpers import TINY, child_env, write_sweep
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

import suite
from suite.launch.guard import Driver

SUITE = [sys.executable, "-m", "suite.cli"]
STEPS = 6  # the cells hold at step 2 (the barrier) until the re-run; 4 steps are left after it
pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.timeout(1800)]


def _wait_for(cond, proc, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        assert proc.poll() is None, f"the driver ended before {what}:\n{proc.stdout.read()}"
        time.sleep(0.2)
    raise TimeoutError(f"{what} within {timeout_s} s")


@contextlib.contextmanager
def _driver(argv: list[str], cwd: Path, folder: Path):
    """A real `suite` driver in its own session; whatever is left of it and its jobs is killed after."""
    proc = subprocess.Popen([*SUITE, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=child_env(), cwd=cwd, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        kill_procs_naming(folder)


def _assert_stopped(uri: str, parent_status: str, experiment: str = "suite", role=("suite.kind", "sweep")) -> list:
    """The parent ended `parent_status`; no child RUNNING and at least one KILLED. Returns the children."""
    _, all_runs = _runs(uri, experiment)
    parent = next(r for r in all_runs if r.data.tags.get(role[0]) == role[1])
    assert parent.info.status == parent_status
    children = [r for r in all_runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert children and not [r for r in children if r.info.status == "RUNNING"], \
        [(r.data.tags, r.info.status) for r in children]
    assert any(r.info.status == "KILLED" for r in children)
    return children


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _runs(uri: str, experiment: str = "suite"):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id])


def _sweep(tmp_path, runs, name):
    return write_sweep(tmp_path / f"{name}.yaml", {
        "name": name, "base": [*TINY, f"steps={STEPS}", "ckpt_every=2", f"out_dir={runs}"],
        "matrix": {"seed": [0, 1, 2]}, "launcher": {"max_parallel": 2, "poll_s": 0.5}})


def _started(runs: Path) -> list[Path]:
    """Run dirs of cells that have an MLflow run and a first checkpoint (mid-run)."""
    return [d for d in runs.glob("grpo-*") if (d / "mlflow_run.json").exists() and list(d.glob("checkpoints/step_*"))]


def _rerun_finishes_without_duplicates(path: Path, runs: Path, uri: str, tmp_path: Path) -> None:
    out = subprocess.run([*SUITE, "sweep", str(path)], capture_output=True, text=True, env=child_env(),
                         cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    dirs = list(runs.glob("grpo-*"))
    assert len(dirs) == 3
    for d in dirs:
        assert _steps(d) == list(range(0, STEPS + 1)), d.name  # every step once: resumed, never repeated
    client, all_runs = _runs(uri)
    parents = [r for r in all_runs if r.data.tags.get("suite.kind") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in all_runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(children) == 3 and len(all_runs) == 4  # the stopped cells reused their MLflow runs
    for r in children:
        assert r.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(r.info.run_id, "train/acc")) == \
            list(range(1, STEPS + 1))


def _held(barrier, runs: Path):
    """A cell holds at its step-2 checkpoint with its MLflow run open."""
    return lambda: barrier.reached(2) and bool(_started(runs))


def test_sigterm_to_a_local_sweep_stops_its_cells_and_ends_their_runs(tmp_path, sweep_env, monkeypatch):
    barrier = checkpoint_barrier.install(monkeypatch, tmp_path, (2,), when="after")
    uri, runs = sweep_env
    path = _sweep(tmp_path, runs, "term")
    folder = runs / "_sweeps" / "term" / "submitit"
    with _driver(["sweep", str(path)], tmp_path, folder) as proc:
        _wait_for(_held(barrier, runs), proc, 600, "a cell mid-run")
        proc.send_signal(signal.SIGTERM)  # the driver alone, as a scheduler or `kill` would
        assert proc.wait(timeout=300) == 130
        text = proc.stdout.read()
        assert "driver interrupted: cancelling" in text, text
        # the exact command that finishes it (the file relative to the working directory)
        assert text.rstrip().splitlines()[-1] == "interrupted: finish what is missing with: suite sweep term.yaml", text
        assert procs_naming(folder) == [], "a cell outlived its driver"
    _assert_stopped(uri, "KILLED")
    status = subprocess.run([*SUITE, "status", str(path)], capture_output=True, text=True, env=child_env(),
                            cwd=tmp_path, timeout=300)
    assert status.returncode == 0 and "cancelled" in status.stdout, status.stdout
    barrier.release_all()
    _rerun_finishes_without_duplicates(path, runs, uri, tmp_path)


def test_a_sweep_driver_whose_poll_raises_stops_its_cells(tmp_path, sweep_env, monkeypatch):
    """The state dir's jobs.jsonl becomes unreadable mid-sweep (here: a directory in its place):
    the next poll raises; the driver names the file, stops what it started, marks the runs KILLED
    and its parent FAILED."""
    barrier = checkpoint_barrier.install(monkeypatch, tmp_path, (2,), when="after")
    uri, runs = sweep_env
    path = _sweep(tmp_path, runs, "poll")
    state = runs / "_sweeps" / "poll"
    folder = state / "submitit"
    jobs = state / "jobs.jsonl"
    with _driver(["sweep", str(path)], tmp_path, folder) as proc:
        _wait_for(_held(barrier, runs), proc, 600, "a cell mid-run")
        os.rename(jobs, state / "jobs.saved")
        jobs.mkdir()
        assert proc.wait(timeout=300) == 2
        text = proc.stdout.read()
        assert "driver failed" in text and str(jobs) in text, text
        # no traceback of the driver's (a cancelled submitit controller prints its own KeyboardInterrupt)
        assert f'File "{Path(suite.__file__).parent}' not in text, text
        assert procs_naming(folder) == [], "a cell outlived its driver"
    _assert_stopped(uri, "FAILED")
    # No re-run here: what a re-run does after a stopped driver does not depend on why it stopped
    # (the parent's end status is the only difference, and set_parent_status takes any), and the
    # SIGTERM test above re-runs its sweep to the end.


def test_sigterm_to_a_tune_driver_stops_its_trials_and_a_rerun_resumes_them(tmp_path, sweep_env, monkeypatch):
    barrier = checkpoint_barrier.install(monkeypatch, tmp_path, (2,), when="after")
    uri, runs = sweep_env
    db = tmp_path / "optuna.db"
    base = [*TINY, f"steps={STEPS}", "ckpt_every=2", f"eval_every={STEPS // 2}", f"tracking.tracking_uri={uri}",
            "tracking.experiment=tune-stop"]
    path = tmp_path / "tune.yaml"
    path.write_text(
        "study: stop\n"
        f"storage: sqlite:///{db}\n"
        f"out_dir: {runs}\n"
        f"base: {json.dumps(base)}\n"
        "space:\n  uaq.s: {type: float, low: 1.0, high: 2.0}\n"
        "objective: {metric: val-core/arith/acc/mean@1, direction: maximize}\n"
        "n_trials: 2\nparallelism: 2\npoll_s: 0.5\n"
        "pruner: {name: none}\n"
        "launcher: {name: local, timeout_min: 20, cpus_per_task: 1}\n")
    folder = runs / "stop" / "jobs"
    with _driver(["tune", str(path)], tmp_path, folder) as proc:
        _wait_for(lambda: barrier.reached(2) and len([
            d for d in (runs / "stop").glob("trial-*")
            if list(d.glob("checkpoints/step_*")) and (d / "mlflow_run.json").exists()]) == 2,
            proc, 600, "both trials mid-run")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 130
        text = proc.stdout.read()
        assert "cancelling 2 job(s): trial 0, trial 1" in text, text
        assert procs_naming(folder) == [], "a trial outlived its driver"
    study = optuna.load_study(study_name="stop", storage=f"sqlite:///{db}")
    assert [t.state for t in study.trials] == [TrialState.RUNNING] * 2  # resumed by the next driver
    children = _assert_stopped(uri, "KILLED", "tune-stop", ("tune_role", "study"))
    assert sorted(r.data.tags["trial"] for r in children) == ["0", "1"]
    assert all(r.info.status == "KILLED" for r in children)

    barrier.release_all()
    again = subprocess.run([*SUITE, "tune", str(path)], capture_output=True, text=True, env=child_env(),
                           cwd=tmp_path, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    study = optuna.load_study(study_name="stop", storage=f"sqlite:///{db}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    client, all_runs = _runs(uri, "tune-stop")
    assert len(all_runs) == 3  # the parent and one child per trial: the stopped runs were reused
    parent = next(r for r in all_runs if r.data.tags.get("tune_role") == "study")
    assert parent.info.status == "FINISHED"
    for d in (runs / "stop").glob("trial-*"):
        assert _steps(d) == list(range(0, STEPS + 1)), d.name
    for r in all_runs:
        if r.info.run_id != parent.info.run_id:
            assert r.info.status == "FINISHED"
            assert sorted(m.step for m in client.get_metric_history(r.info.run_id, "train/acc")) == \
                list(range(1, STEPS + 1))


def test_a_stop_signal_during_a_submission_waits_for_its_record(tmp_path):
    """`hold()` defers SIGTERM until the block ends, so a job is never started unrecorded."""
    done = []
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with Driver(f"sqlite:///{tmp_path / 'm.db'}", None, lambda: []) as drv:
            with drv.hold():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)  # the handler ran: without hold() this line would not be reached
                done.append("recorded")
    assert done == ["recorded"]
    assert signal.getsignal(signal.SIGTERM) is before  # restored on the way out
