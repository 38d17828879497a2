"""What runs inside a trial's job: one embedded run that reports to the Optuna storage.

`run_trial(payload)` composes the trial's config, makes the run an MLflow child of the
study's parent run (tags `tune_study`, `trial`), and runs it in the trial's run directory
through `suite.cell.run_cell` (as `suite run` and sweep cells do: a trial that raises ends its
MLflow run FAILED with the error as a tag).
After every held-out evaluation it reports the accuracy to the study's storage
(`trial.report`) and asks the study's pruner (`trial.should_prune`); a pruned run stops there
(the trainer's `on_eval` hook) and says so. The driver, not the job, tells Optuna the result.

The run directory is the trial's state: a re-submitted trial (after `suite tune` was killed)
resumes from its last checkpoint, or returns at once if it finished. A lock file keeps two
processes out of one run directory: the job left behind by a killed driver keeps running, and
the re-submitted one waits for it, then reads its result.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import time
from pathlib import Path

from suite.launch.job import ResumableJob
from suite.tracking.rundir import METRICS_FILE, TRIAL_LOCK_FILE
from suite.tune.spec import PrunerSpec, TuneSpecError


def last_metric(run_dir: str, key: str) -> tuple[float | None, int | None]:
    """The value of metric ``key`` at the last step metrics.jsonl logs it, and that step."""
    from suite.tracking.loggers import read_jsonl

    value = step = None
    for entry in read_jsonl(os.path.join(run_dir, METRICS_FILE)):
        if key in entry["metrics"]:
            value, step = float(entry["metrics"][key]), int(entry["step"])
    return value, step


def _sqlite_path(url: str) -> Path | None:
    return Path(url[len("sqlite:///"):]) if url.startswith("sqlite:////") else None


@contextlib.contextmanager
def driver_lock(storage_url: str):
    """One `suite tune` per sqlite study file at a time (the kernel drops the lock when its
    holder dies, even by SIGKILL). Other RDB URLs: one driver per study is the user's rule."""
    path = _sqlite_path(storage_url)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TuneSpecError(f"storage: another `suite tune` is driving {path} (lock {path}.lock is held)") from None
        yield


def open_storage(url: str):
    """Optuna RDB storage; SQLite waits up to 60 s for a lock instead of failing at once
    (the driver and every running trial write to the same file)."""
    import optuna

    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite:") else {}
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def build_pruner(p: PrunerSpec):
    """The Optuna pruner a study and each of its trial jobs use (the driver opens the study with
    it; a trial re-opens it to report and ask `should_prune`)."""
    import optuna

    if p.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps,
                                           interval_steps=p.interval_steps)
    if p.name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_resource, reduction_factor=p.reduction_factor,
                                                      min_early_stopping_rate=p.min_early_stopping_rate)
    return optuna.pruners.NopPruner()


def run_trial(payload: dict) -> dict:
    """Run one trial; returns {number, pruned, value, step, mlflow_run_id, run_dir, final_acc}.

    ``payload``: study, storage (URL), pruner (PrunerSpec fields), number, trial_id, overrides
    (Hydra), run_dir (absolute), parent_run_id, tags, metric (objective key), run_name (MLflow; optional).
    """
    import optuna

    from suite.cell import compose_cell, run_cell
    from suite.tune.spec import PrunerSpec

    n = payload["number"]
    cfg = compose_cell(payload["overrides"], parent_run_id=payload["parent_run_id"], tags=payload["tags"],
                       run_name=payload.get("run_name"))
    run_dir = payload["run_dir"]
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, TRIAL_LOCK_FILE), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"trial {n}: {run_dir} is held by the job of an interrupted `suite tune`; waiting for it", flush=True)
            t = time.perf_counter()
            fcntl.flock(lock, fcntl.LOCK_EX)
            print(f"trial {n}: run dir free after {time.perf_counter() - t:.0f} s", flush=True)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(
            study_name=payload["study"], storage=open_storage(payload["storage"]),
            pruner=build_pruner(PrunerSpec(**payload["pruner"])),
        )
        trial = optuna.trial.Trial(study, payload["trial_id"])

        def on_eval(step: int, acc: float) -> bool:
            trial.report(acc, step)
            if step >= cfg.steps:  # the run is complete: its result is a value, not a prune
                return False
            if trial.should_prune():
                print(f"trial {n}: pruned at step {step}/{cfg.steps}: held-out acc {acc:.4f} is behind the "
                      f"other trials at this step ({payload['pruner']['name']} pruner)", flush=True)
                return True
            return False

        print(f"trial {n}: {' '.join(payload['param_overrides'])} in {run_dir} (pid {os.getpid()})", flush=True)
        summary = run_cell(cfg, run_dir, on_eval=on_eval)
    value, step = last_metric(run_dir, payload["metric"])
    if value is not None and not math.isfinite(value):
        value = None
    return {
        "number": n,
        "pruned": summary.pruned,
        "value": value,
        "step": step,
        "mlflow_run_id": summary.mlflow_run_id,
        "run_dir": run_dir,
        "final_acc": summary.final_acc,
    }


def _trial_label(payload: dict) -> str:
    return f"trial {payload['number']}"


# `run_trial` as a submitit job that SLURM may preempt or time out: the requeued job resumes
# the trial from the run's last checkpoint (the run directory is the state) under the same job id.
trial_job = ResumableJob(run_trial, _trial_label)
