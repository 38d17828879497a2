"""The dev SLURM cluster (slurm/dev-cluster.sh) does what the sweeps need: accounting, job arrays
through submitit, fake GPUs, cancellation that submitit sees, and requeue of checkpointable jobs.

Everything here runs on the real cluster of the `slurm_cluster` fixture; nothing is mocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit

pytestmark = [pytest.mark.long, pytest.mark.slurm]

# The job's Python process cannot import this test module (pytest put its folder on sys.path,
# the job's interpreter does not have it), so submitit must pickle our callables by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "dev-cluster.sh"
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")


def wait_done(job: submitit.Job, timeout_s: float) -> None:
    """`job.wait()` without a bound would hang CI on a broken cluster; this one fails."""
    deadline = time.monotonic() + timeout_s
    while not job.done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"submitit job {job.job_id} not done within {timeout_s} s (state {job.state})")
        time.sleep(0.25)


def executor(cluster, folder: Path, **params) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(slurm_partition=cluster.partition, timeout_min=5, **params)
    return ex


# ------------------------------------------------------------------------------ the script itself


def test_bad_knob_fails_before_anything_starts(tmp_path):
    proc = subprocess.run(
        ["bash", str(SCRIPT), "up", str(tmp_path / "c")], env={**os.environ, "DEV_CLUSTER_GPUS": "two"},
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 1
    assert "DEV_CLUSTER_GPUS='two': allowed values are integers 0..64" in proc.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_failed_daemon_names_its_log_and_nothing_stays_up(slurm_cluster, tmp_path_factory):
    """A daemon that dies at startup (munged, given a key it rejects) fails `up` with the log to
    read, and `up` stops whatever it had started. (Takes the fixture only for root + packages.)
    The folder is a short one, as the fixture's: a test's own tmp_path (longer still under
    pytest-xdist) can pass the unix-socket limit that `up` checks before the daemon starts."""
    d = tmp_path_factory.mktemp("dc") / "broken"
    (d / "munge").mkdir(parents=True)
    (d / "munge" / "munge.key").write_text("short")  # munged wants >= 32 bytes
    proc = subprocess.run(["bash", str(SCRIPT), "up", str(d)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"munged exited during startup; its log is {d}/log/munged.log" in proc.stderr
    assert "Keyfile must be at least 32 bytes" in proc.stderr  # the log tail is shown
    status = subprocess.run(["bash", str(SCRIPT), "status", str(d)], capture_output=True, text=True)
    assert status.returncode == 1
    assert status.stdout.splitlines() == [
        f"{d} stopped" for d in ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
    ]


# ------------------------------------------------------------------------- plain sbatch / sacct


def test_cluster_shape(slurm_cluster):
    assert slurm_cluster.env["SLURM_CONF"] == str(slurm_cluster.dir / "etc" / "slurm.conf")
    assert os.environ["SLURM_CONF"] == slurm_cluster.env["SLURM_CONF"]
    assert (slurm_cluster.dir / "env.sh").read_text() == f"export SLURM_CONF={slurm_cluster.env['SLURM_CONF']}\n"
    assert slurm_cluster.partition == "dev"
    assert slurm_cluster.n_cpus == int(slurm_cluster.run("slurmd", "-C").stdout.split("CPUs=")[1].split()[0])
    assert slurm_cluster.n_gpus == 2
    # idempotent: `up` on a running DIR says so, exits 0 and prints the same environment
    again = slurm_cluster.run("bash", str(SCRIPT), "up", str(slurm_cluster.dir))
    assert again.stdout == f"export SLURM_CONF={slurm_cluster.env['SLURM_CONF']}\n"
    assert "already running" in again.stderr
    status = slurm_cluster.run("bash", str(SCRIPT), "status", str(slurm_cluster.dir)).stdout
    assert [line.split()[:2] for line in status.splitlines()] == [
        [d, "running"] for d in ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
    ]


def test_sbatch_job_completes_in_sacct(slurm_cluster, tmp_path):
    out = tmp_path / "hello.out"
    jid = slurm_cluster.run(
        "sbatch", "--parsable", f"--partition={slurm_cluster.partition}", f"--output={out}",
        "--wrap", 'echo "hello from $SLURM_JOB_ID on $SLURM_JOB_PARTITION"',
    ).stdout.strip()
    assert slurm_cluster.wait_state(jid, FINAL_STATES, timeout_s=30) == "COMPLETED"
    assert out.read_text() == f"hello from {jid} on {slurm_cluster.partition}\n"
    row = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", jid).stdout
    assert row.strip() == f"{jid}|COMPLETED|0:0"


def test_gres_gpu_job_schedules(slurm_cluster, tmp_path):
    out = tmp_path / "gpu.out"
    jid = slurm_cluster.run(
        "sbatch", "--parsable", f"--partition={slurm_cluster.partition}", "--gres=gpu:1",
        f"--output={out}", "--wrap", 'echo "gpus=$CUDA_VISIBLE_DEVICES"',
    ).stdout.strip()
    assert slurm_cluster.wait_state(jid, FINAL_STATES, timeout_s=30) == "COMPLETED"
    assert out.read_text() == "gpus=0\n"  # slurm hands out the first fake device
    tres = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "AllocTRES", "-j", jid).stdout
    assert "gres/gpu=1" in tres.split(",")
    # more GPUs than the node has can never schedule: sbatch refuses at submit time
    too_many = slurm_cluster.run(
        "sbatch", f"--partition={slurm_cluster.partition}", f"--gres=gpu:{slurm_cluster.n_gpus + 1}",
        "--wrap", "true", check=False,
    )
    assert too_many.returncode != 0
    assert "Requested node configuration is not available" in too_many.stderr


# ------------------------------------------------------------------------------------- submitit


def square_in_array(x: int) -> tuple[int, str]:
    return x * x, os.environ["SLURM_ARRAY_TASK_ID"]


def test_submitit_job_array_returns_results(slurm_cluster, tmp_path):
    ex = executor(slurm_cluster, tmp_path / "submitit", slurm_array_parallelism=2)
    jobs = ex.map_array(square_in_array, [3, 4])
    assert [j.job_id.split("_")[1] for j in jobs] == ["0", "1"]
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1  # one array, two tasks
    for job in jobs:
        wait_done(job, timeout_s=45)
    assert [j.result() for j in jobs] == [(9, "0"), (16, "1")]
    # the result pickle lands before the task ends; accounting catches up within a second or two
    assert [slurm_cluster.wait_state(j.job_id, FINAL_STATES, timeout_s=20) for j in jobs] == [
        "COMPLETED", "COMPLETED"
    ]


@pytest.mark.slow
def test_scancel_is_cancelled_as_submitit_sees_it(slurm_cluster, tmp_path):
    job = executor(slurm_cluster, tmp_path / "submitit").submit(time.sleep, 300)
    slurm_cluster.wait_state(job.job_id, ["RUNNING"], timeout_s=30)
    job.cancel()
    deadline = time.monotonic() + 30
    while not job.state.startswith("CANCELLED"):
        assert time.monotonic() < deadline, f"submitit still sees {job.state!r} 30 s after scancel"
        time.sleep(0.25)
    assert job.done()
    assert slurm_cluster.sacct_state(job.job_id).startswith("CANCELLED")


class Counter(submitit.helpers.Checkpointable):
    """Counts to `n`, saving progress to `workdir` after every step (as a run saves checkpoints
    to its run directory). The first attempt steps every 0.2 s, so it is surely still running
    when the test requeues it; a resumed attempt steps every 0.01 s, so the test is short.
    Each call and checkpoint appends an event to `workdir/events`: `call from=K
    via=start|arg|disk` and `checkpoint at=K`."""

    def __init__(self, workdir: str, n: int):
        self.workdir = Path(workdir)
        self.n = n

    def _event(self, text: str) -> None:
        with open(self.workdir / "events", "a") as f:
            f.write(text + "\n")

    def progress(self) -> int:
        p = self.workdir / "progress"
        return int(p.read_text()) if p.exists() else 0

    def __call__(self, start: int | None = None) -> int:
        if start is not None:
            i, via = start, "arg"  # resumed from the state `checkpoint` handed to submitit
        else:
            i = self.progress()
            via = "disk" if i else "start"  # a plain requeue reruns the original call
        self._event(f"call from={i} via={via}")
        step_s = 0.2 if via == "start" else 0.01
        while i < self.n:
            time.sleep(step_s)
            i += 1
            tmp = self.workdir / "progress.tmp"
            tmp.write_text(str(i))
            tmp.replace(self.workdir / "progress")
        return i

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        i = self.progress()
        self._event(f"checkpoint at={i}")
        return submitit.helpers.DelayedSubmission(self, i)


def start_counter(cluster, tmp_path: Path, name: str, n: int) -> tuple[submitit.Job, Counter]:
    work = tmp_path / name
    work.mkdir()
    counter = Counter(str(work), n)
    job = executor(cluster, tmp_path / "submitit").submit(counter)
    return job, counter


def wait_progress(job: submitit.Job, counter: Counter, at_least: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while counter.progress() < at_least:
        assert time.monotonic() < deadline, f"job {job.job_id} made no progress in {timeout_s} s ({job.state})"
        time.sleep(0.1)


def events(counter: Counter) -> list[str]:
    return (counter.workdir / "events").read_text().splitlines()


def accounting_history(cluster, job_id: str) -> list[str]:
    """Every run of the job, oldest first (`sacct --duplicates` keeps the requeued ones)."""
    cluster.wait_state(job_id, FINAL_STATES, timeout_s=20)  # the result pickle lands first
    out = cluster.run("sacct", "-D", "-X", "-n", "-P", "-o", "State", "-j", job_id).stdout
    return out.split()


@pytest.mark.slow  # ~15 s quiet: a job preempted and requeued on the dev cluster
def test_requeued_checkpointable_jobs_resume(slurm_cluster, tmp_path):
    """Both ways a running job gets requeued, side by side (they overlap to halve the wait:
    a requeued job may start again only after cred_expire=10 s).

    `job._interrupt()` is submitit's preemption: SIGTERM (ignored) then USR2 to the job step;
    the job calls `checkpoint`, runs `scontrol requeue` on itself, and the rerun starts from
    the state `checkpoint` returned.

    `scontrol requeue JOBID` (and partition preemption, which requeues the same way) kills the
    job with SIGTERM, then SIGKILL after KillWait, and no USR2: submitit does not call
    `checkpoint`, the rerun is the original call, and only state saved on disk carries over.
    """
    n = 100  # a first attempt needs 20 s; the requeue comes after ~1 s, the SIGKILL 2 s later
    interrupted, c_int = start_counter(slurm_cluster, tmp_path, "interrupted", n)
    requeued, c_req = start_counter(slurm_cluster, tmp_path, "requeued", n)
    wait_progress(interrupted, c_int, 3)
    interrupted._interrupt()
    wait_progress(requeued, c_req, 3)
    slurm_cluster.run("scontrol", "requeue", requeued.job_id)
    wait_done(interrupted, timeout_s=60)
    wait_done(requeued, timeout_s=60)
    assert interrupted.result() == n
    assert requeued.result() == n

    got = events(c_int)
    assert len(got) == 3, got
    k = int(got[1].removeprefix("checkpoint at="))
    assert 3 <= k < n
    assert got == ["call from=0 via=start", f"checkpoint at={k}", f"call from={k} via=arg"]
    assert accounting_history(slurm_cluster, interrupted.job_id) == ["REQUEUED", "COMPLETED"]

    got = events(c_req)
    assert len(got) == 2, got
    k = int(got[1].removeprefix("call from=").removesuffix(" via=disk"))
    assert 3 <= k < n
    assert got == ["call from=0 via=start", f"call from={k} via=disk"]
    assert accounting_history(slurm_cluster, requeued.job_id) == ["REQUEUED", "COMPLETED"]


def test_urgent_partition_preempts_by_requeue(slurm_cluster, tmp_path):
    """A job in partition "urgent" that needs a busy CPU requeues (preempts) a job of the
    default partition, which then waits and starts again."""
    low = slurm_cluster.run(
        "sbatch", "--parsable", f"--partition={slurm_cluster.partition}",
        f"--cpus-per-task={slurm_cluster.n_cpus}", f"--output={tmp_path / 'low.out'}",
        "--wrap", "sleep 300",
    ).stdout.strip()
    slurm_cluster.wait_state(low, ["RUNNING"], timeout_s=30)
    high = slurm_cluster.run(
        "sbatch", "--parsable", "--partition=urgent", "--cpus-per-task=1",
        f"--output={tmp_path / 'high.out'}", "--wrap", "echo urgent",
    ).stdout.strip()
    assert slurm_cluster.wait_state(high, FINAL_STATES, timeout_s=30) == "COMPLETED"
    assert (tmp_path / "high.out").read_text() == "urgent\n"
    history = slurm_cluster.run("sacct", "-D", "-X", "-n", "-P", "-o", "State", "-j", low).stdout.split()
    assert history[0] == "PREEMPTED"
    # requeued, not ended: the job is queued again (it may start after cred_expire=10 s)
    job = dict(kv.split("=", 1) for kv in slurm_cluster.run("scontrol", "show", "job", "-o", low).stdout.split()
               if "=" in kv)
    assert job["Restarts"] == "1"
    assert job["JobState"] in ("PENDING", "RUNNING"), job["JobState"]
    slurm_cluster.run("scancel", low)
    slurm_cluster.wait_state(low, ["CANCELLED"], timeout_s=30)
