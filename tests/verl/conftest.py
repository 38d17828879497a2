"""Shared fixtures for the verl backend tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_tiny_hf import make_tiny_qwen2


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    return make_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2") / "model")
