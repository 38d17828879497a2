"""Metric loggers: one interface, JSONL / MLflow / console implementations, and resync.

A run directory holds everything needed to rebuild the MLflow record of a run:

    metrics.jsonl      one line per `log_metrics` call: {"step": s, "time": unix_s, "metrics": {...}}
    params.json        flattened, stringified params (what MLflow receives, before truncation)
    tags.json          tags, stringified
    artifacts.json     absolute paths passed to `log_artifact`
    mlflow_run.json    {"tracking_uri", "experiment", "experiment_id", "run_name", "run_id",
                        "tags"}: the run, and the tags it is created with
    mlflow_sync.json   {"run_id", "synced_step", "end_status"}: every metric of every step
                       <= synced_step has been accepted by that MLflow run

The JSONL file is written at once and is the source of truth; MLflow receives metrics in
batches when the trainer flushes (at each checkpoint commit, docs/architecture.md), and a
send that fails is kept in memory and retried at the next flush, never raised into training.
`resync` sends whatever the JSONL file holds beyond `synced_step`, so a run that lost its
server (or was killed with an unsent buffer) can be completed later with `suite sync RUN_DIR`.

Resending is safe twice over: the marker stops it, and MLflow's SQL stores use
(key, timestamp, step, value) as the metric's primary key and skip exact duplicates
(mlflow/store/tracking/sqlalchemy_store.py `_log_metrics_once`), so a batch that reached the
server before a client timeout is not stored twice when it is sent again with the same
timestamps. `MultiLogger` stamps each step once so JSONL and MLflow carry the same timestamp.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from suite.tracking.atomic import atomic_write

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
PARAMS_FILE = "params.json"
TAGS_FILE = "tags.json"
ARTIFACTS_FILE = "artifacts.json"
RUN_FILE = "mlflow_run.json"
SYNC_FILE = "mlflow_sync.json"

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
RUN_END_STATUSES = ("FINISHED", "FAILED", "KILLED")  # mlflow.entities.RunStatus, terminal

# MLflow's limits, from mlflow/utils/validation.py (mlflow 3.17.2).
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_KEY_LENGTH = 250
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000

# mlflow 3.17.2 reads these on every request (mlflow/utils/rest_utils.py `http_request`), so
# setting them around our own calls is enough. Its defaults (7 retries, backoff factor 2,
# 120 s timeout) make one call to a dead server hang for minutes. While training we try
# once with a 2 s connect/read timeout (the variable is an int: 1 s is too tight for a
# 1000-metric batch on a busy sqlite server) and rely on the next flush to retry. A variable
# the user has set in the environment is left alone.
LIVE_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "2",
}
# `suite sync` is run by hand when the server is believed up: a few retries (1, 2, 4 s
# backoff) ride out a restart without hanging for minutes if it is still down.
SYNC_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


@runtime_checkable
class MetricLogger(Protocol):
    """What the trainer logs to. `timestamp` (unix seconds) lets `MultiLogger` give every
    sink the same time for a step; sinks stamp `time.time()` when it is None."""

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def set_tags(self, tags: Mapping[str, Any]) -> None: ...

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, timestamp: float | None = None
    ) -> None: ...

    def log_artifact(self, path: str | os.PathLike) -> None: ...

    def flush(self) -> None: ...

    def close(self, status: str = "FINISHED") -> None: ...


# ----------------------------------------------------------------------------- helpers


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings (and dataclass instances) -> one level with dotted keys.

    `{"optim": {"lr": 1e-3}}` -> `{"optim.lr": 0.001}`. Lists and other values are kept
    as leaves (they become one param each, stringified).
    """
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, Mapping):
            if value:
                flat.update(flatten_params(value, name))
            else:
                flat[name] = "{}"
        else:
            flat[name] = value
    return flat


def _stringify(values: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in values.items()}


def _truncate(kind: str, values: Mapping[str, str], max_len: int) -> dict[str, str]:
    """Cut keys and values to MLflow's limits; a rejected batch would lose the whole batch."""
    out: dict[str, str] = {}
    for key, value in values.items():
        if len(key) > MAX_KEY_LENGTH:
            log.warning("%s key longer than %d chars truncated: %r", kind, MAX_KEY_LENGTH, key)
            key = key[:MAX_KEY_LENGTH]
        if len(value) > max_len:
            log.warning("%s %r: value of %d chars truncated to %d", kind, key, len(value), max_len)
            value = value[:max_len]
        out[key] = value
    return out


_MLFLOW_BAD_CHARS = re.compile(r"[^/\w.\- :]")


def mlflow_metric_key(key: str) -> str:
    """The MLflow name of a metric key, sanitized as verl's MLflow logger does
    (verl/utils/tracking.py, 0.9.1), so embedded and verl runs share names in MLflow:
    ``@`` becomes ``_at_`` (``val-core/x/acc/mean@1`` -> ``mean_at_1``), repeated slashes
    collapse, and any other character MLflow rejects becomes ``_``. JSONL keeps the original."""
    key = re.sub(r"/+", "/", key.replace("@", "_at_"))
    return _MLFLOW_BAD_CHARS.sub("_", key)


def _to_float(key: str, value: Any) -> float:
    try:
        return float(value)  # python/numpy scalars and 0-d tensors
    except (TypeError, ValueError) as e:
        raise TypeError(f"metric {key!r}: {value!r} is not a number") from e


def _timestamp_ms(unix_s: float) -> int:
    # The one conversion used for live sends and resync, so both give MLflow the same key.
    return int(round(unix_s * 1000))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` so a crash leaves either the old or the new file, never half."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def _write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def resolve_tracking_uri(uri: str | None = None) -> str:
    """`uri`, else `$MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db`; relative sqlite and
    plain paths are made absolute, so a URI stored in a run dir means the same store
    whatever directory `suite sync` is later run from."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///") :]
        if rel and rel != ":memory:":
            return "sqlite:///" + str(Path(rel).resolve())
    if "://" not in uri and not uri.startswith(("databricks", "sqlite:")):
        return str(Path(uri).resolve())
    return uri


@contextlib.contextmanager
def _http_env(env: Mapping[str, str]) -> Iterator[None]:
    """Set MLflow HTTP variables the user has not set, for the duration of our calls only,
    so other MLflow use in the process keeps its own (patient) defaults."""
    added = [k for k in env if k not in os.environ]
    for k in added:
        os.environ[k] = env[k]
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


# --------------------------------------------------------------------------- JSONL


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Entries of a metrics JSONL file, in file order. An unparsable line (a write cut by
    a crash) is skipped with a warning. Non-finite values come back as float nan/inf."""
    path = Path(path)
    entries = []
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        return []
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s:%d: skipping an unreadable line", path, lineno)
    return entries


def _repair_tail(path: Path) -> None:
    """Drop a partial last line left by a crash mid-write, so the next append starts clean."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        content = f.read()
        keep = content.rfind(b"\n") + 1  # 0 when there is no complete line at all
        log.warning("%s: dropping a partial last line (%d bytes)", path, len(content) - keep)
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())


class CorruptMetricsError(ValueError):
    """A metrics JSONL line that cannot be read, other than a last line cut by a kill."""


def _entry_step(line: str) -> int | None:
    try:
        step = json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def check_jsonl(path: str | os.PathLike) -> list[int]:
    """Line numbers of unreadable entries of a metrics JSONL file before its last line (a cut
    last line is a kill mid-write, which `JsonlLogger` repairs by itself)."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return []
    if lines and lines[-1] == b"":
        lines.pop()
    bad = []
    for lineno, raw in enumerate(lines[:-1], 1):
        if raw.strip() and _entry_step(raw.decode("utf-8", errors="replace")) is None:
            bad.append(lineno)
    return bad


def refuse_corrupt_jsonl(path: str | os.PathLike, drop_corrupt: bool = False) -> list[int]:
    """Raise `CorruptMetricsError` naming the file and its unreadable lines (`check_jsonl`),
    unless `drop_corrupt`; returns those line numbers."""
    bad = check_jsonl(path)
    if bad and not drop_corrupt:
        raise CorruptMetricsError(
            f"{path}: line(s) {', '.join(map(str, bad[:10]))}{' ...' if len(bad) > 10 else ''} cannot be read as "
            f"metrics (JSON with an integer step); resuming would delete them. Repair or move the file, or resume "
            f"dropping them with tracking.drop_corrupt_metrics=true")
    return bad


def truncate_jsonl(path: str | os.PathLike, step: int, *, drop_corrupt: bool = False) -> int:
    """Keep only entries with `step <= step` (atomic replace). Returns how many were dropped.

    An unreadable line before the last one is recorded data that would be deleted: raises
    `CorruptMetricsError` naming the file and lines, unless `drop_corrupt`."""
    path = Path(path)
    bad = refuse_corrupt_jsonl(path, drop_corrupt)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except FileNotFoundError:
        return 0
    kept, dropped = [], 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        entry_step = _entry_step(line)
        if entry_step is None:
            if lineno in bad:
                log.warning("%s:%d: dropping an unreadable line (tracking.drop_corrupt_metrics)", path, lineno)
            dropped += 1  # a cut line: never keep it
            continue
        if entry_step <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
        else:
            dropped += 1
    atomic_write_text(path, "".join(kept))
    return dropped


class JsonlLogger:
    """Appends one JSON object per `log_metrics` call to `run_dir/metrics.jsonl`.

    The file is line-buffered, so each line reaches the OS as one write and survives a
    `kill -9` of the process; `flush()` also fsyncs it (survives a machine crash). Params,
    tags and artifact paths go to small JSON files next to it so `resync` can rebuild the
    MLflow run from the directory alone. NaN/inf are written as JSON `NaN`/`Infinity`
    (Python's json reads them back; use `read_jsonl`).
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        _repair_tail(self.path)
        self._f: IO[str] | None = self._open()

    def _open(self) -> IO[str]:
        return open(self.path, "a", buffering=1, encoding="utf-8")

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, timestamp: float | None = None
    ) -> None:
        entry = {
            "step": int(step),
            "time": time.time() if timestamp is None else float(timestamp),
            "metrics": {str(k): _to_float(k, v) for k, v in metrics.items()},
        }
        if self._f is None:
            raise ValueError(f"JsonlLogger for {self.run_dir} is closed")
        self._f.write(json.dumps(entry, separators=(",", ":")) + "\n")

    def _merge_json(self, name: str, values: Mapping[str, str]) -> None:
        path = self.run_dir / name
        merged = _read_json(path) or {}
        merged.update(values)
        _write_json(path, merged)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._merge_json(PARAMS_FILE, _stringify(flatten_params(params)))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._merge_json(TAGS_FILE, _stringify(tags))

    def log_artifact(self, path: str | os.PathLike) -> None:
        listing = self.run_dir / ARTIFACTS_FILE
        paths = _read_json(listing) or []
        p = str(Path(path).resolve())
        if p not in paths:
            _write_json(listing, [*paths, p])

    def truncate_after(self, step: int, *, drop_corrupt: bool = False) -> int:
        """Keep entries with step <= `step` (used on resume, so no step is logged twice;
        -1 keeps none). Returns the number of entries dropped. An unreadable line in the
        middle raises `CorruptMetricsError` unless `drop_corrupt` (see `truncate_jsonl`)."""
        if self._f is not None:
            self._f.close()
        try:
            dropped = truncate_jsonl(self.path, step, drop_corrupt=drop_corrupt)
        finally:
            self._f = self._open()
        return dropped

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self, status: str = "FINISHED") -> None:
        if self._f is not None:
            self.flush()
            self._f.close()
            self._f = None


# --------------------------------------------------------------------------- console


class ConsoleLogger:
    """Prints `step N | key value | ...` to stderr every `every` steps (step % every == 0).

    `keys` selects and orders the metrics shown (missing ones are skipped); None shows all.
    """

    def __init__(self, every: int = 10, keys: Sequence[str] | None = None, stream: IO | None = None):
        if every < 1:
            raise ValueError(f"ConsoleLogger.every must be >= 1, got {every}")
        self.every = every
        self.keys = list(keys) if keys is not None else None
        self.stream = stream

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, timestamp: float | None = None
    ) -> None:
        if step % self.every:
            return
        keys = self.keys if self.keys is not None else list(metrics)
        parts = [f"step {step}"]
        parts += [f"{k} {_to_float(k, metrics[k]):.4g}" for k in keys if k in metrics]
        print(" | ".join(parts), file=self.stream or sys.stderr, flush=True)

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def log_artifact(self, path: str | os.PathLike) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, status: str = "FINISHED") -> None:
        pass


# --------------------------------------------------------------------------- multi


class MultiLogger:
    """Fans every call out to `loggers`, in order (put `JsonlLogger` first: it is the
    durable copy). A step gets one timestamp shared by all of them."""

    def __init__(self, loggers: Sequence[MetricLogger]):
        self.loggers = list(loggers)

    def log_params(self, params: Mapping[str, Any]) -> None:
        for lg in self.loggers:
            lg.log_params(params)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for lg in self.loggers:
            lg.set_tags(tags)

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, timestamp: float | None = None
    ) -> None:
        t = time.time() if timestamp is None else timestamp
        for lg in self.loggers:
            lg.log_metrics(metrics, step, timestamp=t)

    def log_artifact(self, path: str | os.PathLike) -> None:
        for lg in self.loggers:
            lg.log_artifact(path)

    def flush(self) -> None:
        for lg in self.loggers:
            lg.flush()

    def close(self, status: str = "FINISHED") -> None:
        # Close every logger even if one fails, then report the first failure.
        first: BaseException | None = None
        for lg in self.loggers:
            try:
                lg.close(status)
            except Exception as e:  # noqa: BLE001
                first = first or e
        if first is not None:
            raise first


# --------------------------------------------------------------------------- MLflow


def _is_rejection(e: BaseException) -> bool:
    """True when the store answered and refused the request (4xx): sending it again cannot
    succeed. Anything else (connection refused, timeout, 5xx, sqlite locked) is an outage."""
    from mlflow.exceptions import MlflowException

    if isinstance(e, (FileNotFoundError, IsADirectoryError)):
        return True
    return isinstance(e, MlflowException) and 400 <= e.get_http_status_code() < 500


@dataclasses.dataclass
class SyncResult:
    """What `resync` did."""

    run_id: str
    tracking_uri: str
    steps_sent: int  # distinct steps with at least one metric sent
    metrics_sent: int
    synced_step: int  # every step <= this is in MLflow (-1: none)


class MlflowLogger:
    """Logs to one MLflow run through `MlflowClient` (no fluent global state, so several
    runs can coexist in one process).

    - The run is created (or, with `run_id`, resumed and set back to RUNNING) at once; if
      the store is unreachable that is retried at every flush, with params and tags queued.
    - `log_params` flattens nested dicts to dotted keys; values are stringified and cut to
      MLflow's limits; on a resumed run, params already logged are not sent again and one
      whose value changed keeps MLflow's value (MLflow params are immutable) with a warning.
    - `log_metrics` only buffers; `flush()` sends the buffer with `log_batch`, <= 1000
      metrics per request, in step order. NaN is sent as is (SQL stores keep an is_nan flag
      and return NaN); +-inf is stored by SQL stores as +-1.7976931348623157e308.
    - A send that fails for lack of a server never raises: it warns once per outage, keeps
      the buffer and retries at the next flush. A request the server rejects (4xx, e.g. an
      invalid key) is dropped with an error; the JSONL copy still has it.
    - With `run_dir`, the run id is kept in `run_dir/mlflow_run.json` and the highest step
      durably sent in `run_dir/mlflow_sync.json`; steps at or below the marker found at
      start are never sent again (a resumed run recomputes them). Use `for_run_dir`.
      The marker counts whole steps, so log every metric of a step (eval included) before
      the flush that commits it; a metric of step k logged after that flush is still sent
      by the next flush, but `resync` after a crash would not find it.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "suite",
        run_name: str | None = None,
        *,
        run_id: str | None = None,
        tags: Mapping[str, Any] | None = None,
        parent_run_id: str | None = None,
        run_dir: str | os.PathLike | None = None,
        artifact_location: str | None = None,
        _sync_mode: bool = False,
    ):
        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.experiment = experiment
        self.run_name = run_name
        self.run_id = run_id
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.artifact_location = artifact_location
        # sync mode (resync): patient HTTP settings, errors raise, run status left alone.
        self._sync_mode = _sync_mode
        self._http = SYNC_HTTP_ENV if _sync_mode else LIVE_HTTP_ENV
        self._client = None
        self._experiment_id: str | None = None
        self._run_ready = False
        self._known_params: dict[str, str] | None = None
        self._pending_params: dict[str, str] = {}
        self._pending_tags: dict[str, str] = _truncate("tag", _stringify(tags or {}), MAX_TAG_VAL_LENGTH)
        if parent_run_id:
            self._pending_tags["mlflow.parentRunId"] = parent_run_id
        self._create_tags = dict(self._pending_tags)
        self._pending_artifacts: list[Path] = []
        self._buffer: list[tuple[int, str, float, int]] = []  # (step, key, value, timestamp_ms)
        self._bad_keys: set[str] = set()
        self._good_keys: set[str] = set()
        self._failing = False  # inside an outage: warned already; only flush() retries
        self._disabled: str | None = None
        self._closed = False
        self.metrics_sent = 0
        self.steps_sent: set[int] = set()
        self._synced_step = -1
        self._end_status: str | None = None
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            marker = _read_json(self.run_dir / SYNC_FILE) or {}
            if run_id is not None and marker.get("run_id") == run_id:
                self._synced_step = int(marker.get("synced_step", -1))
            # a status close() could not send belongs to the run dir, whichever MLflow run
            self._end_status = marker.get("end_status")
            self._write_run_file()
        # Steps a previous process already sent (<= its marker) are never sent again: a
        # resumed run recomputes them. Metrics logged in this process are not filtered.
        self._floor = self._synced_step
        self._attempt(metrics=False)

    # -- construction from a run directory

    @classmethod
    def for_run_dir(
        cls,
        run_dir: str | os.PathLike,
        tracking_uri: str | None = None,
        experiment: str = "suite",
        run_name: str | None = None,
        *,
        tags: Mapping[str, Any] | None = None,
        parent_run_id: str | None = None,
        artifact_location: str | None = None,
        catch_up: bool = True,
    ) -> MlflowLogger:
        """The logger of the run in `run_dir`: resumes the MLflow run recorded in
        `run_dir/mlflow_run.json` (if it was on the same tracking URI) or starts one.

        With `catch_up`, JSONL entries beyond the sync marker (written before a kill, or
        during an outage) are queued for the next flush. On resume, call
        `JsonlLogger.truncate_after(checkpoint_step)` *before* this, so steps that will be
        recomputed are not queued.
        """
        run_dir = Path(run_dir)
        uri = resolve_tracking_uri(tracking_uri)
        info = _read_json(run_dir / RUN_FILE) or {}
        run_id = None
        if info.get("run_id"):
            if info.get("tracking_uri") == uri:
                run_id = info["run_id"]
            else:
                log.warning(
                    "%s was tracked at %s, now at %s: starting a new MLflow run there",
                    run_dir, info.get("tracking_uri"), uri,
                )
        logger = cls(
            uri,
            info.get("experiment", experiment) if run_id else experiment,
            run_name or info.get("run_name") or run_dir.name,
            run_id=run_id,
            tags=tags,
            parent_run_id=parent_run_id,
            run_dir=run_dir,
            artifact_location=artifact_location,
        )
        if catch_up:
            logger._enqueue_jsonl(run_dir / METRICS_FILE)
        return logger

    # -- public interface

    def log_params(self, params: Mapping[str, Any]) -> None:
        flat = _truncate("param", _stringify(flatten_params(params)), MAX_PARAM_VAL_LENGTH)
        self._pending_params.update(flat)
        self._attempt(metrics=False)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._pending_tags.update(_truncate("tag", _stringify(tags), MAX_TAG_VAL_LENGTH))
        self._attempt(metrics=False)

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, timestamp: float | None = None
    ) -> None:
        from mlflow.utils.validation import _validate_metric_name

        ts = _timestamp_ms(time.time() if timestamp is None else timestamp)
        step = int(step)
        for key, value in metrics.items():
            v = _to_float(str(key), value)
            key = mlflow_metric_key(str(key))
            if key not in self._good_keys:
                if key in self._bad_keys:
                    continue
                try:
                    _validate_metric_name(key)
                except Exception as e:  # noqa: BLE001
                    self._bad_keys.add(key)
                    log.error("metric %r is not a valid MLflow name and is not sent: %s", key, e)
                    continue
                self._good_keys.add(key)
            self._buffer.append((step, key, v, ts))

    def log_artifact(self, path: str | os.PathLike) -> None:
        self._pending_artifacts.append(Path(path).resolve())
        self._attempt(metrics=False)

    def flush(self) -> None:
        """Send everything buffered; on failure keep it for the next flush (never raises,
        except in resync)."""
        self._attempt(metrics=True)

    def close(self, status: str = "FINISHED") -> None:
        """Flush and end the run with `status` (FINISHED, FAILED, KILLED). If the server is
        unreachable the status is kept in the sync marker and `resync` sets it later."""
        if status not in RUN_END_STATUSES:
            raise ValueError(f"status must be one of {RUN_END_STATUSES}, got {status!r}")
        if self._closed:
            return
        self._closed = True
        self._end_status = status
        self._attempt(metrics=True, terminate=True)
        if self._end_status is not None:
            self._write_marker()

    @property
    def pending_metrics(self) -> int:
        """Metrics buffered and not yet accepted by MLflow."""
        return len(self._buffer)

    @property
    def synced_step(self) -> int:
        return self._synced_step

    # -- internals

    def _enqueue_jsonl(self, path: Path) -> int:
        n = 0
        for entry in read_jsonl(path):
            if entry["step"] > self._synced_step:
                self.log_metrics(entry["metrics"], entry["step"], timestamp=entry["time"])
                n += 1
        return n

    def _write_run_file(self) -> None:
        if self.run_dir is None:
            return
        _write_json(self.run_dir / RUN_FILE, {
            "tracking_uri": self.tracking_uri,
            "experiment": self.experiment,
            "experiment_id": self._experiment_id,
            "run_name": self.run_name,
            "run_id": self.run_id,
            "tags": self._create_tags,  # so resync can create the run with them
        })

    def _write_marker(self) -> None:
        if self.run_dir is None:
            return
        _write_json(self.run_dir / SYNC_FILE, {
            "run_id": self.run_id,
            "synced_step": self._synced_step,
            "end_status": self._end_status,
        })

    def _attempt(self, *, metrics: bool, terminate: bool = False) -> None:
        if self._disabled:
            return
        if self._failing and not metrics:
            return  # during an outage only flush() pays for a retry
        try:
            with _http_env(self._http):
                self._send(metrics=metrics, terminate=terminate)
        except Exception as e:  # noqa: BLE001 - never raise into training
            if self._sync_mode:
                raise
            if _is_rejection(e) and not self._run_ready:
                self._disabled = f"{type(e).__name__}: {e}"
                log.error(
                    "MLflow refused run setup at %s, MLflow logging is off for this run "
                    "(metrics.jsonl still has everything): %s", self.tracking_uri, e,
                )
                return
            if not self._failing:
                log.warning(
                    "MLflow at %s is unreachable (%s: %s); %d metrics kept in memory and in "
                    "metrics.jsonl, retried at every flush (or later: `suite sync RUN_DIR`)",
                    self.tracking_uri, type(e).__name__, str(e).splitlines()[0][:300],
                    len(self._buffer),
                )
                self._failing = True
            return
        if self._failing:
            log.warning("MLflow at %s is reachable again", self.tracking_uri)
            self._failing = False

    def _get_client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _ensure_run(self) -> None:
        if self._run_ready:
            return
        client = self._get_client()
        if self.run_id is None:
            exp = client.get_experiment_by_name(self.experiment)
            if exp is None:
                from mlflow.exceptions import MlflowException

                try:
                    self._experiment_id = client.create_experiment(
                        self.experiment, artifact_location=self.artifact_location
                    )
                except MlflowException:
                    # another run of a sweep created it first
                    exp = client.get_experiment_by_name(self.experiment)
                    if exp is None:
                        raise
                    self._experiment_id = exp.experiment_id
            else:
                self._experiment_id = exp.experiment_id
            run = client.create_run(self._experiment_id, tags=self._create_tags, run_name=self.run_name)
            self.run_id = run.info.run_id
            self._known_params = {}
            self._synced_step = self._floor = -1  # a new run has nothing
            for k, v in self._create_tags.items():  # already set by create_run
                if self._pending_tags.get(k) == v:
                    del self._pending_tags[k]
            log.info("MLflow run %s (%s) at %s", self.run_id, self.run_name, self.tracking_uri)
        else:
            run = client.get_run(self.run_id)
            self._experiment_id = run.info.experiment_id
            self._known_params = dict(run.data.params)
            if not self._sync_mode and run.info.status != "RUNNING":
                client.update_run(self.run_id, status="RUNNING")
        self._run_ready = True
        self._write_run_file()
        self._write_marker()

    def _send(self, *, metrics: bool, terminate: bool) -> None:
        from mlflow.entities import Param, RunTag

        self._ensure_run()
        client = self._get_client()

        if self._pending_params:
            fresh = []
            for key, value in self._pending_params.items():
                old = self._known_params.get(key)
                if old is None:
                    fresh.append(Param(key, value))
                elif old != value:
                    log.warning(
                        "param %r is %r in MLflow run %s but %r now; MLflow params cannot "
                        "change, keeping %r", key, old, self.run_id, value, old,
                    )
            for i in range(0, len(fresh), MAX_PARAMS_TAGS_PER_BATCH):
                chunk = fresh[i : i + MAX_PARAMS_TAGS_PER_BATCH]
                self._rejectable(lambda: client.log_batch(self.run_id, params=chunk), "params")
                self._known_params.update({p.key: p.value for p in chunk})
            self._pending_params = {}

        if self._pending_tags:
            items = [RunTag(k, v) for k, v in self._pending_tags.items()]
            for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
                chunk = items[i : i + MAX_PARAMS_TAGS_PER_BATCH]
                self._rejectable(lambda: client.log_batch(self.run_id, tags=chunk), "tags")
                for t in chunk:
                    self._pending_tags.pop(t.key, None)

        while self._pending_artifacts:
            path = self._pending_artifacts[0]
            if path.is_dir():  # uploaded as a folder of that name
                call = lambda: client.log_artifacts(self.run_id, str(path), artifact_path=path.name)  # noqa: E731
            else:
                call = lambda: client.log_artifact(self.run_id, str(path))  # noqa: E731
            self._rejectable(call, f"artifact {path}")
            self._pending_artifacts.pop(0)

        if metrics:
            self._send_metrics()

        if terminate and self._end_status is not None:
            status = self._end_status
            self._rejectable(lambda: client.set_terminated(self.run_id, status=status), "end status")
            self._end_status = None
            self._write_marker()

    def _rejectable(self, call, what: str) -> bool:
        """Run `call`; a 4xx rejection is logged and swallowed (retrying cannot help) and
        gives False; anything else propagates as an outage."""
        try:
            call()
        except Exception as e:  # noqa: BLE001
            if not _is_rejection(e) or self._sync_mode:
                raise
            log.error("MLflow rejected %s for run %s, not retried: %s", what, self.run_id, e)
            return False
        return True

    def _send_metrics(self) -> None:
        from mlflow.entities import Metric

        if not self._buffer:
            return
        if self._floor >= 0:
            before = len(self._buffer)
            self._buffer = [m for m in self._buffer if m[0] > self._floor]
            if len(self._buffer) < before:
                log.info(
                    "not resending %d metrics of steps <= %d, sent to MLflow before the restart",
                    before - len(self._buffer), self._floor,
                )
        self._buffer.sort(key=lambda m: m[0])  # stable: keeps call order within a step
        while self._buffer:
            chunk = self._buffer[:MAX_METRICS_PER_BATCH]
            batch = [Metric(key=k, value=v, timestamp=ts, step=s) for s, k, v, ts in chunk]
            if self._rejectable(lambda: self._get_client().log_batch(self.run_id, metrics=batch), "metrics"):
                self.metrics_sent += len(chunk)
                self.steps_sent.update(m[0] for m in chunk)
            del self._buffer[: len(chunk)]
            # Every step below the first one still buffered is complete in MLflow.
            done = self._buffer[0][0] - 1 if self._buffer else chunk[-1][0]
            if done > self._synced_step:
                self._synced_step = done
                self._write_marker()


# --------------------------------------------------------------------------- resync


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
    info = _read_json(run_dir / RUN_FILE)
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
    logger.log_params(_read_json(run_dir / PARAMS_FILE) or {})
    logger.set_tags(_read_json(run_dir / TAGS_FILE) or {})
    for path in _read_json(run_dir / ARTIFACTS_FILE) or []:
        if Path(path).exists():
            logger.log_artifact(path)
        else:
            log.warning("artifact %s no longer exists, not uploaded", path)
    logger._enqueue_jsonl(run_dir / METRICS_FILE)
    logger.flush()
    status = end_status or logger._end_status
    if status:
        logger._end_status = status
        logger._attempt(metrics=False, terminate=True)
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
    kinds = {RUN_FILE: dict, SYNC_FILE: dict, PARAMS_FILE: dict, TAGS_FILE: dict, ARTIFACTS_FILE: list}
    for name, kind in kinds.items():
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"{path}: not valid JSON ({exc}); restore it or delete it (then `suite sync` starts a new MLflow run)"
        if not isinstance(data, kind):
            return f"{path}: must be a JSON {'object' if kind is dict else 'list'}, got {type(data).__name__}"
    info = _read_json(run_dir / RUN_FILE) if (run_dir / RUN_FILE).is_file() else None
    if info is not None and not isinstance(info.get("tracking_uri"), str):
        return f"{run_dir / RUN_FILE}: incomplete: no tracking_uri (a write cut short?); restore or delete it"
    return None


def resync_cli(run_dir: str | os.PathLike, tracking_uri: str | None = None,
               end_status: str | None = None) -> int:
    """`suite sync RUN_DIR [--tracking-uri URI]`: print one summary line; exit code 0/1, or 2
    for a run dir whose files are damaged (the message names the file)."""
    problem = run_dir_problem(Path(run_dir))
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
