"""Crash-safe file writes shared by the loggers, checkpoints and the warm-start cache."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write`` on a temporary file beside ``path``, fsync it, and rename it over
    ``path``: a crash leaves either the old file or the new one, never half of one.

    The temporary file is ``.{name}.tmp.{pid}`` in the same directory, so a cleaner can
    find ones left by killed writers.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path
