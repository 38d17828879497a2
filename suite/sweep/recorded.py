"""A sweep as its last launch recorded it (`matrix.json`, `sweep.yaml` in the state dir), for
`suite status`: composing and validating every cell of a large sweep takes seconds (tens of ms a
cell), and status needs only each cell's run id and run dir, which the launch wrote down.

The record is used only when it describes this very sweep: the state dir's copy of the file is
the file's text, the overrides are the ones it was launched with, the record has one entry per
cell of the matrix, and composing here would give its cells. That last point is checked without
composing when the record's fingerprint of everything composition depends on
(suite.sweep.fingerprint) is the one computed here (`uncomposed_sweep`: no Hydra compose, no
torch), else by composing the first cell and comparing its run id (`recorded_sweep`). Anything
else (no launch yet, an edited file, other overrides, a damaged record) composes every cell as
`suite sweep` does.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from suite.sweep.spec import Cell, Sweep

if TYPE_CHECKING:
    from omegaconf import DictConfig

# suite.config's Config.out_dir (tests/sweep/test_recorded.py checks it): where to look for the
# record of a sweep that does not set out_dir. Only a guess: the record must say it was written there.
DEFAULT_OUT_DIR = "runs"
_PLAIN = re.compile(r"^[A-Za-z0-9_./~+@%:-]+$")  # an override value Hydra reads as this very string


class RecordedCell(Cell):
    """A cell read from `matrix.json`: its config is composed only if something asks for it."""

    def __init__(self, *, steps: int, **fields):
        self._cfg: Optional[DictConfig] = None
        self._steps = steps
        super().__init__(cfg=None, **fields)

    @property
    def cfg(self) -> DictConfig:
        if self._cfg is None:
            from suite.config import compose_config

            self._cfg = compose_config(list(self.overrides))
        return self._cfg

    @cfg.setter
    def cfg(self, value: Optional[DictConfig]) -> None:
        self._cfg = value

    @property
    def steps(self) -> int:
        return self._steps


def _read(state_dir: str, text: str, overrides: list[str], n_cells: int) -> Optional[tuple[dict, list[RecordedCell]]]:
    """The record in `state_dir` and its cells, if it is of this file, these overrides, this many cells."""
    d = Path(state_dir)
    try:
        if (d / "sweep.yaml").read_text() != text:
            return None
        rec = json.loads((d / "matrix.json").read_text())
        cells = [RecordedCell(index=int(c["index"]), overrides=list(c["overrides"]), axes=dict(c["axes"]),
                              run_id=str(c["run_id"]), run_dir=str(c["run_dir"]), steps=int(c["steps"]))
                 for c in rec["cells"]]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        return None  # no launch yet, or a record of an older format: compose
    if rec.get("cli_overrides") != overrides or len(cells) != n_cells or not cells \
            or [c.index for c in cells] != list(range(n_cells)):
        return None
    return rec, cells


def out_dir_of(overrides: list[str]) -> Optional[str]:
    """A cell's out_dir read from its overrides, without composing; None when an override of it
    is not a plain value (quotes, an interpolation, a delete): then only composing knows."""
    out = DEFAULT_OUT_DIR
    for line in overrides:
        key, eq, value = line.partition("=")
        if key.lstrip("+~") != "out_dir":
            continue
        if key.startswith("~") or not eq or not _PLAIN.match(value):
            return None
        out = value
    return out


def uncomposed_sweep(name: str, text: str, overrides: list[str], n_cells: int, first_overrides: list[str],
                     shell: Callable[[str, str, str], Sweep]) -> Optional[Sweep]:
    """The recorded sweep without composing a cell: only when the record's fingerprint of what
    composition depends on is this process's (suite.sweep.fingerprint); else None.
    `shell(state_dir, tracking_uri, experiment)` makes the Sweep the recorded cells go into."""
    from suite.sweep import fingerprint

    out_dir = out_dir_of(first_overrides)
    if out_dir is None:
        return None
    state_dir = os.path.join(os.path.abspath(os.path.expanduser(out_dir)), "_sweeps", name)
    found = _read(state_dir, text, overrides, n_cells)
    if found is None:
        return None
    rec, cells = found
    if rec.get("state_dir") != state_dir or not isinstance(rec.get("tracking_uri"), str) \
            or not isinstance(rec.get("experiment"), str) or not fingerprint.matches(rec.get("composition"), text, overrides):
        return None
    sweep = shell(state_dir, rec["tracking_uri"], rec["experiment"])
    sweep.cells = cells
    return sweep


def recorded_sweep(state_dir: str, text: str, overrides: list[str], n_cells: int, axis_keys: list[str],
                   first: DictConfig, shell: Sweep) -> Optional[Sweep]:
    """`shell` with the recorded cells, or None when the record does not describe this sweep
    (checked by the run id of `first`, the first cell composed here)."""
    from suite.config import run_id

    found = _read(state_dir, text, overrides, n_cells)
    if found is None or found[1][0].run_id != run_id(first):
        return None
    cells = found[1]
    cells[0].cfg = first
    shell.cells = cells
    return shell
