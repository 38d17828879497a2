"""The run directory: one name for every file a run, its trackers and its launchers keep there.

A run directory (`<out_dir>/<run_id>` for `suite run` and sweep cells, `trial-NNNN` for tuning)
is the state of one run: a re-run resumes from it, a finished one returns its summary, and
`suite sync` rebuilds the MLflow record from it alone (docs/architecture.md, "Run directory").

    config.yaml          the resolved config (also an MLflow artifact)
    metrics.jsonl        one line per logged step: the source of truth for metrics
    params.json          flattened params as MLflow receives them
    tags.json            tags set after the run was created
    artifacts.json       paths passed to log_artifact
    mlflow_run.json      the MLflow run: tracking URI, experiment, run name, run id, creation tags
    mlflow_sync.json     the highest step MLflow has accepted, and an end status not yet sent
    checkpoints/         step_NNNNNNNN.pt (suite.tracking.checkpoint; verl's own checkpoints)
    summary.json         written last: the run is finished
    run.lock             one writer per run dir (suite.tracking.lock)
    sweep_error.json     the error of a sweep cell that raised (read by `suite status`)
    .trial.lock          a tuning trial's job holds it while it runs (suite.tune.worker)
    verl.log             main_ppo's output (verl backend; verl_node{k}.log on worker nodes)
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from suite.tracking.atomic import atomic_write

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
PARAMS_FILE = "params.json"
TAGS_FILE = "tags.json"
ARTIFACTS_FILE = "artifacts.json"
RUN_FILE = "mlflow_run.json"
SYNC_FILE = "mlflow_sync.json"
CHECKPOINT_DIR = "checkpoints"
SUMMARY_FILE = "summary.json"
LOCK_FILE = "run.lock"
ERROR_FILE = "sweep_error.json"
TRIAL_LOCK_FILE = ".trial.lock"
VERL_LOG_FILE = "verl.log"


def path(run_dir: str | os.PathLike, name: str) -> str:
    """`run_dir/name` as a string (the form `open`, `os.path` and submitit all take)."""
    return os.path.join(os.fspath(run_dir), name)


def read_summary(run_dir: str | os.PathLike) -> dict | None:
    """The finished run's summary.json, or None while it is not finished (or it is damaged:
    `summary_state` tells the two apart)."""
    try:
        with open(path(run_dir, SUMMARY_FILE), encoding="utf-8") as fh:
            summary = json.load(fh)
    except (FileNotFoundError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return summary if isinstance(summary, dict) else None


def summary_state(run_dir: str | os.PathLike) -> str:
    """"done" (summary.json is a JSON object), "damaged" (it exists but is not: truncated,
    overwritten, unreadable) or "absent". Reads only."""
    p = path(run_dir, SUMMARY_FILE)
    if not os.path.exists(p):
        return "absent"
    try:
        return "done" if read_summary(run_dir) is not None else "damaged"
    except OSError:
        return "damaged"


def is_finished(run_dir: str | os.PathLike) -> bool:
    """A run is finished once its summary.json exists and reads as a JSON object (both backends
    write it last, atomically; a damaged one means the result is not there)."""
    return summary_state(run_dir) == "done"


def finished_summary(run_dir: str | os.PathLike) -> dict | None:
    """For a backend starting on `run_dir`: its summary when the run is finished; None when it is
    not, after moving a damaged summary.json aside (summary.json.damaged), so the run resumes
    from its last checkpoint and writes a new one."""
    state = summary_state(run_dir)
    if state == "done":
        return read_summary(run_dir)
    if state == "damaged":
        p = path(run_dir, SUMMARY_FILE)
        os.replace(p, p + ".damaged")
        import logging

        logging.getLogger(__name__).warning("%s is damaged (moved aside to %s.damaged); the run resumes from its "
                                            "last checkpoint", p, SUMMARY_FILE)
    return None


def recorded_mlflow_run_id(run_dir: str | os.PathLike) -> str | None:
    """The MLflow run id recorded in mlflow_run.json; None when there is none yet (stopped before
    the backend made one) or a record that cannot be read."""
    try:
        with open(Path(run_dir) / RUN_FILE, encoding="utf-8") as fh:
            rid = json.load(fh).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return rid if isinstance(rid, str) and rid else None


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` so a crash leaves either the old or the new file, never half."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """A run-dir record file, atomically (indented, sorted keys: stable diffs between writes)."""
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """A run-dir record file; None when it does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


_CHECKPOINT_NAME = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    """`run_dir/checkpoints/step_{step:08d}.pt` (written by suite.tracking.checkpoint)."""
    return Path(run_dir) / CHECKPOINT_DIR / f"step_{step:08d}.pt"


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every complete-looking checkpoint, oldest first."""
    d = Path(run_dir) / CHECKPOINT_DIR
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _CHECKPOINT_NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def error_line(tb: str) -> str:
    """The first line of an error, from a traceback: its last 'ExcType: message' line."""
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if not ln.startswith((" ", "\t")) and not ln.startswith("Traceback") and not ln.startswith("During handling"):
            return ln.strip()[:500]
    return (lines[-1].strip() if lines else "unknown error")[:500]
