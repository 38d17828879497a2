"""Launching a sweep: submission (local window or SLURM job array), waiting, cancelling.

The parts it drives live by job: `suite.launch.executors` (submitit executors),
`suite.sweep.states` (the state directory and each cell's state), `suite.sweep.parent` (the
MLflow parent run), `suite.launch.guard` (a driver that stops early) and `suite.launch.job`
(what runs inside each job).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from suite.identity import run_name
from suite.launch.executors import controller_stderr, make_executor
from suite.launch.guard import Driver, job_target, pid_target
from suite.sweep.parent import log_parent_artifacts, parent_run, record_parent_status
from suite.sweep.spec import Cell, Sweep, SweepError, overrides_changed, read_record, sweep_command
from suite.launch.slurm import SLURM_RUNNING, pid_alive, sacct, slurm_problem
from suite.sweep.states import (
    JOBS_FILE,
    STATES,
    SUBMITIT_DIR,
    CellState,
    append_json,
    cell_states,
    latest_records,
    print_states,
    write_state_files,
)
from suite.tracking.rundir import RUN_FILE, is_finished, read_summary

# --------------------------------------------------------------------------- submit / wait


def _cell_tags(sweep: Sweep, cell: Cell) -> dict[str, str]:
    from suite.tracking.experiments import SOURCE_NAME_TAG, suite_command

    # the job's own argv is submitit's; the command that made the run is this driver's
    return {"sweep": sweep.name, "cell": str(cell.index), SOURCE_NAME_TAG: suite_command()}


def _submit(sweep: Sweep, executor, cells: list[Cell], parent_id: str) -> dict[int, object]:
    """Submit cells (one SLURM job array when several); record every job id before returning."""
    from suite.launch.job import run_cell
    from suite.tracking.loggers import resolve_tracking_uri

    uri = resolve_tracking_uri(sweep.tracking_uri)
    jobs = []
    slurm = type(executor).__name__ != "LocalExecutor"
    if len(cells) == 1:
        c = cells[0]
        if slurm:  # one job is named at submission; only an array's tasks need renaming
            executor.update_parameters(job_name=task_name(sweep, c))
        with controller_stderr(executor):
            jobs = [executor.submit(run_cell, c.cfg, c.run_dir, parent_id, _cell_tags(sweep, c), uri,
                                    run_name(c.cfg, c.axes))]
    else:
        with controller_stderr(executor), executor.batch():
            for c in cells:
                jobs.append(executor.submit(run_cell, c.cfg, c.run_dir, parent_id,
                                            _cell_tags(sweep, c), uri, run_name(c.cfg, c.axes)))
    launcher = "slurm" if slurm else "local"
    path = Path(sweep.state_dir) / JOBS_FILE
    for c, j in zip(cells, jobs):
        append_json(path, {"cell": c.index, "run_id": c.run_id, "job_id": str(j.job_id), "launcher": launcher,
                           "host": socket.gethostname(), "time": time.time()})
    if slurm and len(cells) > 1:
        _name_tasks(sweep, cells, jobs)
    return {c.index: j for c, j in zip(cells, jobs)}


def task_name(sweep: Sweep, cell: Cell) -> str:
    """The SLURM job name of a cell's task, as `squeue` and `sacct` show it."""
    return f"{sweep.name}:{cell.index}"


def _name_tasks(sweep: Sweep, cells: list[Cell], jobs: list) -> None:
    """Name each array task `<sweep>:<cell>`: the tasks of an array share the array's name, and
    after `--retry-failed` task k of a new array is not cell k. SLURM renames a pending task on
    its own (`scontrol update JobId=<array>_<k> JobName=...`). A single job is named by sbatch
    instead: a rename racing its start reached the accounting database once without the name
    (`sacct` showed `allocation`, slurmdbd's name for a job recorded with none). A refusal (a task that already
    ended, an old SLURM) leaves the sweep's name, which `suite status` maps to cells anyway."""
    for c, j in zip(cells, jobs):
        try:
            subprocess.run(["scontrol", "update", f"JobId={j.job_id}", f"JobName={task_name(sweep, c)}"],
                           capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return


def _finish_line(st: CellState, n_done: int, n_total: int) -> str:
    c = st.cell
    if st.state == "done":
        try:
            s = read_summary(c.run_dir)
            res = f"held-out acc {s['baseline_acc']:.3f} -> {s['final_acc']:.3f} ({s['delta_acc']:+.3f})"
        except (OSError, ValueError, KeyError, TypeError):
            res = ""
        return f"[{n_done}/{n_total}] done   cell {c.index} {c.run_id} {res}"
    return f"[{n_done}/{n_total}] {st.state:<6} cell {c.index} {c.run_id}  {st.error}"


def launch(sweep: Sweep, *, retry_failed: bool = False, wait: bool | None = None, stream=None) -> int:
    """Submit what is missing and (local, or slurm with `wait`) wait for it.

    Done cells are skipped; running/pending ones are left alone (and waited for); failed ones
    are re-submitted only with `retry_failed`; missing, interrupted, cancelled and incomplete
    (run dir deleted or damaged) ones are submitted (resuming from their checkpoints). Returns 0
    when every cell is done, 1 if any failed, 3 if the sweep was submitted and not waited for,
    130 on interrupt.

    One driver per sweep: the state dir's lock (suite.tracking.lock) is held throughout, so a
    second `suite sweep` of the same file raises `SweepError` naming the first instead of
    submitting every cell again."""
    from suite.tracking.lock import RunLockedError, run_lock
    from suite.tracking.loggers import resolve_tracking_uri
    from suite.tracking.outage import StoreUnreachable, check_store

    if sweep.launcher.name == "slurm" and (problem := slurm_problem()) is not None:
        raise SweepError(problem)
    _refuse_other_overrides(sweep)
    _refuse_missing_backend(sweep)
    try:  # before anything is created: a sweep that cannot record its parent run does not start
        check_store(resolve_tracking_uri(sweep.tracking_uri), verb="suite sweep")
    except StoreUnreachable as exc:
        raise SweepError(str(exc)) from None
    try:
        with run_lock(sweep.state_dir):
            return _launch(sweep, retry_failed=retry_failed, wait=wait, stream=stream)
    except RunLockedError as exc:
        raise SweepError(f"{sweep.path}: another `suite sweep` drives this sweep: {exc}") from None
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: the guard stopped the jobs and ended their runs
        print(f"\ninterrupted: finish what is missing with: {sweep_command(sweep)}", file=stream or sys.stdout,
              flush=True)
        return 130


def _refuse_missing_backend(sweep: Sweep) -> None:
    """A cell's backend package missing where it will run: here for the local launcher, and on
    SLURM where the profile's `setup` does not change the environment (the jobs then run this
    interpreter's packages)."""
    from suite.backend import backend_missing

    if sweep.launcher.name == "slurm" and sweep.profile is not None and sweep.profile.setup:
        return
    seen = set()
    for c in sweep.cells:
        key = (c.cfg.backend.name, str(c.cfg.backend.get("python", "")))
        if key in seen:
            continue
        seen.add(key)
        if (problem := backend_missing(c.cfg)) is not None:
            raise SweepError(f"cell {c.index}: {problem}; nothing was submitted")


def _refuse_other_overrides(sweep: Sweep) -> None:
    """A sweep's state dir holds one set of cells: relaunching with other cell overrides would mix
    two sweeps' records there (and follow a resume hint into a different, long sweep)."""
    found = read_record(sweep.state_dir)
    if found is None:
        return
    before = list(found[0].get("cli_overrides") or [])
    if not (diff := overrides_changed(before, sweep.cli_overrides)):
        return
    was = dataclasses.replace(sweep, cli_overrides=before, only=list(found[0].get("only") or []))
    raise SweepError(f"{sweep.path}: its state dir {sweep.state_dir} holds a launch with other overrides ({diff}). "
                     f"Resume that sweep with: {sweep_command(was)}; or give this one its own state and run dirs "
                     f"with out_dir=DIR")


def _launch(sweep: Sweep, *, retry_failed: bool, wait: bool | None, stream) -> int:
    stream = stream or sys.stdout
    local = sweep.launcher.name == "local"
    wait = local if wait is None else (wait or local)
    write_state_files(sweep)
    folder = Path(sweep.state_dir) / SUBMITIT_DIR
    states = cell_states(sweep)
    by_state = {k: [s for s in states if s.state == k] for k in STATES}
    todo = by_state["missing"] + by_state["interrupted"] + by_state["cancelled"] + by_state["incomplete"]
    if retry_failed:
        todo += by_state["failed"]
    todo.sort(key=lambda s: s.cell.index)
    n = len(states)
    print(f"sweep {sweep.name}: {n} cells; {len(by_state['done'])} done, "
          f"{len(by_state['running']) + len(by_state['pending'])} running or queued, "
          f"{len(by_state['failed'])} failed"
          f"{'' if retry_failed or not by_state['failed'] else ' (re-submit with --retry-failed)'}; "
          f"submitting {len(todo)} ({sweep.launcher.name}, state {sweep.state_dir})", file=stream, flush=True)
    for s in by_state["failed"]:
        print(f"  failed cell {s.cell.index}: {s.error}", file=stream)
    active = by_state["running"] + by_state["pending"]
    if not todo and not active:
        parent = parent_run(sweep, create=False)
        if by_state["failed"]:
            return 1
        if parent is not None and len(by_state["done"]) == n:
            record_parent_status(sweep, "FINISHED", stream)
        print(f"nothing to submit: {len(by_state['done'])}/{n} done", file=stream, flush=True)
        return 0
    from suite.tracking.loggers import resolve_tracking_uri

    try:
        parent = parent_run(sweep)
    except Exception as exc:  # noqa: BLE001 - checked up a moment ago: it went down since
        raise SweepError(f"the MLflow store at {resolve_tracking_uri(sweep.tracking_uri)} did not create the sweep's "
                         f"parent run ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}); nothing "
                         "was submitted") from None
    try:
        log_parent_artifacts(sweep, parent)
    except Exception as exc:  # noqa: BLE001 - the sweep file is in the state dir too; the next launch logs it
        print(f"suite: could not log the sweep file to the parent run ({type(exc).__name__}); continuing",
              file=stream, flush=True)
    live: dict[int, object] = {}
    with Driver(resolve_tracking_uri(sweep.tracking_uri), parent,
                lambda: sweep_targets(sweep, live, drv.last_poll), on_stopped=lambda t: record_cancelled(sweep, t),
                out=lambda m: print(m, file=stream, flush=True)) as drv:
        return _drive(sweep, folder, todo, live, parent, wait, drv, stream)


def _drive(sweep: Sweep, folder: Path, todo: list[CellState], live: dict, parent: str, wait: bool, drv,
           stream) -> int:
    local = sweep.launcher.name == "local"
    record_parent_status(sweep, "RUNNING", stream)
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
            print(f"follow it with: {sweep_command(sweep, 'status')}", file=stream, flush=True)
            return 3
        todo = []
    return _wait(sweep, executor, todo, live, parent, stream, drv)


def _wait(sweep: Sweep, executor, todo: list[CellState], live: dict, parent: str, stream, drv) -> int:
    from suite.launch.progress import Progress

    queue = [s.cell for s in todo]
    reported: set[int] = set()
    start = time.time()
    prog = Progress(f"sweep {sweep.name}", len(sweep.cells), stream=stream, every_s=sweep.launcher.progress_s)
    try:
        return _wait_loop(sweep, executor, queue, reported, live, parent, stream, drv, prog, start)
    finally:
        prog.close()


def _work(states: list[CellState], session: set[int]) -> float:
    """Cells of this session finished (1 each) or under way (their checkpointed fraction)."""
    work = 0.0
    for s in states:
        if s.cell.index in session:
            work += 1.0 if s.state in ("done", "failed") else max(s.step, 0) / max(s.cell.steps, 1)
    return work


def _wait_loop(sweep: Sweep, executor, queue: list[Cell], reported: set[int], live: dict, parent: str, stream,
               drv, prog, start: float) -> int:
    local = sweep.launcher.name == "local"
    n = len(sweep.cells)
    session = {c.index for c in queue} | set(live)
    # stop signals and errors: `drv` (suite.launch.guard) stops the jobs and ends their MLflow runs
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
                prog.write(f"started cell {c.index} {c.run_id}")
                slots -= 1
        states = drv.last_poll = cell_states(sweep, live)
        for s in states:
            if s.cell.index not in reported and s.state in ("done", "failed", "cancelled", "interrupted") \
                    and (s.cell.index in live or s.state != "interrupted"):
                reported.add(s.cell.index)
                prog.write(_finish_line(s, sum(t.state == "done" for t in states), n))
        active = [s for s in states if s.state in ("running", "pending")]
        count = {k: sum(s.state == k for s in states) for k in ("done", "failed")}
        prog.update(count["done"], len(active), count["failed"], len(queue), _work(states, session), len(session))
        if not active and not queue:
            break
        time.sleep(sweep.launcher.poll_s)
    prog.close()
    print(f"\nsweep {sweep.name} in {(time.time() - start) / 60:.1f} min:", file=stream)
    print_states(states, stream, sweep=sweep)
    failed = [s for s in states if s.state != "done"]
    record_parent_status(sweep, "FAILED" if failed else "FINISHED", stream)
    from suite.tracking.experiments import ui_hint
    from suite.tracking.loggers import resolve_tracking_uri

    print(f"MLflow UI: {ui_hint(resolve_tracking_uri(sweep.tracking_uri), parent)}", file=stream, flush=True)
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
        if recs[s.cell.index].get("launcher") == "local" and pid_alive(int(s.job_id), folder):
            os.kill(int(s.job_id), signal.SIGINT)  # the controller stops its task (submitit's cancel)
    path = Path(sweep.state_dir) / JOBS_FILE
    for s in targets:
        rec = dict(recs[s.cell.index])
        rec.update(cancelled=True, time=time.time())
        append_json(path, rec)
    # Wait until the jobs are gone, then end their MLflow runs as KILLED.
    deadline = time.time() + 120
    while time.time() < deadline:
        still = []
        if slurm_ids:
            sa = sacct(slurm_ids)
            still = [j for j in slurm_ids if sa.get(j, "PENDING") in SLURM_RUNNING | {"PENDING", "REQUEUED"}]
        still += [s.job_id for s in targets if recs[s.cell.index].get("launcher") == "local"
                  and pid_alive(int(s.job_id), folder)]
        if not still:
            break
        time.sleep(1.0)
    from mlflow.tracking import MlflowClient

    from suite.tracking.outage import bounded_http

    client = MlflowClient(tracking_uri=resolve_tracking_uri(sweep.tracking_uri))
    for s in targets:
        rf = Path(s.cell.run_dir) / RUN_FILE
        if rf.exists():
            try:
                with bounded_http():
                    client.set_terminated(json.loads(rf.read_text())["run_id"], status="KILLED")
            except Exception as exc:  # noqa: BLE001
                print(f"could not mark cell {s.cell.index}'s MLflow run KILLED: {exc}", file=stream)
        print(f"cancelled cell {s.cell.index} (job {s.job_id}, was {s.state})", file=stream)
    record_parent_status(sweep, "KILLED", stream)
    return len(targets)


# --------------------------------------------------------------------------- a sweep's jobs


def sweep_targets(sweep, live: dict, states: list | None) -> list:
    """What a sweep driver can stop: the jobs it submitted (`live`: cell index -> submitit job)
    and the local cells of an earlier driver it was waiting for (`states`: its last poll;
    their controllers are this host's processes). SLURM jobs it did not submit are the
    scheduler's, queued on purpose: they are left alone."""
    cells = {c.index: c for c in sweep.cells}
    out = [job_target(f"cell {i}", job, cells[i].run_dir) for i, job in sorted(live.items())
           if not is_finished(cells[i].run_dir)]  # done: nothing to stop
    adopted = [s for s in states or [] if s.state == "running" and s.cell.index not in live]
    if adopted:
        folder = Path(sweep.state_dir) / SUBMITIT_DIR
        recs = latest_records(sweep)
        for s in adopted:
            rec = recs.get(s.cell.index, {})
            if rec.get("launcher") == "local" and str(rec.get("job_id", "")).isdigit():
                pid = int(rec["job_id"])
                out.append(pid_target(f"cell {s.cell.index}", pid, lambda p=pid: pid_alive(p, folder),
                                      s.cell.run_dir))
    return out


def record_cancelled(sweep, targets: list) -> None:
    """A `cancelled` line per stopped cell in jobs.jsonl, so `suite status` says what happened."""
    by_dir = {c.run_dir: c for c in sweep.cells}
    recs = latest_records(sweep)
    for t in targets:
        cell = by_dir.get(t.run_dir)
        if cell is not None and cell.index in recs and not is_finished(cell.run_dir):
            append_json(Path(sweep.state_dir) / JOBS_FILE, {**recs[cell.index], "cancelled": True, "time": time.time()})
