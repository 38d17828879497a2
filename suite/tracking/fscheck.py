"""Whether a verb may write where it is asked to, checked before it writes anything: the path's
nearest existing ancestor is a directory on a writable file system that this process may
write, and every name fits the file system's limits. One line naming the path and why, or None."""

from __future__ import annotations

import errno
import os
from pathlib import Path

# the faults of a file system under a run, as a verb names them (an OSError's errno)
ENV_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
              errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
              errno.EPERM: "permission denied"}


def nearest_existing(path: str | os.PathLike) -> Path:
    p = Path(os.path.abspath(path))
    while not os.path.exists(p) and p != p.parent:  # os.path: False for a name too long, where Path raises
        p = p.parent
    return p


def writable_problem(path: str | os.PathLike, what: str, *, is_dir: bool = False) -> str | None:
    """Why `path` (a file to create or replace, or with `is_dir` a directory to create or write
    into) cannot be written, or None."""
    anc = nearest_existing(path)
    if not is_dir and anc == Path(os.path.abspath(path)) and os.path.isfile(anc):  # replaced: its directory decides
        anc = anc.parent
    elif not anc.is_dir():
        return f"{what} {path}: {anc} is a file, not a directory"
    try:
        name_max, path_max = os.pathconf(anc, "PC_NAME_MAX"), os.pathconf(anc, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    full = os.fsencode(os.path.abspath(path))
    if len(full) >= path_max:
        return f"{what} {path}: the path is {len(full)} bytes; this file system allows {path_max - 1}"
    for part in Path(os.path.abspath(path)).parts:
        if len(os.fsencode(part)) > name_max:
            return (f"{what} {path}: the name {part[:24]}... is {len(os.fsencode(part))} bytes; this file system "
                    f"allows {name_max}")
    if os.statvfs(anc).f_flag & os.ST_RDONLY:
        return f"{what} {path}: {anc} is on a read-only file system"
    if not os.access(anc, os.W_OK | os.X_OK):
        return f"{what} {path}: {anc} is not writable (permission denied)"
    return None


def env_fault(exc: BaseException) -> OSError | None:
    """The file-system fault (disk full, read-only, permission) behind `exc`, if that is what it is."""
    import re

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in ENV_ERRNOS:
            return e
        # libraries in Rust (safetensors, tokenizers) report an I/O error as text: "... (os error 28)"
        m = re.search(r"\(os error (\d+)\)", str(e))
        if m and int(m.group(1)) in ENV_ERRNOS:
            return OSError(int(m.group(1)), os.strerror(int(m.group(1))))
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def fault_line(e: OSError, where: str | os.PathLike = "") -> str:
    """`<path>: the disk is full (ENOSPC)` from an OSError (`where` when it names no file)."""
    where = e.filename or os.fspath(where) or "a file"
    return f"{where}: {ENV_ERRNOS.get(e.errno, e.strerror)} ({errno.errorcode.get(e.errno, e.errno)})"
