"""Fixtures for the benchmark tests: tiny settings, a real sqlite MLflow store in tmp_path."""

from __future__ import annotations

import pytest

# The tiny run of every embedded test (docs: the lead's brief): a few steps, one thread.
TINY_RUN = ["model=tiny", "steps=4", "eval_every=2", "ckpt_every=2", "task.n_eval=16", "rollout.prompts_per_step=2",
            "algo.group_size=4", "rollout.max_new_tokens=16", "warm_start.steps=5", "threads=1"]


@pytest.fixture
def tiny_run(tmp_path) -> list[str]:
    return TINY_RUN + [f"warm_start.cache_dir={tmp_path / 'warm'}", f"out_dir={tmp_path / 'runs'}"]
