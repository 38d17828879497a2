"""The sweep state directory's records and the state of every cell.

State directory (`Sweep.state_dir` = `<out_dir>/_sweeps/<name>/`):

    sweep.yaml          the sweep file as last launched
    matrix.json/.csv    the expanded matrix (also artifacts of the MLflow parent run)
    parent_run.json     the MLflow parent run (reused by every re-run of the sweep)
    jobs.jsonl          one line per submission or cancellation: cell, run id, job id
    submitit/           submitit's pickles and logs (`<job>_0_log.out/.err`)

A cell's state is derived from its run directory first (a readable summary.json = done) and then
from its latest job (submitit's result pickle, `sacct` for SLURM, the controller PID locally). The
run directory is the result, not the launcher's record of it: a cell whose job succeeded but
whose run directory is gone or has no readable summary.json is *incomplete*, and a re-run of the
sweep submits it again (it resumes from whatever checkpoints are left).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from suite.sweep.spec import Cell, Sweep
from suite.launch.slurm import SLURM_FAILED, SLURM_PENDING, SLURM_RUNNING, pid_alive, sacct
from suite.launch.state_files import append_job, read_jobs
from suite.tracking.rundir import is_finished

JOBS_FILE = "jobs.jsonl"
PARENT_FILE = "parent_run.json"
SUBMITIT_DIR = "submitit"

STATES = ("done", "running", "pending", "failed", "cancelled", "interrupted", "incomplete", "missing")


# --------------------------------------------------------------------------- state dir


def append_json(path: Path, obj: dict) -> None:
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
        step = f"step {self.step}/{self.cell.steps}" if self.step >= 0 else ""
        return f"{self.cell.index:>4}  {self.state:<11} {self.job_id:<12} {step:<12} {self.cell.run_id}{extra}"


def _last_step(run_dir: str) -> int:
    from suite.tracking.rundir import list_checkpoints

    ck = list_checkpoints(run_dir)
    return ck[-1][0] if ck else -1


def _result(folder: Path, job_id: str) -> tuple[str, object] | None:
    """The job's (outcome, value) result pickle when it has written one: submitit's public
    `Job.paths` names the file; it is a plain pickle (cloudpickle writes pickle's format)."""
    import pickle

    import submitit

    p = submitit.Job(folder=folder, job_id=job_id).paths.result_pickle
    if not p.exists():
        return None
    try:
        with open(p, "rb") as fh:
            return pickle.load(fh)
    except Exception:  # noqa: BLE001 - being written
        return None


def cell_states(sweep: Sweep, live_jobs: dict | None = None) -> list[CellState]:
    """The state of every cell (see module docstring). `live_jobs` maps cell index -> the
    submitit job object of a local job started by this process (to reap it)."""
    from suite.tracking.rundir import ERROR_FILE, error_line, summary_state

    recs = latest_records(sweep)
    folder = Path(sweep.state_dir) / SUBMITIT_DIR
    slurm_ids = [r["job_id"] for r in recs.values() if r.get("launcher") == "slurm" and not r.get("cancelled")]
    slurm_states = sacct(slurm_ids)
    out = []
    for c in sweep.cells:
        st = CellState(cell=c, state="missing", step=_last_step(c.run_dir))
        rec = recs.get(c.index)
        if rec is not None:
            st.job_id = str(rec["job_id"])
        summary = summary_state(c.run_dir)
        if summary == "done":
            st.state = "done"
            out.append(st)
            continue
        if summary == "damaged":
            st.state, st.error = "incomplete", f"{c.run_dir}/summary.json is damaged; a re-run resumes the cell"
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
        elif res is not None:  # the job succeeded, so summary.json was written: it is gone since
            st.state, st.error = "incomplete", _lost(c.run_dir)
        elif rec.get("launcher") == "local":
            job = (live_jobs or {}).get(c.index)
            alive = job.state == "RUNNING" if job is not None else pid_alive(int(st.job_id), folder)
            if alive:
                st.state = "running"
            elif (res := _result(folder, st.job_id)) is not None:  # it ended between the two checks
                if res[0] == "error":
                    st.state, st.error = "failed", error_line(str(res[1]))
                else:
                    st.state, st.error = ("done", "") if is_finished(c.run_dir) else ("incomplete", _lost(c.run_dir))
            else:
                st.state = "interrupted"  # killed without a result (the sweep or machine died)
                err = _read_error(os.path.join(c.run_dir, ERROR_FILE))
                if err:
                    st.state, st.error = "failed", err
        else:
            s = slurm_states.get(st.job_id, "PENDING")  # not in sacct yet: just submitted
            if s in SLURM_RUNNING:
                st.state = "running"
            elif s in SLURM_PENDING:
                st.state = "pending"
            elif s == "CANCELLED":
                st.state = "cancelled"
            elif s == "COMPLETED" and not os.path.exists(os.path.join(c.run_dir, ERROR_FILE)):
                st.state, st.error = "incomplete", _lost(c.run_dir)
            elif s in SLURM_FAILED:
                st.state = "failed"
                st.error = _read_error(os.path.join(c.run_dir, ERROR_FILE)) or f"SLURM job {st.job_id} ended {s}"
            else:
                st.state = "pending"
        out.append(st)
    return out


def _lost(run_dir: str) -> str:
    what = "is gone" if not os.path.isdir(run_dir) else "has no summary.json"
    return f"its job ended but the run dir {what}; a re-run submits it again"


def _read_error(path: str) -> str:
    try:
        with open(path) as fh:
            return json.load(fh)["error"]
    except (OSError, ValueError, KeyError):
        return ""


def print_states(states: list[CellState], stream=None, sweep=None) -> None:
    """The cells' table and counts; with `sweep`, what a narrowed launch (`--only`) left out of the file's matrix."""
    stream = stream or sys.stdout
    print(f"{'cell':>4}  {'state':<11} {'job':<12} {'progress':<12} run id", file=stream)
    for s in states:
        print(s.line(), file=stream)
    counts = {k: sum(s.state == k for s in states) for k in STATES}
    total = f"  (of {len(states)})"
    size = getattr(sweep, "matrix_size", 0) or len(states)
    if size > len(states):
        only = " ".join(f"--only {o}" for o in (sweep.only or [])) or "a narrowed launch"
        total = (f"  (of {len(states)} launched with {only}; the file's matrix has {size} cells: "
                 f"`suite sweep {sweep.path}` without --only adds the other {size - len(states)})")
    print("  ".join(f"{k} {v}" for k, v in counts.items() if v) + total, file=stream, flush=True)
