"""Processes a test started and must not leave behind (tests/ is on sys.path: `from procs import ...`).

A killed driver (`suite sweep`, `suite tune`) leaves its jobs running by design: the next driver
adopts them. A test that kills one must end them itself, found by the folder their command lines
name (submitit controllers and their tasks)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def procs_naming(folder: Path) -> list[str]:
    """'pid: command line' of every live (not zombie) process, other than this one, whose command
    line names `folder`."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(")")[-1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().decode(errors="replace").replace("\0", " ")
        except OSError:
            continue
        if str(folder) in cmd:
            out.append(f"{pid}: {cmd}")
    return out


def kill_procs_naming(folder: Path) -> None:
    """SIGKILL every process `procs_naming(folder)` lists."""
    for line in procs_naming(folder):
        try:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
