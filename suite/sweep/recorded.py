"""A sweep as its last launch recorded it (`matrix.json`, `sweep.yaml` in the state dir), for
`suite status`: composing and validating every cell of a large sweep takes seconds (tens of ms a
cell), and status needs only each cell's run id and run dir, which the launch wrote down.

The record is used only when it describes this very sweep: the state dir's copy of the file is
the file's text, the overrides are the ones it was launched with, the record has one entry per
cell of the matrix and its first cell is the one composed here. Anything else (no launch yet, an
edited file, other overrides, a damaged record) composes every cell as `suite sweep` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from suite.sweep.spec import Cell, Sweep


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


def recorded_sweep(state_dir: str, text: str, overrides: list[str], n_cells: int, axis_keys: list[str],
                   first: DictConfig, shell: Sweep) -> Optional[Sweep]:
    """`shell` with the recorded cells, or None when the record does not describe this sweep."""
    from suite.config import run_id

    d = Path(state_dir)
    try:
        if (d / "sweep.yaml").read_text() != text:
            return None
        rec = json.loads((d / "matrix.json").read_text())
        cells = [RecordedCell(index=int(c["index"]), overrides=list(c["overrides"]), axes=dict(c["axes"]),
                              run_id=str(c["run_id"]), run_dir=str(c["run_dir"]), steps=int(c["steps"]))
                 for c in rec["cells"]]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None  # no launch yet, or a record of an older format: compose
    if rec.get("cli_overrides") != overrides or len(cells) != n_cells or not cells \
            or cells[0].run_id != run_id(first) or [c.index for c in cells] != list(range(n_cells)):
        return None
    cells[0].cfg = first
    shell.cells = cells
    return shell
