"""The sweep's MLflow parent run: found in (or recorded to) the state dir's parent_run.json,
its artifacts (the sweep file and matrix) and params, and its status.

Every call here is bounded (suite.tracking.outage.VERB_HTTP_ENV: a dead server is an error
within ~10 s). `suite sweep` checks the store before it creates anything and refuses at once,
naming the URI, when it does not answer; an outage that starts mid-sweep does not stop it: the
cells train through it (their metrics wait in their run dirs, `suite sync`), and a status the
parent could not take is recorded by the next `suite sweep FILE` (`record_parent_status`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import sys

from suite.sweep.spec import Sweep
from suite.launch.state_files import read_parent
from suite.sweep.states import PARENT_FILE
from suite.tracking.outage import bounded_http

END_STATUSES = ("FINISHED", "FAILED", "KILLED")  # the parent run's ends that set_parent_status records

# --------------------------------------------------------------------------- MLflow parent


def parent_run(sweep: Sweep, *, create: bool = True) -> Optional[str]:
    """The sweep's MLflow parent run id: the one recorded in the state dir (same store),
    else a new run (name = sweep name, tag suite.kind=sweep) when `create`."""
    with bounded_http():
        return _parent_run(sweep, create)


def _parent_run(sweep: Sweep, create: bool) -> Optional[str]:
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
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise  # an outage is not a deleted run: never make a second parent
                # deleted: make a new one
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
    with bounded_http():
        _log_parent_artifacts(sweep, run_id)


def _log_parent_artifacts(sweep: Sweep, run_id: str) -> None:
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


def record_parent_status(sweep: Sweep, status: str, stream=None) -> bool:
    """`set_parent_status` during a sweep: an MLflow outage is reported in one line, not raised
    (the cells' results are in their run dirs; the next `suite sweep FILE` records the status)."""
    from suite.tracking.loggers import resolve_tracking_uri

    try:
        set_parent_status(sweep, status)
        return True
    except Exception as exc:  # noqa: BLE001 - an outage: the sweep's own outcome stands
        first = (str(exc).splitlines() or [""])[0][:200]
        print(f"suite: MLflow at {resolve_tracking_uri(sweep.tracking_uri)} did not take the parent run's status "
              f"{status} ({type(exc).__name__}: {first}); `suite sweep {sweep.path}` records it once the server "
              "answers", file=stream or sys.stderr, flush=True)
        return False


def set_parent_status(sweep: Sweep, status: str) -> None:
    """RUNNING, FINISHED, FAILED or KILLED (no-op without a parent). An end status is written
    once: a parent that already ended with `status` keeps its end time (re-running a finished
    sweep submits nothing and changes nothing), so its duration in the MLflow UI is the sweep's."""
    with bounded_http():
        _set_parent_status(sweep, status)


def _set_parent_status(sweep: Sweep, status: str) -> None:
    from mlflow.tracking import MlflowClient

    from suite.tracking.loggers import resolve_tracking_uri

    rid = _parent_run(sweep, create=False)
    if rid is None:
        return
    client = MlflowClient(tracking_uri=resolve_tracking_uri(sweep.tracking_uri))
    if status == "RUNNING":
        _record_status(sweep, rid, None)  # before MLflow: a record never says ended while MLflow says RUNNING
        client.update_run(rid, status="RUNNING")
        return
    info = client.get_run(rid).info
    if not (info.status == status and info.end_time):
        client.set_terminated(rid, status=status)
    _record_status(sweep, rid, status)


def _record_status(sweep: Sweep, rid: str, status: Optional[str]) -> None:
    """Write the end status the driver gave the parent run into parent_run.json (None: it runs
    again), so that `suite status` of an ended sweep knows it without MLflow (seconds to import
    and open a store)."""
    from suite.tracking.loggers import atomic_write_text

    path = Path(sweep.state_dir) / PARENT_FILE
    info = read_parent(path)
    if info is None or info.get("run_id") != rid:
        return
    info.pop("status", None)
    if status is not None:
        info["status"] = status
    atomic_write_text(path, json.dumps(info, indent=2))


def parent_status(sweep: Sweep) -> Optional[str]:
    """The parent run's MLflow status (None without a parent); reads only. An end status the
    driver recorded for this store's parent is taken from parent_run.json; anything else (no
    record of it, RUNNING) is asked of MLflow."""
    from suite.tracking.loggers import resolve_tracking_uri

    info = read_parent(Path(sweep.state_dir) / PARENT_FILE)
    if info is not None and info.get("status") in END_STATUSES \
            and info.get("tracking_uri") == resolve_tracking_uri(sweep.tracking_uri):
        return info["status"]
    from mlflow.tracking import MlflowClient

    with bounded_http():
        rid = _parent_run(sweep, create=False)
        if rid is None:
            return None
        return MlflowClient(tracking_uri=resolve_tracking_uri(sweep.tracking_uri)).get_run(rid).info.status
