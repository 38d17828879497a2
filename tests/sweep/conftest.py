"""Fixtures of the sweep tests (helpers live in _sweep_helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def sweep_env(tmp_path, monkeypatch):
    """MLflow store, run dirs and caches under tmp_path; returns (tracking_uri, out_dir)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("SUITE_CACHE", str(tmp_path / "cache"))
    return uri, tmp_path / "runs"
