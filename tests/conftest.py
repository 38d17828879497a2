"""Shared fixtures. `mlflow_server_uri` starts one real `mlflow server` per test session."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the `slurm_cluster` fixture, and xdist groups of tests sharing a costly fixture
# (tests/ is on sys.path: no __init__.py)
pytest_plugins = ["slurm_fixture", "xdist_groups"]


_PREBUILD = pytest.StashKey[subprocess.Popen]()


def pytest_sessionstart(session):
    """Build the engine's C++ extensions beside the tests (the controller only; a plain session
    too). In a fresh environment the build takes a core for ~75 s; the first test that needs
    an extension would otherwise pay for it in line, and every process that wants it meanwhile
    waits on torch's build lock. Built already, the process only loads them (~4 s)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or session.config.option.collectonly:
        return
    session.config.stash[_PREBUILD] = subprocess.Popen(
        [sys.executable, "-m", "suite.embedded.prebuild"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C of pytest does not interrupt it: a killed build would leave its lock behind
    )


def pytest_sessionfinish(session):
    proc = session.config.stash.get(_PREBUILD, None)
    if proc is not None and proc.poll() is None:
        print("\nwaiting for the C++ extensions' build (python -m suite.embedded.prebuild) to finish", flush=True)
        proc.wait()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """In-process tensor work on one intra-op thread: tiny models run fastest that way, and on
    shared cores two threads that wait for each other at every op were 10-30x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


from mlflow_server import MlflowServer, free_port  # noqa: E402,F401 - tests/ is on sys.path


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> Iterator[MlflowServer]:
    """The session's MLflow server (handle with `.uri`, `.stop()`, `.start()`). A test that
    stops it must start it again before it ends."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mlflow_server_uri(mlflow_server: MlflowServer) -> str:
    """`http://127.0.0.1:PORT` of a real MLflow tracking server (sqlite store), shared by
    the whole session."""
    return mlflow_server.uri


@pytest.fixture(scope="session")
def warmstart_cache(tmp_path_factory) -> Path:
    """The session's warm-start cache, one for all of pytest-xdist's workers: the suite locks
    each cache entry, so a worker that needs a warm start another one is training waits for it
    and reads it instead of training it again. (A worker's base temp is a folder of the
    session's; without xdist, or with `-p no:xdist`, the session's own.)"""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "warmstart-cache"


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
    """An empty working directory `tmp_path/work` (where default outputs would land), no
    MLFLOW_TRACKING_URI, the warm-start cache at `tmp_path/cache`; returns tmp_path. The
    bad-input tables check that both stay empty."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("SUITE_CACHE", str(tmp_path / "cache"))
    return tmp_path
