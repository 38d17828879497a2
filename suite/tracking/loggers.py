"""Metric loggers: one interface (`MetricLogger`), JSONL / MLflow / console implementations.

The parts live by job:

    suite.tracking.values         params flattened, values stringified, metrics as floats
    suite.tracking.rundir         the run directory's files (metrics.jsonl, mlflow_run.json, ...)
    suite.tracking.jsonl          the metrics JSONL format and `JsonlLogger`
    suite.tracking.mlflow_logger  `MlflowLogger`, batched and resumable
    suite.tracking.outage         what an unreachable MLflow store does to a run (nothing)
    suite.tracking.resync         `suite sync RUN_DIR`

This module holds the interface, the console and fan-out loggers, and the names the trainer,
the launchers and the tests import from one place.

The JSONL file is written at once and is the source of truth; MLflow receives metrics in
batches when the trainer flushes (at each checkpoint commit, docs/architecture.md), and a
send that fails is kept in memory and retried at the next flush, never raised into training.
`resync` sends whatever the JSONL file holds beyond `synced_step`, so a run that lost its
server (or was killed with an unsent buffer) can be completed later with `suite sync RUN_DIR`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol, runtime_checkable

from suite.tracking.jsonl import (
    CorruptMetricsError,
    JsonlLogger,
    check_jsonl,
    read_jsonl,
    refuse_corrupt_jsonl,
    truncate_jsonl,
)
from suite.tracking.mlflow_logger import (
    DEFAULT_TRACKING_URI,
    MAX_KEY_LENGTH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
    RUN_END_STATUSES,
    MlflowLogger,
    mlflow_metric_key,
    resolve_tracking_uri,
)
from suite.tracking.outage import LIVE_HTTP_ENV, SYNC_HTTP_ENV
from suite.tracking.resync import SyncResult, resync, resync_cli, run_dir_problem
from suite.tracking.rundir import METRICS_FILE, RUN_FILE, SYNC_FILE, atomic_write_text
from suite.tracking.values import flatten_params, to_float


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
        parts += [f"{k} {to_float(k, metrics[k]):.4g}" for k in keys if k in metrics]
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


__all__ = [
    "DEFAULT_TRACKING_URI", "LIVE_HTTP_ENV", "MAX_KEY_LENGTH", "MAX_METRICS_PER_BATCH",
    "MAX_PARAMS_TAGS_PER_BATCH", "MAX_PARAM_VAL_LENGTH", "MAX_TAG_VAL_LENGTH", "METRICS_FILE",
    "RUN_END_STATUSES", "RUN_FILE", "SYNC_FILE", "SYNC_HTTP_ENV", "ConsoleLogger",
    "CorruptMetricsError", "JsonlLogger", "MetricLogger", "MlflowLogger", "MultiLogger", "SyncResult",
    "atomic_write_text", "check_jsonl", "flatten_params", "mlflow_metric_key", "read_jsonl",
    "refuse_corrupt_jsonl", "resolve_tracking_uri", "resync", "resync_cli", "run_dir_problem", "truncate_jsonl",
]
