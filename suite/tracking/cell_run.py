"""The MLflow run of one cell: created (or resumed from the run dir's record) with the cell's
tags, as a `MlflowLogger`.

`suite.cell.run_cell` hands a backend its opener (`open_run`, the `OpenRun` of suite.backend),
and a backend opens the run when it is ready to log, after its refusals (a run that is refused
before it starts makes no MLflow run). A backend called directly (tests, benchmarks) opens the
same run with `opener(cfg, run_dir)`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from omegaconf import DictConfig


def run_tags(cfg: DictConfig, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags a cell's MLflow run is created with: its axes, identity, `tracking.tags` (sweep and
    trial tags), `extra` (what the backend knows once built) and the run id."""
    from suite.identity import axes, identity_tags, run_id

    return {**axes(cfg), **identity_tags(cfg), **dict(cfg.tracking.tags), **dict(extra or {}), "run_id": run_id(cfg)}


def open_mlflow_run(cfg: DictConfig, run_dir: str, *, tags: Mapping[str, str] | None = None,
                    run_name: str | None = None, catch_up: bool = True):
    """The `MlflowLogger` of the cell in `run_dir`: the run recorded there, else a new child of
    `tracking.parent_run_id` tagged with `run_tags(cfg, tags)`, named `tracking.run_name`, else
    `run_name`, else `suite.identity.run_name(cfg)`. See `MlflowLogger.for_run_dir` for `catch_up`."""
    from suite.identity import run_name as default_name
    from suite.tracking.loggers import MlflowLogger

    t = cfg.tracking
    return MlflowLogger.for_run_dir(
        run_dir, t.tracking_uri, t.experiment, t.run_name or run_name or default_name(cfg),
        tags=run_tags(cfg, tags), parent_run_id=t.parent_run_id or None, catch_up=catch_up,
    )


def opener(cfg: DictConfig, run_dir: str):
    """`open_run(tags=None, catch_up=True)` for the cell `cfg` in `run_dir` (suite.backend.OpenRun)."""
    return functools.partial(open_mlflow_run, cfg, run_dir)
