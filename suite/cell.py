"""Run one cell and record its outcome: the one path from a composed config to a backend, for
`suite run`, sweep cells (suite.launch.job) and tuning trials (suite.tune.worker) alike.

`run_cell(cfg, run_dir)` resolves `cfg.backend.name` (suite.backend), runs it, and when it
raises ends the cell's MLflow run FAILED with the error as a tag (creating the run if the
backend failed before it did), so no run stays RUNNING forever. The backend itself ends a
run FINISHED, or KILLED when `on_eval` pruned it. A run that was refused before it started is
not a failure of that run and is re-raised untouched:

- `RunLockedError`: another process writes this run dir; its MLflow run is its own.
- `HardwareError` (this machine cannot run the recorded numerics), `CorruptMetricsError`
  (metrics.jsonl holds lines a resume would delete) and `NoReadableCheckpoint`: refused before a run dir or MLflow run
  exists for `suite run`, which exits 2. A sweep cell (`sweep_cell=True`) records them as a
  failed cell instead, so the sweep's parent run and `suite status` show why it did not run.

The MLflow run of a cell carries the run's axes, its identity tags, `tracking.tags` (sweep and
trial tags), the run id and the parent run; `suite.tracking.cell_run.open_mlflow_run` is the one
place that builds it, and `run_cell` hands the backend that opener (`open_run`): a backend never
reaches back up here for its run.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Mapping

from omegaconf import DictConfig

from suite.backend import OnEval, RunSummary, get_backend
from suite.tracking import rundir
from suite.tracking.cell_run import open_mlflow_run, opener
from suite.tracking.rundir import error_line


def mark_failed(cfg: DictConfig, run_dir: str, message: str) -> None:
    """End the cell's MLflow run FAILED (creating it if the run failed before the backend did),
    with the error as a tag; the run dir's record keeps a retry on the same MLflow run."""
    logger = open_mlflow_run(cfg, run_dir, catch_up=False)
    logger.set_tags({"error": message[:490]})
    logger.close("FAILED")


def write_error(run_dir: str, tb: str) -> None:
    """Record a sweep cell's error in `run_dir/sweep_error.json` (its first line is what
    `suite status` shows for a job that left no result)."""
    from suite.tracking.atomic import atomic_write

    try:
        os.makedirs(run_dir, exist_ok=True)
        payload = json.dumps({"error": error_line(tb), "traceback": tb, "time": time.time()}, indent=2)
        atomic_write(rundir.path(run_dir, rundir.ERROR_FILE), lambda fh: fh.write(payload.encode()))
    except OSError:
        pass  # an unwritable run dir: submitit's result pickle still has the traceback


def job_tags() -> dict[str, str]:
    """Where this launcher job runs, as MLflow tags: `slurm_job_id` (`<array>_<index>` for an array
    task) and `job_log` (submitit's stdout file; stderr sits beside it with `_log.err`), from
    submitit's public `JobEnvironment`; none outside a submitit job."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return {}
    import submitit

    try:
        env = submitit.JobEnvironment()
        tags = {"job_log": str(env.paths.stdout)}
    except RuntimeError:  # an executor submitit has no environment for
        return {}
    if os.environ["SUBMITIT_EXECUTOR"] == "slurm":
        tags["slurm_job_id"] = str(env.job_id)
    return tags


def prepare_cell(cfg: DictConfig, *, parent_run_id: str | None = None, tags: Mapping[str, object] | None = None,
                 tracking_uri: str | None = None, run_name: str | None = None) -> DictConfig:
    """A launcher job's config: a copy of the cell's composed `cfg` (the sweep driver composed it
    once; it travels pickled in submitit's job file, never through a shell), made an MLflow child
    of `parent_run_id` with `tags` and `job_tags()` (not part of the run id), on `tracking_uri`
    and named `run_name` when given (an explicit `tracking.run_name` override wins), its threads
    those of the SLURM allocation when it leaves them to torch."""
    import copy

    from omegaconf import open_dict

    cfg = copy.deepcopy(cfg)
    if tracking_uri:
        cfg.tracking.tracking_uri = tracking_uri
    if run_name and not cfg.tracking.run_name:
        cfg.tracking.run_name = run_name
    cfg.tracking.parent_run_id = parent_run_id or ""
    with open_dict(cfg.tracking.tags):  # a Dict[str, str] field: closed in struct mode
        for k, v in {**(tags or {}), **job_tags()}.items():
            cfg.tracking.tags[str(k)] = str(v)
    if cfg.threads == 0 and os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        # the allocation, not the node: torch would otherwise use every core it sees
        cfg.threads = int(os.environ["SLURM_CPUS_PER_TASK"])
    return cfg


def compose_cell(overrides: list[str], **job) -> DictConfig:
    """`prepare_cell` of the config `overrides` compose (a tuning trial, sampled on the driver,
    composed where it runs)."""
    from suite.config import compose_config

    return prepare_cell(compose_config(list(overrides)), **job)


def interruption(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or SystemExit that `exc` was raised while handling, if any.

    A stop signal (SIGINT from a cancelling driver) that lands inside a cleanup can come out as
    another error: torch.save's zip writer, interrupted mid-write, raises
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos`` from its ``__exit__``,
    with the KeyboardInterrupt as its context."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def run_cell(cfg: DictConfig, run_dir: str, *, on_eval: OnEval | None = None, progress: bool = False,
             sweep_cell: bool = False) -> RunSummary:
    """Run `cfg` with its backend in `run_dir` and record a failure in MLflow (module docstring).
    With `sweep_cell`, the error is also written to `run_dir/sweep_error.json` and a refusal
    counts as a failure."""
    from suite.hardware import HardwareError
    from suite.tracking.checkpoint import NoReadableCheckpoint
    from suite.tracking.lock import RunLockedError
    from suite.tracking.loggers import CorruptMetricsError

    backend = get_backend(cfg.backend.name)
    if sweep_cell:
        err_path = rundir.path(run_dir, rundir.ERROR_FILE)
        if os.path.exists(err_path):
            os.remove(err_path)  # a retry: the old error no longer describes this attempt
    refused = (RunLockedError,) if sweep_cell else (RunLockedError, HardwareError, CorruptMetricsError,
                                                    NoReadableCheckpoint)
    try:
        return backend(cfg, run_dir, on_eval, progress=progress, open_run=opener(cfg, run_dir))
    except refused:
        raise
    except Exception as exc:
        stop = interruption(exc)
        if stop is not None:  # a stop, not a failure: the driver that sent it records the run KILLED
            raise stop from exc
        tb = traceback.format_exc()
        if sweep_cell:
            write_error(run_dir, tb)
        from suite.tracking.fscheck import env_fault

        if env_fault(exc) is not None and rundir.recorded_mlflow_run_id(run_dir) is None:
            raise  # a disk fault before the backend made its MLflow run: no run to end, and none made to fail
        try:
            mark_failed(cfg, run_dir, error_line(tb))
        except Exception as mexc:  # noqa: BLE001 - e.g. the server is down: never hide the run's own error
            print(f"suite: could not mark the MLflow run FAILED: {mexc}", file=sys.stderr)
        raise
