"""What a sweep or tune driver does when it stops before its jobs end.

A driver that dies from an exception (a poll that raises, a store that fails), a SIGTERM
(a scheduler or `kill` stopping it), a SIGHUP (its terminal closed) or Ctrl-C must not leave
jobs running that nobody waits for, nor MLflow runs that say RUNNING forever: nothing would
ever end them. `Driver` is the block around a driver's submitting and waiting:

- SIGTERM and SIGHUP raise `KeyboardInterrupt` in the main thread, as SIGINT does, so every
  way of stopping takes the same path; `hold()` defers them while a job is being submitted, so
  no job is started that the driver has not recorded yet.
- On leaving by an exception it cancels every job it can still reach (submitit's `cancel`:
  SIGINT to a local controller, which stops its task; `scancel` for SLURM), waits until they
  are gone, ends their MLflow runs KILLED (the driver stopped them: they did not fail) and the
  parent run KILLED after an interrupt, FAILED after an error; then the exception goes on.

The run directories stay as they were, so running the driver again resumes every stopped
cell or trial from its last checkpoint and never runs a finished one twice. A driver killed
with SIGKILL can do none of this: its jobs keep running and the next driver adopts them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from suite.tracking.rundir import recorded_mlflow_run_id

STOP_TIMEOUT_S = 120.0  # how long a driver waits for the jobs it cancelled to end (seconds)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Target:
    """One job a driver can stop: its name in messages, how to cancel it, whether it still runs,
    and the run directory whose `mlflow_run.json` names its MLflow run."""

    name: str
    cancel: Callable[[], None]
    alive: Callable[[], bool]
    run_dir: str


def job_target(name: str, job, run_dir: str) -> Target:
    """A submitit job this process submitted (local or SLURM)."""
    local = type(job).__name__ == "LocalJob"

    def alive() -> bool:
        if local:
            return job.state == "RUNNING"  # the controller process is still there
        # sacct says CANCELLED as soon as scancel is through, while squeue still lists the task as
        # CG (completing) until its processes are gone: squeue decides, sacct where squeue cannot
        listed = _squeue_lists(str(job.job_id))
        if listed is not None:
            return listed
        from suite.launch.slurm import SLURM_PENDING, SLURM_RUNNING, sacct

        state = sacct([str(job.job_id)]).get(str(job.job_id), "PENDING")  # not in sacct yet: queued
        return state in SLURM_RUNNING | SLURM_PENDING

    return Target(name, lambda: job.cancel(check=False), alive, run_dir)


def _squeue_lists(job_id: str) -> bool | None:
    """Whether squeue still lists the job (any state, completing included); None if it cannot say."""
    import subprocess

    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        # a job that left slurmctld's memory: "Invalid job id specified"
        return False if "invalid job id" in out.stderr.lower() else None
    return bool(out.stdout.strip())


def pid_target(name: str, pid: int, alive: Callable[[], bool], run_dir: str) -> Target:
    """A local controller started by an earlier driver (known by its pid only)."""

    def cancel() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)  # what submitit's LocalJob.cancel sends

    return Target(name, cancel, alive, run_dir)




def stop(targets: list[Target], *, timeout_s: float = STOP_TIMEOUT_S, out=None) -> list[Target]:
    """Cancel every target and wait until none runs; returns those still running at the deadline."""
    out = out or _stderr
    for t in targets:
        try:
            t.cancel()
        except Exception as exc:  # noqa: BLE001 - try every other job, then report
            out(f"could not cancel {t.name}: {exc}")
    deadline = time.monotonic() + timeout_s
    left = list(targets)
    while left and time.monotonic() < deadline:
        left = [t for t in left if _alive(t)]
        if left:
            time.sleep(0.2)
    for t in left:
        out(f"{t.name} still runs {timeout_s:.0f} s after it was cancelled; stop it by hand ({t.run_dir})")
    return left


def _alive(t: Target) -> bool:
    try:
        return t.alive()
    except Exception:  # noqa: BLE001 - a state we cannot read: assume it still runs until the deadline
        return True


def end_runs(tracking_uri: str, run_ids: list[str], status: str, out=None) -> int:
    """End every MLflow run of `run_ids` that still says RUNNING with `status`; returns how many."""
    from mlflow.tracking import MlflowClient

    from suite.tracking.outage import bounded_http

    out = out or _stderr
    client = MlflowClient(tracking_uri=tracking_uri)
    n = 0
    for rid in run_ids:
        try:
            with bounded_http():
                if client.get_run(rid).info.status == "RUNNING":
                    client.set_terminated(rid, status=status)
                    n += 1
        except Exception as exc:  # noqa: BLE001 - a tracking outage must not hide the driver's own error
            out(f"could not mark MLflow run {rid} {status}: {exc}")
    return n


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Driver:
    """The block in which a driver submits and waits (see the module docstring).

    `targets` is called when the block is left by an exception and returns what to stop;
    `on_stopped(targets)` then records the cancellations (e.g. in the sweep's jobs.jsonl)."""

    def __init__(self, tracking_uri: str, parent_run_id: str | None, targets: Callable[[], list[Target]],
                 *, on_stopped: Callable[[list[Target]], None] | None = None, out=None,
                 timeout_s: float = STOP_TIMEOUT_S):
        self.tracking_uri, self.parent_run_id = tracking_uri, parent_run_id
        self.targets, self.on_stopped = targets, on_stopped
        self.out = out or _stderr
        self.timeout_s = timeout_s
        self._held = 0
        self._pending: int | None = None  # a signal that arrived while held
        self._old: dict[int, object] = {}
        self.last_poll = None  # what the driver saw at its last poll, for `targets`

    # -- signals
    def _handler(self, signum, frame):
        if self._held:
            self._pending = signum
            return
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Defer a stop signal until the block ends (a submission and its record)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held and self._pending is not None:
                signum, self._pending = self._pending, None
                raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    def __enter__(self) -> Driver:
        if threading.current_thread() is threading.main_thread():
            for s in _STOP_SIGNALS:
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}
        if exc_type is None:
            return False
        # a second signal during the cleanup must not cut it short: ignored until it is done
        ignored = {}
        if threading.current_thread() is threading.main_thread():
            ignored = {s: signal.signal(s, signal.SIG_IGN) for s in _STOP_SIGNALS}
        try:
            self._cleanup(interrupted=issubclass(exc_type, KeyboardInterrupt), exc=exc)
        finally:
            for s, old in ignored.items():
                signal.signal(s, old)
        return False

    def _cleanup(self, *, interrupted: bool, exc: BaseException | None) -> None:
        try:
            targets = self.targets()
        except Exception as texc:  # noqa: BLE001
            self.out(f"could not list the jobs to stop: {texc}")
            targets = []
        why = "interrupted" if interrupted else f"failed ({type(exc).__name__}: {exc})"
        if targets:
            self.out(f"driver {why}: cancelling {len(targets)} job(s): {', '.join(t.name for t in targets)}")
        stop(targets, timeout_s=self.timeout_s, out=self.out)
        if self.on_stopped is not None and targets:
            try:
                self.on_stopped(targets)
            except Exception as rexc:  # noqa: BLE001
                self.out(f"could not record the cancellations: {rexc}")
        run_ids = [rid for t in targets if (rid := recorded_mlflow_run_id(t.run_dir))]
        end_runs(self.tracking_uri, run_ids, "KILLED", self.out)
        if self.parent_run_id:
            end_runs(self.tracking_uri, [self.parent_run_id], "KILLED" if interrupted else "FAILED", self.out)
