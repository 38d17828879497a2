"""`suite status` shows what the sweep's last launch submitted: the cells recorded in the state
dir's `matrix.json` (run ids, run dirs), none of them composed; an edited file or other overrides
are named, never silently re-composed; a sweep never launched is composed as `suite sweep` does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _sweep_helpers import TINY, child_env, write_sweep

from suite.config import Config
from suite.sweep.spec import DEFAULT_OUT_DIR, RecordedCell, load_sweep, out_dir_of
from suite.sweep.states import write_state_files


@pytest.fixture
def launched(tmp_path, sweep_env):
    path = write_sweep(tmp_path / "s.yaml", {"name": "rec", "base": [*TINY, f"out_dir={tmp_path / 'runs'}"],
                                             "matrix": {"seed": [0, 1, 2], "quant": ["int8", "bf16"]}})
    full = load_sweep(str(path))
    assert not any(isinstance(c, RecordedCell) for c in load_sweep(str(path), recorded=True).cells)  # no launch yet
    write_state_files(full)
    return path, full


@pytest.fixture
def sweep(tmp_path, sweep_env):
    return write_sweep(tmp_path / "s.yaml", {"name": "fp", "base": [*TINY, f"out_dir={tmp_path / 'runs'}"],
                                             "matrix": {"seed": [0, 1], "quant": ["int8", "bf16"]}})


def _cells(s):
    return [(c.index, c.run_id, c.run_dir, c.overrides, c.axes, c.steps) for c in s.cells]


def test_status_gets_the_launch_record_and_composes_a_cell_only_when_asked(launched):
    path, full = launched
    rec = load_sweep(str(path), recorded=True)
    assert all(isinstance(c, RecordedCell) for c in rec.cells) and all(c._cfg is None for c in rec.cells)
    assert _cells(rec) == _cells(full) and rec.launch_note == ""
    assert (rec.state_dir, rec.tracking_uri, rec.experiment, rec.axis_keys) == \
        (full.state_dir, full.tracking_uri, full.experiment, full.axis_keys)
    assert rec.cells[3].cfg == full.cells[3].cfg  # built on demand from the record: the same config


def _sections(cfg, prefix=""):
    """Every node's key, OmegaConf type and struct flag: what a typed config is besides its values."""
    from omegaconf import DictConfig, OmegaConf

    out = {}
    for key in cfg:
        node = cfg._get_node(key)
        out[prefix + str(key)] = (OmegaConf.get_type(node), type(node).__name__, OmegaConf.is_struct(node))
        if isinstance(node, DictConfig):
            out.update(_sections(node, f"{prefix}{key}."))
    return out


def test_the_report_and_status_read_each_cells_config_from_the_launch_without_composing(launched, monkeypatch):
    """The launch composed each cell once; its record holds the resolved config, and a recorded
    cell's config is that record made typed again: equal values, the same run id and params, the
    same section types and struct flags, and no compose of the cell (composing it would fail)."""
    import suite.config
    from suite.config import run_id
    from suite.report.data import config_params

    path, full = launched
    cells = json.loads((Path(full.state_dir) / "matrix.json").read_text())["cells"]
    assert all(isinstance(c["config"], dict) and c["config"]["seed"] == full.cells[i].cfg.seed
               for i, c in enumerate(cells))

    def refuse(*a, **k):
        raise AssertionError("a recorded cell was composed")

    monkeypatch.setattr(suite.config, "compose_config", refuse)
    rec = load_sweep(str(path), recorded=True)
    for got, want in zip(rec.cells, full.cells):
        assert got.cfg == want.cfg and run_id(got.cfg) == want.run_id == got.run_id
        assert config_params(got.cfg) == config_params(want.cfg)
        assert _sections(got.cfg) == _sections(want.cfg)
    with pytest.raises(Exception, match="not in .TrainConfig."):  # as typed as a composed one: no new key
        rec.cells[0].cfg.train.lrr = 1.0


def test_a_record_without_configs_composes_its_cells(launched):
    """A state dir written before configs were recorded: its cells are composed on demand."""
    path, full = launched
    m = Path(full.state_dir) / "matrix.json"
    rec = json.loads(m.read_text())
    for c in rec["cells"]:
        del c["config"]
    m.write_text(json.dumps(rec))
    got = load_sweep(str(path), recorded=True)
    assert all(isinstance(c, RecordedCell) and c._config is None for c in got.cells)
    assert got.cells[4].cfg == full.cells[4].cfg and run_id_of(got.cells[4]) == full.cells[4].run_id


def run_id_of(cell):
    from suite.config import run_id

    return run_id(cell.cfg)


@pytest.mark.parametrize("change", ["edited file", "other overrides"])
def test_a_changed_file_or_overrides_shows_the_recorded_cells_and_says_so(launched, change):
    """The record is the truth of what was submitted: the cells shown are the launch's (6), even
    where the file now has 3, and the note names the change and the overrides launched."""
    path, full = launched
    overrides = []
    if change == "edited file":
        path.write_text(path.read_text().replace("- bf16\n", ""))
        assert len(load_sweep(str(path)).cells) == 3
    else:
        overrides = ["steps=5"]
    got = load_sweep(str(path), overrides, recorded=True)
    assert _cells(got) == _cells(full) and all(isinstance(c, RecordedCell) for c in got.cells)
    assert "changed since the last launch" in got.launch_note and "showing the 6 cells" in got.launch_note
    assert "its overrides: none" in got.launch_note


@pytest.mark.parametrize("damage", ["not json", "no cells", "a cell without its run id"])
@pytest.mark.slow
def test_an_unreadable_record_composes_the_cells(launched, damage):
    path, full = launched
    m = Path(full.state_dir) / "matrix.json"
    rec = json.loads(m.read_text())
    if damage == "not json":
        m.write_text("{")
    elif damage == "no cells":
        m.write_text(json.dumps({**rec, "cells": []}))
    else:
        del rec["cells"][2]["run_id"]
        m.write_text(json.dumps(rec))
    got = load_sweep(str(path), recorded=True)
    assert not any(isinstance(c, RecordedCell) for c in got.cells) and _cells(got) == _cells(full)


def test_status_looks_for_the_record_where_composing_puts_it():
    assert DEFAULT_OUT_DIR == Config().out_dir
    assert out_dir_of(["steps=3"]) == DEFAULT_OUT_DIR
    assert out_dir_of(["out_dir=/a/b", "seed=1", "out_dir=c"]) == "c"  # the last one wins, as in Hydra
    for unsure in (["out_dir=${oc.env:X}/runs"], ["out_dir='a b'"], ["~out_dir"], ["out_dir=a,b"]):
        assert out_dir_of(unsure) is None


@pytest.mark.slow
def test_status_of_a_108_cell_sweep_composes_nothing(tmp_path, sweep_env):
    """The largest real sweep (the main table, 108 cells) as `suite status` loads it after a
    launch: in a fresh process, no cell composed, neither Hydra's composition nor torch imported."""
    path = write_sweep(tmp_path / "big.yaml", {"name": "big", "base": [*TINY, f"out_dir={tmp_path / 'runs'}"],
                                               "matrix": {"seed": [0, 1, 2], "quant": ["int8", "bf16", "fp8"],
                                                          "correction": ["naive", "tis", "acr", "bypass"],
                                                          "uaq.s": [1.0, 1.5, 2.0]}})
    full = load_sweep(str(path))
    assert len(full.cells) == 108
    write_state_files(full)
    probe = ("import json, sys\nfrom suite.sweep.spec import load_sweep\n"
             "s = load_sweep(sys.argv[1], recorded=True)\n"
             "print(json.dumps({'ids': [c.run_id for c in s.cells], 'torch': 'torch' in sys.modules, "
             "'hydra': 'hydra' in sys.modules, 'note': s.launch_note}))")
    out = subprocess.run([sys.executable, "-c", probe, str(path)], env=child_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"ids": [c.run_id for c in full.cells], "torch": False, "hydra": False, "note": ""}


STATUS = """
import sys
from suite.cli import main
rc = main(["status", sys.argv[1]])
print("mlflow imported:", "mlflow" in sys.modules, "torch imported:", "torch" in sys.modules, "rc", rc)
"""


@pytest.mark.slow
def test_status_of_an_ended_sweep_reads_the_parent_status_the_driver_recorded(sweep):
    """Every cell done: status names a parent run still RUNNING (asking MLflow), and takes an end
    the driver recorded from parent_run.json, without importing MLflow."""
    from mlflow.tracking import MlflowClient

    from suite.sweep.parent import parent_run, parent_status, set_parent_status

    full = load_sweep(str(sweep))
    write_state_files(full)
    rid = parent_run(full)
    for c in full.cells:  # the cells' end as a finished run leaves it (suite.tracking.rundir.is_finished)
        Path(c.run_dir).mkdir(parents=True)
        (Path(c.run_dir) / "summary.json").write_text("{}")

    def status() -> str:
        out = subprocess.run([sys.executable, "-c", STATUS, str(sweep)], env=child_env(), cwd=Path.cwd(),  # as launched
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout

    hint = "marks the MLflow parent run FINISHED"
    out = status()
    assert hint in out and "mlflow imported: True torch imported: False rc 0" in out  # RUNNING: asked MLflow
    set_parent_status(full, "FINISHED")
    assert json.loads((Path(full.state_dir) / "parent_run.json").read_text())["status"] == "FINISHED"
    assert MlflowClient(full.tracking_uri).get_run(rid).info.status == "FINISHED"
    out = status()
    assert hint not in out and "done 4  (of 4)" in out and "mlflow imported: False torch imported: False" in out
    set_parent_status(full, "RUNNING")  # a re-launch: the record of the end goes first
    assert "status" not in json.loads((Path(full.state_dir) / "parent_run.json").read_text())
    assert parent_status(full) == "RUNNING" and hint in status()
    MlflowClient(full.tracking_uri).set_terminated(rid, status="KILLED")  # as the driver's guard ends it
    assert parent_status(full) == "KILLED" and hint not in status()


@pytest.mark.parametrize("launch", ["whole matrix", "narrowed with --only", "file edited since"])
def test_the_report_expects_the_launch_cells_or_composes_the_file(launched, sweep_env, launch, monkeypatch):
    """`suite report SWEEP_FILE` expects the cells its last launch recorded, configs and all, when
    that launch was of the whole matrix of this very file; a launch narrowed with --only or a file
    changed since is composed as it is now (the report is of the file's whole matrix)."""
    import argparse

    from mlflow.tracking import MlflowClient

    import suite.sweep.compose
    from suite.report.cli import _sweep_source

    path, full = launched
    MlflowClient(tracking_uri=sweep_env[0]).search_experiments()  # the store exists (the report refuses none)
    composed = {"n": 0}
    real = suite.sweep.compose.CellComposer.compose

    def counting(self, overrides):
        composed["n"] += 1
        return real(self, overrides)

    monkeypatch.setattr(suite.sweep.compose.CellComposer, "compose", counting)
    if launch == "narrowed with --only":
        write_state_files(load_sweep(str(path), only=["seed=1"]))
    elif launch == "file edited since":
        path.write_text(path.read_text().replace("- bf16\n", "- fp8\n"))
    composed["n"] = 0
    args = argparse.Namespace(sweep_file=str(path), sweep_overrides=[], tracking_uri=None, parent=None,
                              experiment=None)
    got = _sweep_source(args)["expected"]
    n_composed = composed["n"]
    want = load_sweep(str(path))
    assert [(e["cell"], e["run_id"], e["lr"]) for e in got] == [(c.index, c.run_id, c.cfg.train.lr) for c in want.cells]
    from suite.report.data import config_params

    assert [e["params"] for e in got] == [config_params(c.cfg) for c in want.cells]
    assert n_composed == (0 if launch == "whole matrix" else 6), launch


def test_status_of_a_narrowed_launch_says_what_the_file_has_beyond_it(tmp_path, sweep_env, capsys):
    """After `suite sweep FILE --only seed=0`, `suite status FILE` shows the launched cells and says that the
    file's matrix has more, and how to add them (it once said "(of 2)" of a six-cell file)."""
    from suite.sweep.states import cell_states, print_states

    path = write_sweep(tmp_path / "s.yaml", {"name": "narrow", "base": [*TINY, f"out_dir={tmp_path / 'runs'}"],
                                             "matrix": {"seed": [0, 1, 2], "quant": ["int8", "bf16"]}})
    write_state_files(load_sweep(str(path), only=["seed=0"]))
    rec = load_sweep(str(path), recorded=True)
    assert [c.index for c in rec.cells] == [0, 1] and rec.only == ["seed=0"] and rec.matrix_size == 6
    print_states(cell_states(rec), sweep=rec)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.endswith(f"(of 2 launched with --only seed=0; the file's matrix has 6 cells: `suite sweep {path}` "
                         "without --only adds the other 4)"), last
