"""Fixtures for the embedded-backend tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny models run fastest on one intra-op thread; on shared cores, two threads that wait
    # for each other at every op are 10-30x slower.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
