"""What runs inside a submitit job: one cell, resumable.

`run_cell(cfg, run_dir, parent_run_id, tags)` takes the cell's config as the sweep driver
composed it (once per sweep: it travels pickled in submitit's job file), makes the run an MLflow
child of the sweep's parent run, and runs it in `run_dir`
through `suite.cell.run_cell` (the backend, and a failure recorded in MLflow and in
`run_dir/sweep_error.json`). The run directory is the state: a re-run resumes from its last
checkpoint, a finished one returns its summary.

`ResumableJob` is a `submitit.helpers.Checkpointable`: on SLURM preemption or time limit
submitit sends USR2, calls `checkpoint()` (which resubmits the same call), requeues the job,
and the requeued job resumes from the run's last checkpoint. The trainer cuts
metrics.jsonl back to that checkpoint and never re-sends a step MLflow already has, so no
step is lost or duplicated. Sweep cells and tuning trials (suite.tune.worker) share it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from submitit.helpers import Checkpointable as _Checkpointable

from suite.backend import RunSummary

if TYPE_CHECKING:
    from omegaconf import DictConfig


class ResumableJob(_Checkpointable):
    """`fn` as a submitit job whose state is its run directory: when submitit checkpoints it
    (preemption, time limit) the same call is resubmitted, and resumes from the run's last
    checkpoint. `label(*args, **kwargs)` names the job in the requeue message."""

    def __init__(self, fn: Callable, label: Callable[..., str]):
        self.fn = fn
        self.label = label

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on preemption/timeout: resubmit the same call. The state is the
        run directory (the trainer's checkpoints), so nothing needs to be pickled here."""
        from submitit.helpers import DelayedSubmission

        print(f"{self.label(*args, **kwargs)}: preempted or timed out; requeueing (resumes from the last checkpoint)",
              flush=True)
        return DelayedSubmission(self, *args, **kwargs)


def _run_cell(cell: DictConfig | list[str], run_dir: str, parent_run_id: str | None = None,
              tags: dict | None = None, tracking_uri: str | None = None, run_name: str | None = None) -> RunSummary:
    from omegaconf import DictConfig

    from suite.cell import compose_cell, prepare_cell
    from suite.cell import run_cell as run_one
    from suite.tracking.checkpoint import list_checkpoints

    tags = {str(k): str(v) for k, v in (tags or {}).items()}
    job = dict(parent_run_id=parent_run_id, tags=tags, tracking_uri=tracking_uri, run_name=run_name)
    # the driver's composed config; a list of overrides is a job pickled before configs travelled
    cfg = prepare_cell(cell, **job) if isinstance(cell, DictConfig) else compose_cell(list(cell), **job)
    ckpts = list_checkpoints(run_dir)
    start = f"resuming from step {ckpts[-1][0]}" if ckpts else "from the start"
    print(f"suite sweep cell {tags.get('cell', '?')}: {os.path.basename(run_dir)} {start} "
          f"(pid {os.getpid()})", flush=True)
    summary = run_one(cfg, run_dir, sweep_cell=True)
    print(f"suite sweep cell {tags.get('cell', '?')}: done, held-out acc "
          f"{summary.baseline_acc:.3f} -> {summary.final_acc:.3f}", flush=True)
    return summary


def _cell_label(*args, **kwargs) -> str:
    return "suite sweep"


run_cell = ResumableJob(_run_cell, _cell_label)
"""run_cell(cfg, run_dir, parent_run_id=None, tags=None, tracking_uri=None, run_name=None) -> RunSummary"""
