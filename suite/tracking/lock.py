"""One run directory, one writer: an exclusive lock file `run_dir/run.lock`.

Two processes that write one run dir (two identical `suite run`, a sweep cell submitted twice)
would both log every step, create two MLflow runs for one run id and overwrite each other's
checkpoints. The lock is `filelock.FileLock`, i.e. `fcntl.flock` on the lock file: the kernel
drops it when the holder dies, however it dies (a `kill -9` leaves no stale lock), and Linux NFS
clients (v3 with NLM, v4) and Lustre mounted with `-o flock` enforce it across nodes (flock(2),
"NFS details"). The holder writes its pid, host and start time into the lock file, so whoever
comes second is told who holds it. Where the filesystem refuses flock (ENOLCK, EOPNOTSUPP, ...:
filelock falls back by itself only on ENOSYS), the fallback is filelock's `MarkerSoftFileLock`
on `run.lock.excl`: an exclusively created marker holding pid and host; a holder on this host that
no longer exists is taken over, one on another host is reported (this host cannot see its processes).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from filelock import FileLock, MarkerSoftFileLock, Timeout

LOCK_FILE = "run.lock"
EXCL_SUFFIX = ".excl"  # the fallback's marker: run.lock.excl
NAMESPACE_MARK = "?pidns-"  # what filelock's marker appends to the host name inside a PID namespace
T = TypeVar("T")
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
# A holder writes its identity right after it takes the lock (truncate, write, fsync); whoever is
# refused in between reads an empty file. It waits this long for the name before saying so: only
# the refusal path waits, and a loaded machine's fsync can take a second.
NAME_WAIT_S = 5.0


class RunLockedError(RuntimeError):
    """Another live process writes this run directory; the message names it."""


def _holder_info() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}


def _describe(path: Path, info: dict | None) -> str:
    if not info:
        who = "another process (it has not written its pid yet)"
    else:
        who = f"pid {info.get('pid')} on host {info.get('host')}"
        if info.get("since") is not None:
            who += f" (since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(float(info['since'])))})"
    return (f"{path.parent} is being written by {who}; lock file {path}. Wait for that run to end "
            f"(or stop it): a run id has one writer")


def _read_info(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None


def _named_soon(read: Callable[[], T | None]) -> T | None:
    """What `read` returns (the holder's identity), retried for up to `NAME_WAIT_S` while it is
    empty: a holder that has the lock but has not written its name yet (or that released it
    meanwhile, leaving no name); None when the wait is over."""
    deadline = time.monotonic() + NAME_WAIT_S
    while True:
        found = read()
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold the run dir's writer lock for the block, or raise `RunLockedError` naming the holder."""
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    held: list[int] = []

    def name_myself(fd: int) -> None:  # the holder's identity, for the message of whoever comes second
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder_info()).encode(), 0)
        os.fsync(fd)
        held.append(fd)

    lock = FileLock(path, timeout=0, mode=0o644, thread_local=False, on_acquired=name_myself)
    try:
        lock.acquire()
    except Timeout:
        raise RunLockedError(_describe(path, _named_soon(lambda: _read_info(path)))) from None
    except OSError as exc:
        if exc.errno not in _NO_FLOCK:
            raise
        with _marker_lock(path) as marked:
            yield marked
        return
    try:
        yield path
    finally:
        try:
            os.ftruncate(held[0], 0)  # released: no holder to name (the file stays; it is the lock)
        finally:
            lock.release()


@contextlib.contextmanager
def _marker_lock(path: Path) -> Iterator[Path]:
    """The fallback without flock: filelock's marker file `run.lock.excl`, created exclusively and
    holding pid and host; filelock takes over a marker whose process on this host is gone."""
    lock = MarkerSoftFileLock(path.with_name(path.name + EXCL_SUFFIX), timeout=0, mode=0o644, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        owner = _named_soon(lambda: lock.owner)
        info = None if owner is None else {"pid": owner.pid, "host": owner.hostname.split(NAMESPACE_MARK)[0]}
        raise RunLockedError(_describe(path, info)) from None
    try:
        yield path
    finally:
        lock.release()
