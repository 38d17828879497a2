"""The backend contract: backends resolved by name, RunSummary read back from each backend's record."""

from __future__ import annotations

import dataclasses

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
