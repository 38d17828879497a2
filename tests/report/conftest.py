"""Fixtures of the report tests: `sweep_store`, a real sweep's worth of runs (see _store.py)."""

import pytest
from _store import SweepStore, build_sweep_store


@pytest.fixture(scope="session")
def sweep_store(tmp_path_factory) -> SweepStore:
    return build_sweep_store(tmp_path_factory.mktemp("report_sweep"))
