"""One run directory, one writer: an exclusive lock file `run_dir/run.lock`.

Two processes that write one run dir (two identical `suite run`, a sweep cell submitted twice)
would both log every step, create two MLflow runs for one run id and overwrite each other's
checkpoints. The lock is `fcntl.flock` on the lock file: the kernel drops it when the holder
dies, however it dies (a `kill -9` leaves no stale lock), and Linux NFS clients (v3 with NLM,
v4) and Lustre mounted with `-o flock` enforce it across nodes (flock(2), "NFS details").
Where the filesystem refuses flock (ENOLCK, EOPNOTSUPP), the fallback is an `O_EXCL` lock file
holding pid and host; a holder on this host that no longer exists is taken over, one on another
host is reported (this host cannot see its processes).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "run.lock"
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class RunLockedError(RuntimeError):
    """Another live process writes this run directory; the message names it."""


def _holder_info() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}


def _describe(path: Path, info: dict | None) -> str:
    if not info:
        who = "another process (it has not written its pid yet)"
    else:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("since", 0))))
        who = f"pid {info.get('pid')} on host {info.get('host')} (since {since})"
    return (f"{path.parent} is being written by {who}; lock file {path}. Wait for that run to end "
            f"(or stop it): a run id has one writer")


def _read_info(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold the run dir's writer lock for the block, or raise `RunLockedError` naming the holder."""
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLockedError(_describe(path, _read_info(path))) from None
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
            os.close(fd)
            fd = -1
            with _exclusive_file(path) as held:
                yield held
            return
        # the holder's identity, for the message of whoever comes second
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder_info()).encode(), 0)
        os.fsync(fd)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)  # released: no holder to name (the file stays; it is the lock)
    finally:
        if fd >= 0:
            os.close(fd)  # closing drops the flock


@contextlib.contextmanager
def _exclusive_file(path: Path) -> Iterator[Path]:
    """The O_EXCL fallback: `path.excl` exists while held; a dead holder on this host is taken over."""
    excl = path.with_name(path.name + ".excl")
    me = _holder_info()
    for _ in range(2):
        try:
            fd = os.open(excl, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            info = _read_info(excl)
            stale = bool(info) and info.get("host") == me["host"] and not _alive(int(info.get("pid", -1)))
            if not stale:
                raise RunLockedError(_describe(path, info)) from None
            # take over: rename the file aside, then check that what was moved is the dead
            # holder's (another taker may have replaced it in between: put that one back)
            aside = excl.with_name(f"{excl.name}.stale.{me['pid']}")
            try:
                os.rename(excl, aside)
            except FileNotFoundError:
                continue
            if _read_info(aside) != info:
                os.rename(aside, excl)
                raise RunLockedError(_describe(path, _read_info(excl))) from None
            aside.unlink()
            continue
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(excl)
        return
    raise RunLockedError(_describe(path, _read_info(excl)))
