"""A real `mlflow server` for the tests that need one (the session's fixture in conftest.py; a test
that stops and restarts a server of its own imports `MlflowServer` from here)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


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

    def crash(self) -> None:
        """SIGKILL the server's process group at once (an outage that starts now, with no graceful
        shutdown to wait for); `start()` brings it back on the same port and store."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)
        self.proc = None

    def _log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""
