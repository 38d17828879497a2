"""The live aggregate of a sweep or a study while it runs: a tqdm bar on a terminal, a line every
`every_s` seconds otherwise (a log file, a SLURM driver), so hours between "started" and "done"
are never silent.

    sweep quickstart: 1/4 done, 2 running, 0 failed, 1 queued | 2.1 min elapsed, ETA 3.4 min

The ETA extrapolates the work done in this session: finished units count 1, running ones the
fraction of their steps checkpointed (`work`), so it has a value before the first cell ends.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Optional


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def aggregate_line(label: str, total: int, done: int, running: int, failed: int, queued: int, elapsed_s: float,
                   work: Optional[float] = None, todo: Optional[int] = None) -> str:
    """`label: done/total done, N running, N failed, N queued | elapsed[, ETA]`: `work` is the units
    finished this session (fractions for running ones) out of `todo` units this session runs;
    without them, or before any work, the ETA is left out."""
    eta = ""
    if work is not None and todo and work > 0:
        eta = f", ETA {_minutes(elapsed_s * max(todo - work, 0.0) / work)}"
    return (f"{label}: {done}/{total} done, {running} running, {failed} failed, {queued} queued"
            f" | {_minutes(elapsed_s)} elapsed{eta}")


class Progress:
    """`update(...)` at every poll; `write(line)` for the lines a driver prints between updates
    (above the bar on a terminal); `close()` at the end."""

    def __init__(self, label: str, total: int, *, unit: str = "cells", stream: Optional[IO] = None,
                 every_s: float = 30.0, tty: Optional[bool] = None, clock=time.monotonic):
        self.label, self.total, self.unit, self.every_s, self.clock = label, total, unit, every_s, clock
        self.stream = stream or sys.stdout
        self.t0 = self.last = clock()
        tty = self.stream.isatty() if tty is None else tty
        self.bar = None
        if tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit=unit[:-1] if unit.endswith("s") else unit,
                            file=self.stream, dynamic_ncols=True, leave=True)

    def line(self, done: int, running: int, failed: int, queued: int, work: Optional[float] = None,
             todo: Optional[int] = None) -> str:
        return aggregate_line(self.label, self.total, done, running, failed, queued, self.clock() - self.t0, work, todo)

    def update(self, done: int, running: int, failed: int, queued: int, work: Optional[float] = None,
               todo: Optional[int] = None, *, force: bool = False) -> None:
        if self.bar is not None:
            text = self.line(done, running, failed, queued, work, todo).split(": ", 1)[1]
            self.bar.n = done + failed
            self.bar.set_postfix_str(text.split(", ", 1)[1], refresh=True)
            return
        now = self.clock()
        if force or now - self.last >= self.every_s:
            print(self.line(done, running, failed, queued, work, todo), file=self.stream, flush=True)
            self.last = now

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
