"""The local launcher end to end (real submitit LocalExecutor, real runs, real sqlite MLflow):
dry run, a sweep killed mid-way and re-run, re-running a finished sweep, a finished cell's run dir
lost or damaged, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from _sweep_helpers import TINY, child_env, write_sweep

SUITE = [sys.executable, "-m", "suite.cli"]


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dry_run_prints_matrix_and_submits_nothing(tmp_path, sweep_env):
    path = write_sweep(tmp_path / "dry.yaml", {
        "name": "dry", "base": TINY, "matrix": {"quant": ["bf16", "int8"], "seed": [0, 1]}})
    out = subprocess.run([*SUITE, "sweep", str(path), "--dry-run", "steps=3", f"out_dir={tmp_path / 'runs'}"],
                         capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split() == ["cell", "quant", "seed", "run", "id"]
    rows = [ln.split() for ln in lines if ln[:1].isdigit()]
    assert [r[:3] for r in rows] == [["0", "bf16", "0"], ["1", "bf16", "1"], ["2", "int8", "0"], ["3", "int8", "1"]]
    assert rows[2][3].startswith("grpo-int8-acr-s1.5-arith-seed0-")
    cmds = [ln.strip() for ln in lines if ln.strip().startswith("$ suite run")]
    assert len(cmds) == 4 and "steps=3" in cmds[0] and "quant=bf16 seed=0" in cmds[0]
    assert "dry run: nothing submitted (4 cells validated)" in out.stdout
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow  # ~60 s quiet: a sweep killed mid-run and re-run, then two cells again
@pytest.mark.long
def test_killed_local_sweep_rerun_finishes_only_what_was_missing(tmp_path, sweep_env):
    """Kill `suite sweep` and its jobs (SIGKILL to the process group) once a cell is done and
    another is part-way; the re-run skips the done cell, resumes the other from its checkpoint
    and runs the rest; a third run submits nothing. MLflow: one parent, one child per cell,
    every step once. Then the run directory is the result: one cell's run dir deleted and another's
    summary.json truncated, `suite status` shows both incomplete (not done), and re-running the
    sweep submits exactly those two, which finish with every step once."""
    uri, runs = sweep_env
    path = write_sweep(tmp_path / "kill.yaml", {
        "name": "kill", "base": [*TINY, "steps=8", "ckpt_every=2", f"out_dir={runs}"],
        "matrix": {"seed": [0, 1, 2]}, "launcher": {"max_parallel": 2, "poll_s": 0.5, "progress_s": 1}})
    proc = subprocess.Popen([*SUITE, "sweep", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=child_env(), cwd=tmp_path, start_new_session=True)
    killed_at = None
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            dirs = [d for d in runs.glob("grpo-*")]
            done = [d for d in dirs if (d / "summary.json").exists()]
            partial = [d for d in dirs if not (d / "summary.json").exists() and list(d.glob("checkpoints/step_*.pt"))]
            if done and partial:
                os.killpg(proc.pid, signal.SIGKILL)  # the sweep, its submitit controllers and their runs
                killed_at = ({d.name for d in done}, {d.name for d in partial})
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None and killed_at is None:
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    first_out = proc.stdout.read()
    assert killed_at is not None, f"never saw a done and a part-done cell together:\n{first_out}"
    done_before, partial_before = killed_at
    state = runs / "_sweeps" / "kill"
    jobs_before = [json.loads(x) for x in (state / "jobs.jsonl").read_text().splitlines()]

    out = subprocess.run([*SUITE, "sweep", str(path)], capture_output=True, text=True, env=child_env(),
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(done_before)} done" in out.stdout.splitlines()[0]
    # without a terminal, the aggregate every progress_s between the cells' own lines
    agg = re.findall(r"^sweep kill: (\d)/3 done, (\d) running, 0 failed, (\d) queued \| "
                     r"[\d.]+ min elapsed(, ETA [\d.]+ min)?$",
                     out.stdout, flags=re.M)
    assert agg and any(eta for *_, eta in agg), out.stdout
    jobs = [json.loads(x) for x in (state / "jobs.jsonl").read_text().splitlines()]
    new = jobs[len(jobs_before):]
    resubmitted = {j["run_id"] for j in new}
    assert not resubmitted & done_before, "a finished cell was submitted again"
    assert partial_before <= resubmitted
    assert len(resubmitted) == 3 - len(done_before)
    # the part-done run resumed from its checkpoint (run_cell prints where it starts)
    for j in new:
        log = (state / "submitit" / f"{j['job_id']}_0_log.out").read_text()
        if j["run_id"] in partial_before:
            assert "resuming from step" in log, log
    for d in runs.glob("grpo-*"):
        assert _steps(d) == list(range(0, 9)), d.name  # no step lost or duplicated

    # MLflow: one parent (suite.kind=sweep), three children, each step once
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("suite")
    all_runs = client.search_runs([exp.experiment_id])
    parents = [r for r in all_runs if r.data.tags.get("suite.kind") == "sweep"]
    assert len(parents) == 1 and parents[0].info.run_name == "kill" and parents[0].info.status == "FINISHED"
    children = [r for r in all_runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(children) == 3 and len(all_runs) == 4
    assert {r.data.tags["cell"] for r in children} == {"0", "1", "2"}
    assert {r.data.tags["seed"] for r in children} == {"0", "1", "2"}  # axes as tags
    for r in children:
        assert r.info.status == "FINISHED"
        # the name shows the cell's axes; the tags say which job ran it and where its log is
        assert r.info.run_name.endswith(f"-8steps-lr3e-05-seed{r.data.tags['seed']}"), r.info.run_name
        assert Path(r.data.tags["job_log"]).is_file() and "slurm_job_id" not in r.data.tags
        assert r.data.tags["mlflow.source.name"] == f"suite sweep {path}"  # the driver's command, not submitit's
        hist = [m.step for m in client.get_metric_history(r.info.run_id, "train/acc")]
        assert sorted(hist) == list(range(1, 9)), (r.data.tags["cell"], hist)
    arts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"sweep.yaml", "matrix.json", "matrix.csv"} <= arts
    # the last line leads to the parent's page in the UI's training view
    assert out.stdout.rstrip().splitlines()[-1] == (
        f"MLflow UI: mlflow ui --backend-store-uri {uri}, then open http://127.0.0.1:5000/#/experiments/"
        f"{exp.experiment_id}/runs/{parents[0].info.run_id}?workflowType=machine_learning"), out.stdout

    # a finished sweep, re-run, and its status: nothing submitted, no new MLflow run, the parent's
    # end time as the sweep wrote it
    end_time = parents[0].info.end_time
    again = subprocess.run([*SUITE, "sweep", str(path)], capture_output=True, text=True, env=child_env(),
                           cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "nothing to submit: 3/3 done" in again.stdout
    assert len((state / "jobs.jsonl").read_text().splitlines()) == len(jobs)
    assert len(client.search_runs([exp.experiment_id])) == 4
    status = subprocess.run([*SUITE, "status", str(path)], capture_output=True, text=True, env=child_env(),
                            cwd=tmp_path, timeout=300)
    assert status.returncode == 0 and "done 3  (of 3)" in status.stdout, status.stdout
    assert client.get_run(parents[0].info.run_id).info.end_time == end_time

    # a finished cell's run dir deleted, another's summary.json truncated
    by_seed = {json.loads((d / "summary.json").read_text())["run_id"].split("-seed")[1][0]: d
               for d in runs.glob("grpo-*")}
    gone, damaged = by_seed["0"], by_seed["1"]
    shutil.rmtree(gone)
    text = (damaged / "summary.json").read_text()
    (damaged / "summary.json").write_text(text[: len(text) // 2])
    status = subprocess.run([*SUITE, "status", str(path)], capture_output=True, text=True, env=child_env(),
                            cwd=tmp_path, timeout=300)
    assert status.returncode == 0, status.stderr
    rows = {ln.split()[0]: ln for ln in status.stdout.splitlines() if ln.strip()[:1].isdigit()}
    assert rows["0"].split()[1] == "incomplete" and "run dir is gone" in rows["0"], status.stdout
    assert rows["1"].split()[1] == "incomplete" and "summary.json is damaged" in rows["1"], status.stdout
    assert rows["2"].split()[1] == "done", status.stdout
    assert "incomplete 2  (of 3)" in status.stdout, status.stdout

    repaired = subprocess.run([*SUITE, "sweep", str(path)], capture_output=True, text=True, env=child_env(),
                              cwd=tmp_path, timeout=600)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "submitting 2" in repaired.stdout.splitlines()[0], repaired.stdout
    assert len((state / "jobs.jsonl").read_text().splitlines()) == len(jobs) + 2
    for d in (gone, damaged):
        assert json.loads((d / "summary.json").read_text())["steps"] == 8
        assert _steps(d) == list(range(0, 9)), d.name  # no step lost or duplicated
    assert (damaged / "summary.json.damaged").read_text() == text[: len(text) // 2]  # moved aside, not deleted
    assert "done 3  (of 3)" in subprocess.run([*SUITE, "status", str(path)], capture_output=True, text=True,
                                              env=child_env(), cwd=tmp_path, timeout=300).stdout


@pytest.mark.slow  # ~40 s quiet: two cells stopped at a checkpoint, then resumed
@pytest.mark.long
def test_ctrl_c_stops_a_sweep_in_one_line_naming_the_command_that_resumes_it(tmp_path, sweep_env, monkeypatch):
    """Ctrl-C (SIGINT to the whole foreground group, as a terminal sends it) while both cells are
    held at their step-2 checkpoint: no traceback (the job controllers' stderr is a log file), the
    cells' MLflow runs ended, and the exact command, overrides and --only included. That command
    resumes; the same file with other overrides is refused, naming the difference."""
    import checkpoint_barrier

    barrier = checkpoint_barrier.install(monkeypatch, tmp_path, (2,), when="after")
    uri, runs = sweep_env
    write_sweep(tmp_path / "ctrlc.yaml", {
        "name": "ctrlc", "base": [*TINY, f"out_dir={runs}"], "matrix": {"seed": [0, 1, 2]},
        "launcher": {"max_parallel": 2, "poll_s": 0.5}})
    argv = ["sweep", "ctrlc.yaml", "steps=6", "--only", "seed=0,1"]
    proc = subprocess.Popen(checkpoint_barrier.interactive("suite.cli", *argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 600
    while not barrier.reached(2):  # a cell holds at its step-2 checkpoint
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no cell reached its step-2 checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = checkpoint_barrier.communicate(proc, 300, group=True, barrier=barrier)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, out + err
    command = "suite sweep ctrlc.yaml steps=6 --only=seed=0,1"
    assert out.rstrip().splitlines()[-1] == f"interrupted: finish what is missing with: {command}", out
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("suite")
    assert not [r for r in client.search_runs([exp.experiment_id]) if r.info.status == "RUNNING"]
    state = runs / "_sweeps" / "ctrlc"
    jobs = (state / "jobs.jsonl").read_text()

    other = subprocess.run([*SUITE, "sweep", "ctrlc.yaml", "steps=5"], capture_output=True, text=True,
                           env=child_env(), cwd=tmp_path, timeout=300)
    assert other.returncode == 2, other.stdout + other.stderr
    assert "holds a launch with other overrides (steps=5 (was steps=6))" in other.stderr, other.stderr
    assert f"Resume that sweep with: {command};" in other.stderr
    assert (state / "jobs.jsonl").read_text() == jobs  # nothing submitted or recorded

    barrier.release_all()
    done = subprocess.run([*SUITE, *command.split()[1:]], capture_output=True, text=True,
                          env=child_env(), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 cells" in done.stdout.splitlines()[0], done.stdout  # --only kept the third cell out
    for d in runs.glob("grpo-*"):
        assert _steps(d) == list(range(0, 7)), d.name
