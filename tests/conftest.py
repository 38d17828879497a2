"""Shared fixtures. `mlflow_server_uri` starts one real `mlflow server` per test session."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 with a sqlite backend store in `root`.

    `stop()` and `start()` again reuse the same port and store, so a test can simulate an
    outage and a restart. The server runs in its own process group (it spawns uvicorn
    workers), which `stop()` signals through the PID of the process it started.
    """

    def __init__(self, root: Path, port: int | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.backend_uri = f"sqlite:///{self.root / 'mlflow.db'}"
        self.log_path = self.root / "server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 180.0) -> None:
        """Start and wait until /health answers (tens of seconds on 2 busy cores)."""
        env = dict(os.environ)
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no job-runner process
        env.pop("MLFLOW_TRACKING_URI", None)
        cmd = [
            sys.executable, "-m", "mlflow", "server",
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            "--backend-store-uri", self.backend_uri,
            "--artifacts-destination", str(self.root / "artifacts"),
        ]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, env=env,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({self.proc.returncode}):\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer within {timeout_s} s:\n{self._log_tail()}")

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid  # leader of its own session: pgid == pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                continue
            # the leader is gone; make sure no worker of its group outlives it
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
        self.proc = None

    def _log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""


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
