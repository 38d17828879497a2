"""One run dir, one writer: the run lock, its stale-holder takeover, and two real `suite run`
processes on one run id."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from filelock import MarkerSoftFileLock

from suite.tracking import lock as lock_mod
from suite.tracking.lock import LOCK_FILE, RunLockedError, run_lock

RUN = ["model=tiny", "steps=4", "rollout.prompts_per_step=2", "algo.group_size=4", "task.n_eval=16",
       "task.difficulty=1", "warm_start.steps=20", "warm_start.batch_size=16", "eval_every=2", "ckpt_every=2",
       "threads=1", "rollout.max_new_tokens=16"]


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with run_lock(tmp_path):
        with pytest.raises(RunLockedError) as err:
            with run_lock(tmp_path):
                pass
        msg = str(err.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in msg and str(tmp_path / LOCK_FILE) in msg
    with run_lock(tmp_path):  # released: free again
        pass


# a holder that takes the flock and names itself only after a delay (argv[2] s): the window in
# which a second process is refused before it can read who holds the lock
LATE_NAMER = textwrap.dedent("""
    import fcntl, json, os, socket, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
    time.sleep(60)
""")


@pytest.mark.parametrize("delay", [0.5, None])
def test_a_refusal_waits_for_a_holder_that_has_not_named_itself_yet(tmp_path, monkeypatch, delay):
    wait_s = 1.0 if delay is None else 30.0  # a named holder is found long before the wait is over
    monkeypatch.setattr(lock_mod, "NAME_WAIT_S", wait_s)
    holder = subprocess.Popen([sys.executable, "-c", LATE_NAMER, str(tmp_path / LOCK_FILE),
                               str(60.0 if delay is None else delay)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(RunLockedError) as err:
            with run_lock(tmp_path):
                pass
        waited = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    if delay is None:  # never named within the wait: said so, after the whole wait
        assert "another process (it has not written its pid yet)" in str(err.value) and waited >= wait_s
    else:
        assert f"pid {holder.pid} on host {socket.gethostname()}" in str(err.value)


@pytest.fixture
def no_flock(monkeypatch):
    """A filesystem that refuses flock (some NFS/Lustre mounts): the marker-file fallback. flock is
    refused in this process only, where filelock calls it (`fcntl.flock`)."""
    def refuse(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)


# a holder under the fallback that dies without releasing (os._exit skips every finally)
DIE_HOLDING = textwrap.dedent("""
    import errno, fcntl, os, sys
    def refuse(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    fcntl.flock = refuse
    from suite.tracking.lock import run_lock
    with run_lock(sys.argv[1]):
        print(os.getpid(), flush=True)
        os._exit(0)
""")


def test_marker_fallback_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path, no_flock, monkeypatch):
    monkeypatch.setattr(lock_mod, "NAME_WAIT_S", 30.0)  # the late marker below is found long before
    excl = tmp_path / (LOCK_FILE + lock_mod.EXCL_SUFFIX)

    def owner_pid():
        return MarkerSoftFileLock(excl).owner.pid

    with run_lock(tmp_path):
        assert owner_pid() == os.getpid()
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()} on host {socket.gethostname()}"):
            with run_lock(tmp_path):
                pass
    assert not excl.exists()
    dead = subprocess.run([sys.executable, "-c", DIE_HOLDING, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, check=True)
    assert excl.exists() and owner_pid() == int(dead.stdout)  # the holder died without releasing
    with run_lock(tmp_path):  # taken over
        assert owner_pid() == os.getpid()
    # another node's holder cannot be checked from here: refused, named (filelock's marker format,
    # filelock/_soft/_records.py encode_marker)
    excl.write_text("filelock/2\npid=12345\nhost=another-node\nmode=exclusive\n")
    with pytest.raises(RunLockedError, match="pid 12345 on host another-node"):
        with run_lock(tmp_path):
            pass
    # a marker created but not yet written (its holder is between create and write) is waited for
    excl.write_text("")
    threading.Timer(0.5, excl.write_text, ["filelock/2\npid=23456\nhost=another-node\nmode=exclusive\n"]).start()
    with pytest.raises(RunLockedError, match="pid 23456 on host another-node"):
        with run_lock(tmp_path):
            pass


def _env(tmp_path):
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", SUITE_CACHE=str(tmp_path / "cache"),
                MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")


def _wait_for_holder(proc, lock_path, timeout_s=300.0) -> dict:
    deadline = time.time() + timeout_s
    while True:
        try:
            info = json.loads(lock_path.read_text() or "null")
        except (OSError, ValueError):
            info = None
        if info and info.get("pid") == proc.pid:
            return info
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "the run never took its lock"
        time.sleep(0.01)


@pytest.mark.slow
def test_two_identical_runs_one_writer_and_a_killed_holder_is_taken_over(tmp_path):
    from mlflow.tracking import MlflowClient

    from suite.tracking.loggers import read_jsonl

    over = [*RUN, f"out_dir={tmp_path / 'runs'}"]
    env = _env(tmp_path)
    cmd = [sys.executable, "-m", "suite.cli", "run", "--no-progress", *over]
    # the run id as the child processes compute it (same environment)
    probe = subprocess.run([sys.executable, "-c", "import sys; from suite.config import compose_config, run_id; "
                            "print(run_id(compose_config(sys.argv[1:])))", *over],
                           capture_output=True, text=True, env=env, check=True)
    run_dir = tmp_path / "runs" / probe.stdout.strip()
    lock_path = run_dir / LOCK_FILE

    # a holder killed with -9 right after taking its lock leaves a lock the next run takes over
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    _wait_for_holder(first, lock_path)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()

    a = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    holder = _wait_for_holder(a, lock_path)
    b = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert a.poll() is None, "the first run ended before the second one tried: not concurrent"
    assert b.returncode == 2, b.stdout + b.stderr
    assert f"pid {holder['pid']} on host {holder['host']}" in b.stderr and "Traceback" not in b.stderr
    out, _ = a.communicate(timeout=600)
    assert a.returncode == 0, out

    assert [e["step"] for e in read_jsonl(run_dir / "metrics.jsonl")] == list(range(5))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("suite")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", [(r.info.run_id, r.info.status) for r in runs]
    assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "train/acc")) == [1, 2, 3, 4]


@pytest.mark.slow
def test_two_runs_started_together_one_runs_one_is_refused(tmp_path):
    over = [*RUN, f"out_dir={tmp_path / 'runs'}", "seed=1"]
    env = _env(tmp_path)
    cmd = [sys.executable, "-m", "suite.cli", "run", "--no-progress", *over]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    loser = next(r for r in results if r[0] == 2)
    assert "is being written by pid" in loser[2]
