"""Fixtures for the embedded-backend tests (one intra-op thread: tests/conftest.py)."""

import pytest


@pytest.fixture(autouse=True)
def _shared_warm_start(warmstart_cache, monkeypatch):
    """`test_run.tiny_cfg` and the CLI overrides beside it take their warm start from the session's
    cache (tests/conftest.py: one for all xdist workers), so each warm start trains once."""
    monkeypatch.setenv("SUITE_TEST_WARMSTART_CACHE", str(warmstart_cache))
