"""Reading and appending the sweep state dir's records, with errors that name the file.

`jobs.jsonl` has one JSON object per line, appended by the driver (and `suite cancel`). A kill
can cut only the last line, mid-write, so a last line without its newline that does not parse
is skipped (and cut off by the next append). Any other line that is not a record is
damage that `suite sweep`, `suite status` and `suite cancel` refuse to guess around: cells
would be submitted twice, or reported in a state they are not in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from suite.launch.fileio import SweepError


class StateFileError(SweepError):
    """A sweep state file that cannot be read; the message names the file and what is wrong."""


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise StateFileError(f"{path}: not UTF-8 text (byte {exc.start}): the sweep state file is damaged") from None
    except OSError as exc:
        raise StateFileError(f"{path}: cannot read the sweep state file: {exc.strerror or exc}") from None


def _record_problem(rec: object, where: str) -> str | None:
    """What is wrong with one jobs.jsonl record (schema suite.schemas.JobRecord), or None."""
    from suite.schemas import JobRecord, SchemaError, validate

    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not a record"
    try:
        validate(JobRecord, rec, where)
    except SchemaError as exc:
        return str(exc).removeprefix(f"{where}: ")
    return None


def read_jobs(path: str | os.PathLike) -> list[dict]:
    """The records of a jobs.jsonl (none when it does not exist yet)."""
    path = Path(path)
    if not path.exists():
        return []
    text = _text(path)
    lines = text.split("\n")
    torn = not text.endswith("\n")  # the last line was being written when its writer died
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            if torn and i == len(lines):
                continue
            raise StateFileError(f"{path}, line {i}: not JSON ({exc.msg}): the sweep state file is damaged; "
                                 f"fix or delete that line (cells it names are then re-read from their "
                                 f"run dirs)") from None
        problem = _record_problem(rec, f"{path}, line {i}")
        if problem:
            raise StateFileError(f"{path}, line {i}: {problem}: the sweep state file is damaged")
        out.append(rec)
    return out


def append_job(path: str | os.PathLike, rec: dict) -> None:
    """Append one record on a line of its own, flushed to disk. A torn last line (its writer was
    killed mid-write) is cut off first: left in place it would become a damaged middle line."""
    path = Path(path)
    with open(path, "a+b") as fh:
        fh.seek(0)
        data = fh.read()  # one short line per submission: small
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)
        fh.write(json.dumps(rec).encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_parent(path: str | os.PathLike) -> dict | None:
    """parent_run.json: {run_id, tracking_uri, experiment}, or None when it does not exist."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        info = json.loads(_text(path))
    except json.JSONDecodeError as exc:
        raise StateFileError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}): the record of the sweep's "
                             f"MLflow parent run is damaged; delete it to start a new parent run") from None
    from suite.schemas import ParentRunFile, SchemaError, validate

    try:
        validate(ParentRunFile, info, path)
    except SchemaError as exc:
        raise StateFileError(f"{exc}: the record of the sweep's MLflow parent run (run_id, tracking_uri) is "
                             f"damaged; delete it to start a new parent run") from None
    return info
