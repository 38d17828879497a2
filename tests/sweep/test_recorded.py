"""`suite status` reads the cells its sweep's last launch recorded (suite.sweep.recorded) instead
of composing every cell, and only when the record describes this very sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _sweep_helpers import TINY, write_sweep

from suite.sweep.recorded import RecordedCell
from suite.sweep.spec import load_sweep
from suite.sweep.states import write_state_files


@pytest.fixture
def launched(tmp_path, sweep_env):
    path = write_sweep(tmp_path / "s.yaml", {"name": "rec", "base": [*TINY, f"out_dir={tmp_path / 'runs'}"],
                                             "matrix": {"seed": [0, 1, 2], "quant": ["int8", "bf16"]}})
    full = load_sweep(str(path))
    assert not any(isinstance(c, RecordedCell) for c in load_sweep(str(path), recorded=True).cells)  # no launch yet
    write_state_files(full)
    return path, full


def _same_cells(a, b):
    assert [(c.index, c.run_id, c.run_dir, c.overrides, c.axes, c.steps) for c in a.cells] == \
        [(c.index, c.run_id, c.run_dir, c.overrides, c.axes, c.steps) for c in b.cells]


def test_status_gets_the_launch_record_and_composes_a_cell_only_when_asked(launched):
    path, full = launched
    rec = load_sweep(str(path), recorded=True)
    assert all(isinstance(c, RecordedCell) for c in rec.cells[1:]) and all(c._cfg is None for c in rec.cells[1:])
    _same_cells(rec, full)
    assert (rec.state_dir, rec.tracking_uri, rec.experiment, rec.axis_keys) == \
        (full.state_dir, full.tracking_uri, full.experiment, full.axis_keys)
    assert rec.cells[3].cfg == full.cells[3].cfg  # composed on demand, the same config


@pytest.mark.parametrize("change", ["edited file", "other overrides", "damaged record", "fewer cells recorded"])
def test_a_record_of_another_sweep_is_not_used(launched, change):
    path, full = launched
    state = Path(full.state_dir)
    overrides = []
    if change == "edited file":
        path.write_text(path.read_text().replace("seed:", "seed:  "))
    elif change == "other overrides":
        overrides = ["steps=5"]
    elif change == "damaged record":
        (state / "matrix.json").write_text("{")
    else:
        m = json.loads((state / "matrix.json").read_text())
        m["cells"] = m["cells"][:-1]
        (state / "matrix.json").write_text(json.dumps(m))
    got = load_sweep(str(path), overrides, recorded=True)
    assert not any(isinstance(c, RecordedCell) for c in got.cells)
    _same_cells(got, load_sweep(str(path), overrides))
