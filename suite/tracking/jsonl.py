"""The metrics JSONL file (`run_dir/metrics.jsonl`): its format, reading, the checks that
refuse to delete recorded data, truncation on resume, and `JsonlLogger`.

One line per `log_metrics` call: {"step": s, "time": unix_s, "metrics": {...}}. The file is
written at once and is the source of truth for a run's metrics; MLflow receives them later
(suite.tracking.mlflow_logger) and `suite sync` resends from it (suite.tracking.resync).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from suite.tracking.rundir import (
    ARTIFACTS_FILE,
    METRICS_FILE,
    PARAMS_FILE,
    TAGS_FILE,
    atomic_write_text,
    read_json,
    write_json,
)
from suite.tracking.values import flatten_params, stringify, to_float

log = logging.getLogger(__name__)


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
            "metrics": {str(k): to_float(k, v) for k, v in metrics.items()},
        }
        if self._f is None:
            raise ValueError(f"JsonlLogger for {self.run_dir} is closed")
        self._f.write(json.dumps(entry, separators=(",", ":")) + "\n")

    def _merge_json(self, name: str, values: Mapping[str, str]) -> None:
        path = self.run_dir / name
        merged = read_json(path) or {}
        merged.update(values)
        write_json(path, merged)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._merge_json(PARAMS_FILE, stringify(flatten_params(params)))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._merge_json(TAGS_FILE, stringify(tags))

    def log_artifact(self, path: str | os.PathLike) -> None:
        listing = self.run_dir / ARTIFACTS_FILE
        paths = read_json(listing) or []
        p = str(Path(path).resolve())
        if p not in paths:
            write_json(listing, [*paths, p])

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
