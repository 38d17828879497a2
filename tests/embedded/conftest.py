"""Fixtures for the embedded-backend tests (one intra-op thread: tests/conftest.py)."""
