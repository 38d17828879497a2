"""`suite sync RUN_DIR`: send what a run directory holds beyond its sync marker to its MLflow run.

A run that lost its server (or was killed with an unsent buffer) is completed later from the
run directory alone: params.json, tags.json, artifacts.json, metrics.jsonl, and the MLflow run
and marker files (suite.tracking.rundir), through the `MlflowLogger` in sync mode.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from suite.tracking.mlflow_logger import MlflowLogger, resolve_tracking_uri, tracking_uri_problem
from suite.tracking.rundir import (
    ARTIFACTS_FILE,
    METRICS_FILE,
    PARAMS_FILE,
    RUN_FILE,
    SYNC_FILE,
    TAGS_FILE,
    read_json,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SyncResult:
    """What `resync` did."""

    run_id: str
    tracking_uri: str
    steps_sent: int  # distinct steps with at least one metric sent
    metrics_sent: int
    synced_step: int  # every step <= this is in MLflow (-1: none)



def resync(
    run_dir: str | os.PathLike,
    tracking_uri: str | None = None,
    *,
    end_status: str | None = None,
) -> SyncResult:
    """Send a run directory's JSONL metrics beyond the sync marker to its MLflow run.

    Idempotent: a second call sends nothing. Creates the run if it never reached MLflow
    (server down for the whole run), and (re)sends params, tags and artifacts from the run
    dir (params already there are skipped, tags and artifacts are overwritten with the same
    content). `tracking_uri` overrides the one recorded in the run dir (a different URI
    means a new run there, sent from step 0). `end_status` (e.g. "FAILED" for a run that
    was killed and will not be resumed) ends the run; without it, a status that `close()`
    could not send is sent now. Raises if MLflow is unreachable (this is for the CLI).
    """
    run_dir = Path(run_dir)
    info = read_json(run_dir / RUN_FILE)
    if info is None:
        raise FileNotFoundError(
            f"{run_dir / RUN_FILE} not found: {run_dir} was not logged with an MlflowLogger"
        )
    uri = resolve_tracking_uri(tracking_uri or info["tracking_uri"])
    run_id = info.get("run_id") if uri == info["tracking_uri"] else None
    logger = MlflowLogger(
        uri,
        info.get("experiment") or "suite",
        info.get("run_name") or run_dir.name,
        run_id=run_id,
        tags=info.get("tags"),
        run_dir=run_dir,
        _sync_mode=True,
    )
    logger.log_params(read_json(run_dir / PARAMS_FILE) or {})
    logger.set_tags(read_json(run_dir / TAGS_FILE) or {})
    for path in read_json(run_dir / ARTIFACTS_FILE) or []:
        if Path(path).exists():
            logger.log_artifact(path)
        else:
            log.warning("artifact %s no longer exists, not uploaded", path)
    logger.enqueue_jsonl(run_dir / METRICS_FILE)
    logger.flush()
    logger.terminate(end_status)
    return SyncResult(
        run_id=logger.run_id,
        tracking_uri=uri,
        steps_sent=len(logger.steps_sent),
        metrics_sent=logger.metrics_sent,
        synced_step=logger.synced_step,
    )


def run_dir_problem(run_dir: Path) -> str | None:
    """What is wrong with the run dir or its record files (None: nothing found)."""
    if not run_dir.exists():
        return f"{run_dir}: no such run directory"
    if not run_dir.is_dir():
        return f"{run_dir} is a file, not a run directory (give the directory holding {METRICS_FILE})"
    from suite.schemas import (ArtifactsFile, MetricsLine, ParamsFile, RunRecordFile, SchemaError, SyncMarkerFile,
                               TagsFile, read_json, validate)

    if not (run_dir / RUN_FILE).is_file():
        return (f"{run_dir / RUN_FILE}: not found, so {run_dir} is no run the suite logged (a run dir is "
                "out_dir/<run id>, as `suite run` prints it)")
    schemas = {RUN_FILE: RunRecordFile, SYNC_FILE: SyncMarkerFile, PARAMS_FILE: ParamsFile, TAGS_FILE: TagsFile,
               ARTIFACTS_FILE: ArtifactsFile}
    for name, schema in schemas.items():
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            read_json(schema, path)
        except SchemaError as exc:
            return f"{exc}; restore it or delete it (then `suite sync` starts a new MLflow run)"
    metrics = run_dir / METRICS_FILE
    if metrics.is_file():
        try:
            text = metrics.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"{metrics}: not UTF-8 text (byte {exc.start}); restore it or move it aside"
        # what follows the last newline is a line cut by a kill, which the run repairs when it resumes
        for n, line in enumerate(text.split("\n")[:-1], 1):
            if not line.strip():
                continue
            try:
                validate(MetricsLine, json.loads(line), f"{metrics}: line {n}")
            except json.JSONDecodeError as exc:
                return f"{metrics}: line {n}: not valid JSON ({exc.msg}); repair the line or move the file aside"
            except SchemaError as exc:
                return f"{exc}; repair the line or move the file aside"
    return None


def resync_cli(run_dir: str | os.PathLike, tracking_uri: str | None = None,
               end_status: str | None = None) -> int:
    """`suite sync RUN_DIR [--tracking-uri URI]`: print one summary line; exit code 0/1, or 2
    for a run dir whose files are damaged (the message names the file)."""
    uri_problem = tracking_uri_problem(tracking_uri) if tracking_uri else None
    problem = f"--tracking-uri {uri_problem}" if uri_problem else run_dir_problem(Path(run_dir))
    if problem:
        print(f"suite sync {run_dir}: {problem}", file=sys.stderr)
        return 2
    try:
        r = resync(run_dir, tracking_uri, end_status=end_status)
    except Exception as e:  # noqa: BLE001 - a CLI reports, it does not trace back
        print(f"suite sync {run_dir}: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(
        f"suite sync {run_dir}: run {r.run_id} at {r.tracking_uri}: sent {r.metrics_sent} "
        f"metrics over {r.steps_sent} steps; MLflow has every step <= {r.synced_step}"
    )
    return 0
