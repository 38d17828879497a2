"""Launching a sweep: submitit executors, the sweep state directory, cell states, the
MLflow parent run, submission (local window or SLURM job array), waiting, cancelling.

State directory (`Sweep.state_dir` = `<out_dir>/_sweeps/<name>/`):

    sweep.yaml          the sweep file as last launched
    matrix.json/.csv    the expanded matrix (also artifacts of the MLflow parent run)
    parent_run.json     the MLflow parent run (reused by every re-run of the sweep)
    jobs.jsonl          one line per submission or cancellation: cell, run id, job id
    submitit/           submitit's pickles and logs (`<job>_0_log.out/.err`)

A cell's state is derived from its run directory first (summary.json = done) and then from
its latest job (submitit's result pickle, `sacct` for SLURM, the controller PID locally).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from suite.sweep.guard import Driver, record_cancelled, sweep_targets
from suite.sweep.spec import Cell, LauncherConfig, Resources, Sweep, SweepError, load_profile
from suite.sweep.state_files import append_job, read_jobs, read_parent

LOCAL_TIMEOUT_MIN = 7 * 24 * 60  # local runs have no scheduler time limit; submitit needs one
JOBS_FILE = "jobs.jsonl"
PARENT_FILE = "parent_run.json"
SUBMITIT_DIR = "submitit"

# SLURM job states (sacct) -> cell states
_SLURM_PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "PREEMPTED"}
_SLURM_RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "RESIZING", "SIGNALING"}
_SLURM_FAILED = {"FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "COMPLETED"}
STATES = ("done", "running", "pending", "failed", "cancelled", "interrupted", "missing")


# --------------------------------------------------------------------------- executors


def make_executor(launcher: LauncherConfig, folder: str | os.PathLike, resources: Resources | None = None,
                  job_name: str = "suite", sweep_path: str | None = None):
    """A submitit executor for `launcher` (local, or slurm with `launcher.profile`), with the
    per-run `resources` over the profile's. Values reach sbatch only as quoted `#SBATCH`
    options (checked against a strict pattern when the profile is read); the run itself
    travels as a pickle, never through a shell."""
    import submitit

    resources = resources or Resources()
    folder = Path(folder)
    if launcher.name == "local":
        ex = submitit.LocalExecutor(folder=folder, max_num_timeout=launcher.max_requeue)
        ex.update_parameters(timeout_min=resources.timeout_min or LOCAL_TIMEOUT_MIN, signal_delay_s=30)
        return ex
    if launcher.name != "slurm":
        raise SweepError(f"launcher.name={launcher.name!r} is not a launcher; choose one of: local, slurm")
    prof, _ = load_profile(launcher.profile, sweep_path)
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=launcher.max_requeue)
    params = dict(
        job_name=job_name,
        time=int(resources.timeout_min or prof.timeout_min),
        nodes=int(resources.nodes or prof.nodes),
        ntasks_per_node=prof.tasks_per_node,
        cpus_per_task=int(resources.cpus_per_task or prof.cpus_per_task),
        signal_delay_s=prof.signal_delay_s,
        array_parallelism=max(1, min(launcher.max_parallel, prof.array_parallelism)),
        stderr_to_stdout=False,
    )
    gpus = resources.gpus_per_node if resources.gpus_per_node is not None else prof.gpus_per_node
    if gpus:
        params["gpus_per_node"] = int(gpus)
    mem = resources.mem_gb or prof.mem_gb
    if mem:
        params["mem"] = f"{int(mem)}GB" if float(mem) == int(mem) else f"{int(float(mem) * 1024)}MB"
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(prof, key):
            params[key] = getattr(prof, key)
    if prof.setup:
        params["setup"] = list(prof.setup)
    if prof.additional:
        params["additional_parameters"] = dict(prof.additional)
    ex.update_parameters(**params)
    return ex


# --------------------------------------------------------------------------- state dir


def _append_json(path: Path, obj: dict) -> None:
    append_job(path, obj)


def read_records(state_dir: str | os.PathLike) -> list[dict]:
    return read_jobs(Path(state_dir) / JOBS_FILE)  # a damaged file raises StateFileError naming it


def latest_records(sweep: Sweep) -> dict[int, dict]:
    """The latest job record of each cell (matching its current run id)."""
    by_cell: dict[int, dict] = {}
    ids = {c.index: c.run_id for c in sweep.cells}
    for rec in read_records(sweep.state_dir):
        if ids.get(rec.get("cell")) == rec.get("run_id"):
            by_cell[rec["cell"]] = rec
    return by_cell


def write_state_files(sweep: Sweep) -> Path:
    from suite.tracking.loggers import atomic_write_text

    d = Path(sweep.state_dir)
    (d / SUBMITIT_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write_text(d / "sweep.yaml", sweep.text)
    atomic_write_text(d / "matrix.json", sweep.matrix_json())
    atomic_write_text(d / "matrix.csv", sweep.matrix_csv())
    return d


# --------------------------------------------------------------------------- cell states


@dataclass
class CellState:
    cell: Cell
    state: str  # one of STATES
    job_id: str = ""
    error: str = ""  # first line of the error (failed)
    step: int = -1  # last checkpointed step (-1: none)

    def line(self) -> str:
        extra = f"  {self.error}" if self.error else ""
        step = f"step {self.step}/{self.cell.cfg.steps}" if self.step >= 0 else ""
        return f"{self.cell.index:>4}  {self.state:<11} {self.job_id:<12} {step:<12} {self.cell.run_id}{extra}"


def _last_step(run_dir: str) -> int:
    from suite.tracking.checkpoint import list_checkpoints

    ck = list_checkpoints(run_dir)
    return ck[-1][0] if ck else -1


def _result(folder: Path, job_id: str) -> tuple[str, object] | None:
    from submitit.core.utils import JobPaths, pickle_load

    p = JobPaths(folder, job_id=job_id, task_id=0).result_pickle
    if not p.exists():
        return None
    try:
        return pickle_load(p)
    except Exception:  # noqa: BLE001 - being written
        return None


def _pid_alive(pid: int, folder: Path) -> bool:
    """Whether `pid` is a live (not zombie) submitit local controller of this sweep."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().split(")")[-1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().decode(errors="replace")
    except OSError:
        return False
    return "submitit.local._local" in cmd and str(folder) in cmd


def _sacct(job_ids: list[str]) -> dict[str, str]:
    """job id (`123_4`) -> first word of its SLURM state, from one sacct call."""
    if not job_ids:
        return {}
    from submitit.slurm.slurm import SlurmInfoWatcher

    mains = sorted({j.split("_")[0] for j in job_ids})
    cmd = ["sacct", "-o", "JobID,State", "--parsable2"]
    for m in mains:
        cmd += ["-j", m]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"suite: sacct failed ({exc}); SLURM states unknown", file=sys.stderr)
        return {}
    info = SlurmInfoWatcher().read_info(out)
    return {j: (info[j].get("State") or "UNKNOWN").split()[0] for j in job_ids if j in info}


def cell_states(sweep: Sweep, live_jobs: dict | None = None) -> list[CellState]:
    """The state of every cell (see module docstring). `live_jobs` maps cell index -> the
    submitit job object of a local job started by this process (to reap it)."""
    from suite.cell import error_line
    from suite.tracking.rundir import ERROR_FILE

    recs = latest_records(sweep)
    folder = Path(sweep.state_dir) / SUBMITIT_DIR
    slurm_ids = [r["job_id"] for r in recs.values() if r.get("launcher") == "slurm" and not r.get("cancelled")]
    sacct = _sacct(slurm_ids)
    out = []
    for c in sweep.cells:
        st = CellState(cell=c, state="missing", step=_last_step(c.run_dir))
        rec = recs.get(c.index)
        if rec is not None:
            st.job_id = str(rec["job_id"])
        if os.path.exists(os.path.join(c.run_dir, "summary.json")):
            st.state = "done"
            out.append(st)
            continue
        if rec is None:
            st.state = "interrupted" if st.step >= 0 else "missing"
            out.append(st)
            continue
        if rec.get("cancelled"):
            st.state = "cancelled"
            out.append(st)
            continue
        res = _result(folder, st.job_id)
        if res is not None and res[0] == "error":
            st.state, st.error = "failed", error_line(str(res[1]))
        elif res is not None:
            st.state = "done"  # summary.json appears with the result
        elif rec.get("launcher") == "local":
            job = (live_jobs or {}).get(c.index)
            alive = job.state == "RUNNING" if job is not None else _pid_alive(int(st.job_id), folder)
            if alive:
                st.state = "running"
            elif (res := _result(folder, st.job_id)) is not None:  # it ended between the two checks
                st.state = "failed" if res[0] == "error" else "done"
                st.error = error_line(str(res[1])) if res[0] == "error" else ""
            else:
                st.state = "interrupted"  # killed without a result (the sweep or machine died)
                err = _read_error(os.path.join(c.run_dir, ERROR_FILE))
                if err:
                    st.state, st.error = "failed", err
        else:
            s = sacct.get(st.job_id, "PENDING")  # not in sacct yet: just submitted
            if s in _SLURM_RUNNING:
                st.state = "running"
            elif s in _SLURM_PENDING:
                st.state = "pending"
            elif s == "CANCELLED":
                st.state = "cancelled"
            elif s in _SLURM_FAILED:
                st.state = "failed"
                st.error = _read_error(os.path.join(c.run_dir, ERROR_FILE)) or f"SLURM job {st.job_id} ended {s}"
            else:
                st.state = "pending"
        out.append(st)
    return out


def _read_error(path: str) -> str:
    try:
        with open(path) as fh:
            return json.load(fh)["error"]
    except (OSError, ValueError, KeyError):
        return ""


def print_states(states: list[CellState], stream=None) -> None:
    stream = stream or sys.stdout
    print(f"{'cell':>4}  {'state':<11} {'job':<12} {'progress':<12} run id", file=stream)
    for s in states:
        print(s.line(), file=stream)
    counts = {k: sum(s.state == k for s in states) for k in STATES}
    print("  ".join(f"{k} {v}" for k, v in counts.items() if v) + f"  (of {len(states)})", file=stream, flush=True)


# --------------------------------------------------------------------------- MLflow parent


def parent_run(sweep: Sweep, *, create: bool = True) -> Optional[str]:
    """The sweep's MLflow parent run id: the one recorded in the state dir (same store),
    else a new run (name = sweep name, tag suite.kind=sweep) when `create`."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from suite.tracking.loggers import atomic_write_text, resolve_tracking_uri

    uri = resolve_tracking_uri(sweep.tracking_uri)
    path = Path(sweep.state_dir) / PARENT_FILE
    client = MlflowClient(tracking_uri=uri)
    info = read_parent(path)
    if info is not None:
        if info.get("tracking_uri") == uri:
            try:
                client.get_run(info["run_id"])
                return info["run_id"]
            except MlflowException:
                pass  # deleted: make a new one
    if not create:
        return None
    from suite.tracking.experiments import create_run

    run = create_run(client, sweep.experiment, run_name=sweep.name, tags={
        "suite.kind": "sweep", "sweep": sweep.name, "sweep_file": sweep.path,
        "mlflow.note.content": sweep.description or f"sweep {sweep.name} ({len(sweep.cells)} cells)"})
    atomic_write_text(path, json.dumps({"run_id": run.info.run_id, "tracking_uri": uri,
                                        "experiment": sweep.experiment}, indent=2))
    return run.info.run_id


def log_parent_artifacts(sweep: Sweep, run_id: str) -> None:
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    from suite.tracking.loggers import resolve_tracking_uri

    client = MlflowClient(tracking_uri=resolve_tracking_uri(sweep.tracking_uri))
    d = Path(sweep.state_dir)
    for name in ("sweep.yaml", "matrix.json", "matrix.csv"):
        client.log_artifact(run_id, str(d / name))
    have = client.get_run(run_id).data.params
    params = {"n_cells": str(len(sweep.cells)), "launcher": sweep.launcher.name,
              "axes": ",".join(sweep.axis_keys)[:500]}
    fresh = [Param(k, v) for k, v in params.items() if k not in have]
    if fresh:
        client.log_batch(run_id, params=fresh)
    if sweep.cli_overrides:
        client.set_tag(run_id, "cli_overrides", " ".join(sweep.cli_overrides)[:5000])


def set_parent_status(sweep: Sweep, status: str) -> None:
    """RUNNING, FINISHED, FAILED or KILLED (no-op without a parent)."""
    from mlflow.tracking import MlflowClient

    from suite.tracking.loggers import resolve_tracking_uri

    rid = parent_run(sweep, create=False)
    if rid is None:
        return
    client = MlflowClient(tracking_uri=resolve_tracking_uri(sweep.tracking_uri))
    if status == "RUNNING":
        client.update_run(rid, status="RUNNING")
    else:
        client.set_terminated(rid, status=status)


# --------------------------------------------------------------------------- submit / wait


def _cell_tags(sweep: Sweep, cell: Cell) -> dict[str, str]:
    return {"sweep": sweep.name, "cell": str(cell.index)}


def _submit(sweep: Sweep, executor, cells: list[Cell], parent_id: str) -> dict[int, object]:
    """Submit cells (one SLURM job array when several); record every job id before returning."""
    from suite.sweep.job import run_cell
    from suite.tracking.loggers import resolve_tracking_uri

    uri = resolve_tracking_uri(sweep.tracking_uri)
    jobs = []
    if len(cells) == 1:
        c = cells[0]
        jobs = [executor.submit(run_cell, list(c.overrides), c.run_dir, parent_id, _cell_tags(sweep, c), uri)]
    else:
        with executor.batch():
            for c in cells:
                jobs.append(executor.submit(run_cell, list(c.overrides), c.run_dir, parent_id,
                                            _cell_tags(sweep, c), uri))
    launcher = "local" if type(executor).__name__ == "LocalExecutor" else "slurm"
    path = Path(sweep.state_dir) / JOBS_FILE
    for c, j in zip(cells, jobs):
        _append_json(path, {"cell": c.index, "run_id": c.run_id, "job_id": str(j.job_id), "launcher": launcher,
                            "host": socket.gethostname(), "time": time.time()})
    return {c.index: j for c, j in zip(cells, jobs)}


def _finish_line(st: CellState, n_done: int, n_total: int) -> str:
    c = st.cell
    if st.state == "done":
        try:
            with open(os.path.join(c.run_dir, "summary.json")) as fh:
                s = json.load(fh)
            res = f"held-out acc {s['baseline_acc']:.3f} -> {s['final_acc']:.3f} ({s['delta_acc']:+.3f})"
        except (OSError, ValueError, KeyError, TypeError):
            res = ""
        return f"[{n_done}/{n_total}] done   cell {c.index} {c.run_id} {res}"
    return f"[{n_done}/{n_total}] {st.state:<6} cell {c.index} {c.run_id}  {st.error}"


def launch(sweep: Sweep, *, retry_failed: bool = False, wait: bool | None = None, stream=None) -> int:
    """Submit what is missing and (local, or slurm with `wait`) wait for it.

    Done cells are skipped; running/pending ones are left alone (and waited for); failed ones
    are re-submitted only with `retry_failed`; missing, interrupted and cancelled ones are
    submitted (resuming from their checkpoints). Returns 0 when every cell is done, 1 if any
    failed, 3 if the sweep was submitted and not waited for, 130 on interrupt.

    One driver per sweep: the state dir's lock (suite.tracking.lock) is held throughout, so a
    second `suite sweep` of the same file raises `SweepError` naming the first instead of
    submitting every cell again."""
    from suite.tracking.lock import RunLockedError, run_lock

    try:
        with run_lock(sweep.state_dir):
            return _launch(sweep, retry_failed=retry_failed, wait=wait, stream=stream)
    except RunLockedError as exc:
        raise SweepError(f"{sweep.path}: another `suite sweep` drives this sweep: {exc}") from None
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: the guard stopped the jobs and ended their runs
        print(f"\ninterrupted: run `suite sweep {sweep.path}` again to finish what is missing", file=stream or sys.stdout,
              flush=True)
        return 130


def _launch(sweep: Sweep, *, retry_failed: bool, wait: bool | None, stream) -> int:
    stream = stream or sys.stdout
    local = sweep.launcher.name == "local"
    wait = local if wait is None else (wait or local)
    if not local and (shutil.which("sbatch") is None or shutil.which("srun") is None):
        raise SweepError("launcher.name=slurm: sbatch/srun not found on PATH; run from a SLURM login node "
                         "(or use launcher=local)")
    write_state_files(sweep)
    folder = Path(sweep.state_dir) / SUBMITIT_DIR
    states = cell_states(sweep)
    by_state = {k: [s for s in states if s.state == k] for k in STATES}
    todo = by_state["missing"] + by_state["interrupted"] + by_state["cancelled"]
    if retry_failed:
        todo += by_state["failed"]
    todo.sort(key=lambda s: s.cell.index)
    n = len(states)
    print(f"sweep {sweep.name}: {n} cells; {len(by_state['done'])} done, "
          f"{len(by_state['running']) + len(by_state['pending'])} running or queued, "
          f"{len(by_state['failed'])} failed{'' if retry_failed or not by_state['failed'] else ' (re-submit with --retry-failed)'}; "
          f"submitting {len(todo)} ({sweep.launcher.name}, state {sweep.state_dir})", file=stream, flush=True)
    for s in by_state["failed"]:
        print(f"  failed cell {s.cell.index}: {s.error}", file=stream)
    active = by_state["running"] + by_state["pending"]
    if not todo and not active:
        parent = parent_run(sweep, create=False)
        if by_state["failed"]:
            return 1
        if parent is not None and len(by_state["done"]) == n:
            set_parent_status(sweep, "FINISHED")
        print(f"nothing to submit: {len(by_state['done'])}/{n} done", file=stream, flush=True)
        return 0
    from suite.tracking.loggers import resolve_tracking_uri

    parent = parent_run(sweep)
    log_parent_artifacts(sweep, parent)
    live: dict[int, object] = {}
    with Driver(resolve_tracking_uri(sweep.tracking_uri), parent,
                lambda: sweep_targets(sweep, live, drv.last_poll), on_stopped=lambda t: record_cancelled(sweep, t),
                out=lambda m: print(m, file=stream, flush=True)) as drv:
        return _drive(sweep, folder, todo, live, parent, wait, drv, stream)


def _drive(sweep: Sweep, folder: Path, todo: list[CellState], live: dict, parent: str, wait: bool, drv,
           stream) -> int:
    local = sweep.launcher.name == "local"
    set_parent_status(sweep, "RUNNING")
    executor = make_executor(sweep.launcher, folder, sweep.resources, job_name=sweep.name, sweep_path=sweep.path)
    if not local:
        if todo:
            with drv.hold():
                live.update(_submit(sweep, executor, [s.cell for s in todo], parent))
            first = next(iter(live.values()))
            print(f"submitted {len(todo)} cells as SLURM job array {str(first.job_id).split('_')[0]} "
                  f"(profile {sweep.launcher.profile}, at most {executor.parameters.get('array_parallelism')} at once)",
                  file=stream, flush=True)
        if not wait:
            print(f"follow it with: suite status {sweep.path}", file=stream, flush=True)
            return 3
        todo = []
    return _wait(sweep, executor, todo, live, parent, stream, drv)


def _wait(sweep: Sweep, executor, todo: list[CellState], live: dict, parent: str, stream, drv) -> int:
    local = sweep.launcher.name == "local"
    queue = [s.cell for s in todo]
    reported: set[int] = set()
    n = len(sweep.cells)
    start = time.time()

    # stop signals and errors: `drv` (suite.sweep.guard) stops the jobs and ends their MLflow runs
    states = drv.last_poll = cell_states(sweep, live)
    queued = {c.index for c in queue}
    for s in states:
        if s.state in ("done", "failed") and s.cell.index not in queued:
            reported.add(s.cell.index)
    while True:
        active = [s for s in states if s.state in ("running", "pending")]
        if local:
            slots = sweep.launcher.max_parallel - len(active)
            while queue and slots > 0:
                c = queue.pop(0)
                with drv.hold():
                    live.update(_submit(sweep, executor, [c], parent))
                print(f"started cell {c.index} {c.run_id}", file=stream, flush=True)
                slots -= 1
        states = drv.last_poll = cell_states(sweep, live)
        for s in states:
            if s.cell.index not in reported and s.state in ("done", "failed", "cancelled", "interrupted") \
                    and (s.cell.index in live or s.state != "interrupted"):
                reported.add(s.cell.index)
                print(_finish_line(s, sum(t.state == "done" for t in states), n), file=stream, flush=True)
        active = [s for s in states if s.state in ("running", "pending")]
        if not active and not queue:
            break
        time.sleep(sweep.launcher.poll_s)
    print(f"\nsweep {sweep.name} in {(time.time() - start) / 60:.1f} min:", file=stream)
    print_states(states, stream)
    failed = [s for s in states if s.state != "done"]
    set_parent_status(sweep, "FAILED" if failed else "FINISHED")
    return 1 if failed else 0


# --------------------------------------------------------------------------- cancel


def cancel(sweep: Sweep, stream=None) -> int:
    """Cancel the sweep's queued and running jobs; their MLflow runs end KILLED. Returns the
    number of cells cancelled."""
    from suite.tracking.loggers import resolve_tracking_uri

    stream = stream or sys.stdout
    states = cell_states(sweep)
    targets = [s for s in states if s.state in ("running", "pending")]
    if not targets:
        print(f"sweep {sweep.name}: nothing queued or running", file=stream)
        return 0
    folder = Path(sweep.state_dir) / SUBMITIT_DIR
    recs = latest_records(sweep)
    slurm_ids = [s.job_id for s in targets if recs[s.cell.index].get("launcher") == "slurm"]
    if slurm_ids:
        subprocess.run(["scancel", *slurm_ids], check=False, timeout=60)
    for s in targets:
        if recs[s.cell.index].get("launcher") == "local" and _pid_alive(int(s.job_id), folder):
            os.kill(int(s.job_id), signal.SIGINT)  # the controller stops its task (submitit's cancel)
    path = Path(sweep.state_dir) / JOBS_FILE
    for s in targets:
        rec = dict(recs[s.cell.index])
        rec.update(cancelled=True, time=time.time())
        _append_json(path, rec)
    # Wait until the jobs are gone, then end their MLflow runs as KILLED.
    deadline = time.time() + 120
    while time.time() < deadline:
        still = []
        if slurm_ids:
            sa = _sacct(slurm_ids)
            still = [j for j in slurm_ids if sa.get(j, "PENDING") in _SLURM_RUNNING | {"PENDING", "REQUEUED"}]
        still += [s.job_id for s in targets if recs[s.cell.index].get("launcher") == "local"
                  and _pid_alive(int(s.job_id), folder)]
        if not still:
            break
        time.sleep(1.0)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=resolve_tracking_uri(sweep.tracking_uri))
    for s in targets:
        rf = Path(s.cell.run_dir) / "mlflow_run.json"
        if rf.exists():
            try:
                client.set_terminated(json.loads(rf.read_text())["run_id"], status="KILLED")
            except Exception as exc:  # noqa: BLE001
                print(f"could not mark cell {s.cell.index}'s MLflow run KILLED: {exc}", file=stream)
        print(f"cancelled cell {s.cell.index} (job {s.job_id}, was {s.state})", file=stream)
    set_parent_status(sweep, "KILLED")
    return len(targets)
