"""The backend contract: backends resolved by name, RunSummary read back from each backend's record, and
what run_cell records when a backend raises."""

from __future__ import annotations

import dataclasses
import io

import pytest

from suite.backend import BACKENDS, RunSummary, get_backend
from suite.config import BACKENDS as CONFIG_BACKENDS


def test_every_config_backend_resolves_and_unknown_names_are_refused():
    assert tuple(BACKENDS) == CONFIG_BACKENDS
    for name in BACKENDS:
        assert callable(get_backend(name))
    with pytest.raises(ValueError, match=r"backend.name='jax' has no runner; allowed: embedded, verl"):
        get_backend("jax")


def test_run_summary_from_each_backends_record():
    embedded = {"run_id": "r", "run_dir": "/o/r", "steps": 4, "baseline_acc": 0.5, "final_acc": 0.75,
                "delta_acc": 0.25, "wall_s_this_session": 1.5, "mlflow_run_id": "m", "tracking_uri": "sqlite:///x",
                "pruned": True}
    s = RunSummary.from_record({**embedded, "already_finished": True})
    assert dataclasses.asdict(s) == {**embedded, "already_finished": True, "metric_keys": []}
    # verl's summary.json has no run identity: the caller fills it; the record's own keys win
    verl = {"baseline_acc": 0.1, "final_acc": 0.3, "delta_acc": 0.2, "steps": 8, "metric_keys": ["k"],
            "mlflow_run_id": "v", "already_finished": False}
    s = RunSummary.from_record(verl, run_id="r", run_dir="/o/r", steps=10, mlflow_run_id=None, tracking_uri="u")
    assert (s.run_id, s.steps, s.mlflow_run_id, s.metric_keys, s.pruned) == ("r", 8, "v", ["k"], False)


class _InterruptedWriter(io.BytesIO):
    """A file whose third write is hit by a stop signal (KeyboardInterrupt), as a cancelled
    job's checkpoint file is when the driver's SIGINT lands mid torch.save."""

    def __init__(self):
        super().__init__()
        self.writes = 0

    def write(self, b):
        self.writes += 1
        if self.writes == 3:
            raise KeyboardInterrupt("SIGINT")
        return super().write(b)


def _statuses(uri: str) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return [r.info.status for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_a_stop_inside_torch_save_is_a_stop_and_a_real_error_is_a_failure(tmp_path, monkeypatch):
    import torch

    from suite import cell
    from suite.config import compose_config

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_config([f"tracking.tracking_uri={uri}", f"out_dir={tmp_path}"])

    def interrupted_save(cfg, run_dir, on_eval=None, *, progress=False, open_run=None):
        torch.save({"w": torch.zeros(10_000)}, _InterruptedWriter())

    monkeypatch.setattr(cell, "get_backend", lambda name: interrupted_save)
    with pytest.raises(RuntimeError, match="unexpected pos") as raised:  # what torch makes of it
        interrupted_save(cfg, "")
    assert isinstance(cell.interruption(raised.value), KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        cell.run_cell(cfg, str(tmp_path / "a"), sweep_cell=True)
    assert "FAILED" not in _statuses(uri)  # left to the driver that stopped it (KILLED)
    assert not (tmp_path / "a" / "sweep_error.json").exists()

    def broken(cfg, run_dir, on_eval=None, *, progress=False, open_run=None):
        raise RuntimeError("a real error")

    monkeypatch.setattr(cell, "get_backend", lambda name: broken)
    assert cell.interruption(RuntimeError("x")) is None
    with pytest.raises(RuntimeError, match="a real error"):
        cell.run_cell(cfg, str(tmp_path / "b"), sweep_cell=True)
    assert _statuses(uri) == ["FAILED"]


def test_run_cell_hands_the_backend_its_mlflow_run(tmp_path, monkeypatch):
    """The backend receives the opener of its cell's MLflow run (suite.backend.OpenRun) and opens it
    when ready: the run carries the cell's axes and run id, plus the tags the backend adds."""
    from mlflow.tracking import MlflowClient

    from suite import cell
    from suite.config import axes, compose_config, run_id
    from suite.tracking.rundir import recorded_mlflow_run_id

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_config([f"tracking.tracking_uri={uri}", f"out_dir={tmp_path}", "quant=fp8"])
    run_dir = str(tmp_path / "cell")
    seen = {}

    def backend(cfg, run_dir, on_eval=None, *, progress=False, open_run=None):
        assert recorded_mlflow_run_id(run_dir) is None  # nothing opened before the backend asks
        logger = open_run(tags={"kernels_executed": "stand-in"})
        logger.log_metrics({"train/acc": 0.5}, step=1)
        logger.close("FINISHED")
        seen["id"] = logger.run_id
        return RunSummary(run_id=run_id(cfg), run_dir=run_dir, steps=1, baseline_acc=0.0, final_acc=0.5,
                          delta_acc=0.5, mlflow_run_id=logger.run_id, tracking_uri=uri)

    monkeypatch.setattr(cell, "get_backend", lambda name: backend)
    summary = cell.run_cell(cfg, run_dir)
    run = MlflowClient(uri).get_run(summary.mlflow_run_id)
    assert summary.mlflow_run_id == seen["id"] and run.info.status == "FINISHED"
    assert run.data.tags["run_id"] == run_id(cfg) and run.data.tags["kernels_executed"] == "stand-in"
    assert {k: run.data.tags[k] for k in axes(cfg)} == axes(cfg) and run.data.tags["precision"] == "fp8"
    assert run.data.metrics["train/acc"] == 0.5
