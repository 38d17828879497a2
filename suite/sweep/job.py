"""What runs inside a submitit job: one cell, resumable.

`run_cell(overrides, run_dir, parent_run_id, tags)` composes the cell's config from its
overrides (they travel pickled in submitit's job file, never through a shell), makes the run
an MLflow child of the sweep's parent run, and runs it in `run_dir`. The run directory is
the state: a re-run resumes from its last checkpoint, a finished one returns its summary.

`run_cell` is a `submitit.helpers.Checkpointable`: on SLURM preemption or time limit
submitit sends USR2, calls `checkpoint()` (which resubmits the same call), requeues the job,
and the requeued job resumes from the run's last checkpoint. The trainer cuts
metrics.jsonl back to that checkpoint and never re-sends a step MLflow already has, so no
step is lost or duplicated.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from submitit.helpers import Checkpointable as _Checkpointable

ERROR_FILE = "sweep_error.json"  # run_dir file written when a cell raises (first line read by `suite status`)


def error_line(tb: str) -> str:
    """The first line of an error, from a traceback: its last 'ExcType: message' line."""
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if not ln.startswith((" ", "\t")) and not ln.startswith("Traceback") and not ln.startswith("During handling"):
            return ln.strip()[:500]
    return (lines[-1].strip() if lines else "unknown error")[:500]


def mark_mlflow_failed(cfg, run_dir: str, parent_run_id: str | None, tags: dict, message: str) -> None:
    """End the cell's MLflow run as FAILED (creating it if the run failed before the trainer did),
    with the error as a tag; the trainer's run-dir record keeps a retry on the same MLflow run."""
    from suite.config import axes, identity_tags, run_id
    from suite.tracking.loggers import MlflowLogger

    logger = MlflowLogger.for_run_dir(
        run_dir, cfg.tracking.tracking_uri, cfg.tracking.experiment,
        cfg.tracking.run_name or os.path.basename(run_dir),
        tags={**axes(cfg), **identity_tags(cfg), **dict(cfg.tracking.tags), **tags, "run_id": run_id(cfg)}, parent_run_id=parent_run_id,
        catch_up=False,
    )
    logger.set_tags({"error": message[:490]})
    logger.close("FAILED")


def _write_error(run_dir: str, tb: str) -> None:
    from suite.tracking.atomic import atomic_write

    try:
        os.makedirs(run_dir, exist_ok=True)
        payload = json.dumps({"error": error_line(tb), "traceback": tb, "time": time.time()}, indent=2)
        atomic_write(os.path.join(run_dir, ERROR_FILE), lambda fh: fh.write(payload.encode()))
    except OSError:
        pass  # an unwritable run dir: submitit's result pickle still has the traceback


class RunCell:
    """Callable + checkpointable runner of one sweep cell (use the module-level `run_cell`)."""

    def __call__(self, overrides: list[str], run_dir: str, parent_run_id: str | None = None,
                 tags: dict | None = None, tracking_uri: str | None = None) -> dict:
        from omegaconf import open_dict

        from suite.config import compose_config
        from suite.tracking.lock import RunLockedError

        tags = {str(k): str(v) for k, v in (tags or {}).items()}
        cfg = compose_config(list(overrides))
        if tracking_uri:
            cfg.tracking.tracking_uri = tracking_uri
        cfg.tracking.parent_run_id = parent_run_id or ""
        with open_dict(cfg.tracking.tags):  # a Dict[str, str] field: closed in struct mode
            for k, v in tags.items():
                cfg.tracking.tags[k] = v
        if cfg.threads == 0 and os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
            # the allocation, not the node: torch would otherwise use every core it sees
            cfg.threads = int(os.environ["SLURM_CPUS_PER_TASK"])
        from suite.tracking.checkpoint import list_checkpoints

        ckpts = list_checkpoints(run_dir)
        start = f"resuming from step {ckpts[-1][0]}" if ckpts else "from the start"
        print(f"suite sweep cell {tags.get('cell', '?')}: {os.path.basename(run_dir)} {start} "
              f"(pid {os.getpid()})", flush=True)
        err_path = os.path.join(run_dir, ERROR_FILE)
        if os.path.exists(err_path):
            os.remove(err_path)  # a retry: the old error no longer describes this attempt
        try:
            if cfg.backend.name == "embedded":
                from suite.embedded.trainer import EmbeddedRun

                summary = EmbeddedRun(cfg, run_dir, progress=False).run()
            else:  # HOOK: issue 6 adds suite.verl.runner.run(cfg, run_dir) with the same contract
                from suite.verl.runner import run as verl_run

                summary = verl_run(cfg, run_dir)
        except RunLockedError:  # another process writes this cell: its MLflow run and run dir are its own
            raise
        except Exception as exc:
            tb = traceback.format_exc()
            _write_error(run_dir, tb)
            try:
                mark_mlflow_failed(cfg, run_dir, parent_run_id, tags, error_line(tb))
            except Exception as mexc:  # noqa: BLE001 - never hide the run's own error
                print(f"could not mark the MLflow run FAILED: {mexc}", file=sys.stderr)
            raise exc
        print(f"suite sweep cell {tags.get('cell', '?')}: done, held-out acc "
              f"{summary['baseline_acc']:.3f} -> {summary['final_acc']:.3f}", flush=True)
        return summary

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on preemption/timeout: resubmit the same call. The state is the
        run directory (the trainer's checkpoints), so nothing needs to be pickled here."""
        from submitit.helpers import DelayedSubmission

        print("suite sweep: preempted or timed out; requeueing (resumes from the last checkpoint)", flush=True)
        return DelayedSubmission(self, *args, **kwargs)


class CheckpointableRunCell(RunCell, _Checkpointable):
    """`RunCell` marked checkpointable for submitit (its `checkpoint` overrides the default)."""


run_cell = CheckpointableRunCell()
