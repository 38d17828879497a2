"""Fixtures for the benchmark tests: tiny settings, a real sqlite MLflow store in tmp_path."""

from __future__ import annotations

import pytest
import torch

# The tiny run of every embedded test (docs: the lead's brief): a few steps, one thread.
TINY_RUN = ["model=tiny", "steps=4", "eval_every=2", "ckpt_every=2", "task.n_eval=16", "rollout.prompts_per_step=2",
            "algo.group_size=4", "rollout.max_new_tokens=16", "warm_start.steps=5", "threads=1"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny models run fastest on one intra-op thread on shared cores (tests/embedded/conftest.py).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tiny_run(tmp_path) -> list[str]:
    return TINY_RUN + [f"warm_start.cache_dir={tmp_path / 'warm'}", f"out_dir={tmp_path / 'runs'}"]
