"""`MlflowLogger`: a run's params, tags, artifacts and metrics sent to one MLflow run, batched
at each flush, resumable from the run directory, and never raising into training.

The run directory keeps the MLflow run it logs to (`mlflow_run.json`: tracking URI,
experiment, run name, run id and the tags it is created with) and the highest step MLflow has
accepted (`mlflow_sync.json`: run id, synced_step, and an end status not yet sent), so a
resumed run sends no step twice and `suite sync` (suite.tracking.resync) can finish the record
after an outage. An unreachable store is handled by suite.tracking.outage.

Resending is safe twice over: the marker stops it, and MLflow's SQL stores use
(key, timestamp, step, value) as the metric's primary key and skip exact duplicates
(mlflow/store/tracking/sqlalchemy_store.py `_log_metrics_once`), so a batch that reached the
server before a client timeout is not stored twice when it is sent again with the same
timestamps. `MultiLogger` stamps each step once so JSONL and MLflow carry the same timestamp.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from suite.tracking.jsonl import read_jsonl
from suite.tracking.outage import Outage, is_rejection
from suite.tracking.rundir import METRICS_FILE, RUN_FILE, SYNC_FILE, read_json, write_json
from suite.tracking.values import flatten_params, stringify, to_float

log = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
RUN_END_STATUSES = ("FINISHED", "FAILED", "KILLED")  # mlflow.entities.RunStatus, terminal

# MLflow's limits, from mlflow/utils/validation.py (mlflow 3.17.2).
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_KEY_LENGTH = 250
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000


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



def metric_name_problem(name: str) -> str | None:
    """Why MLflow would refuse `name` as a metric name, or None: the rules of its documentation
    (alphanumerics, ``_ - . /``, spaces and, except on Windows, ``:``; a name that stays itself as
    a relative POSIX path; at most MAX_KEY_LENGTH characters). Checked here, not by MLflow's own
    private validator, so that one bad key is dropped rather than the batch refused."""
    allowed = r"[/\w.\- ]*" if os.name == "nt" else r"[/\w.\- :]*"
    if not isinstance(name, str) or not re.fullmatch(allowed, name):
        return "names may only contain alphanumerics, underscores, dashes, periods, spaces, slashes" + \
            ("" if os.name == "nt" else " and colons")
    norm = posixpath.normpath(name)
    if norm != name or norm == "." or norm.startswith(("..", "/")):
        return f"a name must stay itself as a relative path; this one resolves to {norm!r}"
    if len(name) > MAX_KEY_LENGTH:
        return f"longer than {MAX_KEY_LENGTH} characters ({len(name)})"
    return None


def _timestamp_ms(unix_s: float) -> int:
    # The one conversion used for live sends and resync, so both give MLflow the same key.
    return int(round(unix_s * 1000))



# MLflow tracking URI schemes (mlflow.tracking._tracking_service.utils: file, sqlite and the other
# SQLAlchemy databases, http(s), databricks); a URI without a scheme is a local directory.
TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc")


def tracking_uri_problem(uri: str) -> str | None:
    """Why `uri` is no tracking store MLflow can open (None: it may be one); the scheme is checked here, before
    MLflow answers an unknown one with a store-registry exception."""
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", uri)
    if scheme and not re.match(r"^[A-Za-z]:[\\/]", uri):  # C:\... is a path, not a scheme
        base = scheme.group(1).split("+")[0].lower()  # postgresql+psycopg2 -> postgresql
        if base not in TRACKING_SCHEMES:
            return (f"must be a local directory or an MLflow URI with one of the schemes "
                    f"{', '.join(TRACKING_SCHEMES)}, got {uri!r}")
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
        self._outage = Outage(self.tracking_uri, sync_mode=_sync_mode)
        self._client = None
        self._experiment_id: str | None = None
        self._run_ready = False
        self._known_params: dict[str, str] | None = None
        self._pending_params: dict[str, str] = {}
        self._pending_tags: dict[str, str] = _truncate("tag", stringify(tags or {}), MAX_TAG_VAL_LENGTH)
        if parent_run_id:
            self._pending_tags["mlflow.parentRunId"] = parent_run_id
        self._create_tags = dict(self._pending_tags)
        self._pending_artifacts: list[Path] = []
        self._buffer: list[tuple[int, str, float, int]] = []  # (step, key, value, timestamp_ms)
        self._bad_keys: set[str] = set()
        self._good_keys: set[str] = set()
        self._closed = False
        self.metrics_sent = 0
        self.steps_sent: set[int] = set()
        self._synced_step = -1
        self._end_status: str | None = None
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            marker = read_json(self.run_dir / SYNC_FILE) or {}
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
        info = read_json(run_dir / RUN_FILE) or {}
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
            logger.enqueue_jsonl(run_dir / METRICS_FILE)
        return logger

    # -- public interface

    def log_params(self, params: Mapping[str, Any]) -> None:
        flat = _truncate("param", stringify(flatten_params(params)), MAX_PARAM_VAL_LENGTH)
        self._pending_params.update(flat)
        self._attempt(metrics=False)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._pending_tags.update(_truncate("tag", stringify(tags), MAX_TAG_VAL_LENGTH))
        self._attempt(metrics=False)

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, timestamp: float | None = None
    ) -> None:
        ts = _timestamp_ms(time.time() if timestamp is None else timestamp)
        step = int(step)
        for key, value in metrics.items():
            v = to_float(str(key), value)
            key = mlflow_metric_key(str(key))
            if key not in self._good_keys:
                if key in self._bad_keys:
                    continue
                problem = metric_name_problem(key)
                if problem is not None:
                    self._bad_keys.add(key)
                    log.error("metric %r is not a valid MLflow name and is not sent: %s", key, problem)
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

    def terminate(self, status: str | None = None) -> None:
        """End the run with `status`, or with the status an earlier `close()` could not send
        (kept in the sync marker); nothing when there is neither (`resync` calls it)."""
        status = status or self._end_status
        if status:
            self._end_status = status
            self._attempt(metrics=False, terminate=True)

    def enqueue_jsonl(self, path: str | os.PathLike) -> int:
        """Queue the entries of a metrics JSONL file beyond the sync marker for the next flush;
        returns how many."""
        n = 0
        for entry in read_jsonl(path):
            if entry["step"] > self._synced_step:
                self.log_metrics(entry["metrics"], entry["step"], timestamp=entry["time"])
                n += 1
        return n

    # -- internals

    def _write_run_file(self) -> None:
        if self.run_dir is None:
            return
        write_json(self.run_dir / RUN_FILE, {
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
        write_json(self.run_dir / SYNC_FILE, {
            "run_id": self.run_id,
            "synced_step": self._synced_step,
            "end_status": self._end_status,
        })

    def _attempt(self, *, metrics: bool, terminate: bool = False) -> None:
        self._outage.attempt(lambda: self._send(metrics=metrics, terminate=terminate), flush=metrics,
                             run_ready=self._run_ready, pending=lambda: len(self._buffer))

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
            from suite.tracking.experiments import create_run

            run = create_run(client, self.experiment, run_name=self.run_name, tags=self._create_tags,
                             artifact_location=self.artifact_location)
            self._experiment_id = run.info.experiment_id
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
            if not is_rejection(e) or self._sync_mode:
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
