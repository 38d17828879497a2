"""pytest plugin: a real single-node SLURM cluster for the test session (`slurm/dev-cluster.sh`).

Registered from tests/conftest.py. A test that takes the `slurm_cluster` fixture gets a cluster
with accounting (sacct), a default partition, a preempting partition "urgent" and fake GPUs
(`--gres=gpu:N`); `SLURM_CONF` is set in `os.environ` for the whole session, so subprocesses and
submitit's `sbatch`/`squeue`/`sacct`/`scancel`/`scontrol` calls reach it. Mark such tests
`@pytest.mark.slurm`.

The cluster needs root (its slurmd launches jobs; a missing install is done with apt-get on
Debian 12, ~80 s the first time); `up` takes ~10 s once installed. Without root, or where apt
cannot install the packages, the fixture skips with the reason; with `CI` set in the
environment it fails instead, so CI never silently skips the SLURM tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "slurm" / "dev-cluster.sh"
# exit status of `dev-cluster.sh up` when the packages are missing and apt-get cannot install them
EXIT_CANNOT_INSTALL = 3
UP_TIMEOUT_S = 900  # a first apt-get install on a slow mirror; a warm `up` takes ~10 s
DOWN_TIMEOUT_S = 120


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slurm: uses the real dev SLURM cluster (`slurm_cluster` fixture; root, Debian 12)"
    )


@dataclass
class SlurmCluster:
    """Handle on a running dev cluster started by `slurm/dev-cluster.sh up DIR`."""

    dir: Path  # the cluster's directory: etc/ (slurm.conf), log/, run/ (PIDs), spool/, env.sh
    env: dict[str, str]  # client environment (SLURM_CONF), already applied to os.environ
    partition: str  # default partition; jobs there are preempted (requeued) by partition "urgent"
    n_cpus: int  # CPUs of the single node, as slurmd detected them
    n_gpus: int  # fake GPUs (GRES gpu, character devices under DIR/dev) on the node
    node: str = field(default="")  # the node's name (the host's short name)

    def run(
        self, *cmd: str, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command (e.g. `run("sacct", "-j", jid)`) against this cluster; text
        output captured. `check=True` raises with stdout and stderr in the message."""
        env = {**os.environ, **self.env}
        proc = subprocess.run(
            list(cmd), env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def sacct_state(self, job_id: str) -> str:
        """The job's (or array task's, `ID_IDX`) state in accounting; "" while sacct has no row."""
        out = self.run("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", job_id.split("_")[0]).stdout
        for line in out.splitlines():
            jid, _, state = line.partition("|")
            if jid == job_id:
                return state
        return ""

    def wait_state(self, job_id: str, states: Sequence[str], timeout_s: float = 30.0) -> str:
        """Poll sacct until the job's state starts with one of `states`; return that state.
        Raises TimeoutError naming the last state and the slurmctld log on expiry."""
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.sacct_state(job_id)
            if any(state.startswith(s) for s in states):
                return state
            time.sleep(0.25)
        raise TimeoutError(
            f"job {job_id} not in {list(states)} within {timeout_s} s (last state: {state or 'none'}); "
            f"see {self.dir / 'log' / 'slurmctld.log'}"
        )

    def log(self, daemon: str) -> str:
        """Contents of DIR/log/<daemon>.log (slurmctld, slurmd, slurmdbd, munged, mariadb)."""
        return (self.dir / "log" / f"{daemon}.log").read_text(errors="replace")


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"SLURM dev cluster unavailable on CI: {reason}")
    pytest.skip(reason)


def _parse_env(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            env[key.strip()] = value.strip()
    return env


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real SLURM cluster (munge, MariaDB, slurmdbd, slurmctld, slurmd) for the session."""
    if os.geteuid() != 0:
        _skip_or_fail("the dev SLURM cluster needs root (slurmd launches jobs; apt-get installs it)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        _skip_or_fail("slurm is not installed and there is no apt-get to install it")
    cluster_dir = tmp_path_factory.mktemp("slurm").resolve()  # the script resolves symlinks too
    print(f"starting dev SLURM cluster in {cluster_dir} ...", flush=True)
    t0 = time.monotonic()
    try:
        # stderr (progress lines, apt output) goes to the test log; stdout is the client env
        up = subprocess.run(
            ["bash", str(SCRIPT), "up", str(cluster_dir)],
            stdout=subprocess.PIPE, text=True, timeout=UP_TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired:
        subprocess.run(["bash", str(SCRIPT), "down", str(cluster_dir)], timeout=DOWN_TIMEOUT_S, check=False)
        raise RuntimeError(f"dev-cluster.sh up did not finish within {UP_TIMEOUT_S} s; logs in {cluster_dir}/log")
    if up.returncode == EXIT_CANNOT_INSTALL:
        _skip_or_fail("slurm/munge/mariadb are missing and apt-get could not install them")
    if up.returncode != 0:
        raise RuntimeError(
            f"dev-cluster.sh up {cluster_dir} exited {up.returncode}; logs in {cluster_dir}/log "
            "(the script printed the failing daemon's log tail to stderr)"
        )
    env = _parse_env(up.stdout)
    if "SLURM_CONF" not in env:
        raise RuntimeError(f"dev-cluster.sh up printed no SLURM_CONF:\n{up.stdout}")
    print(f"dev SLURM cluster up in {time.monotonic() - t0:.1f} s", flush=True)

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        cluster = SlurmCluster(dir=cluster_dir, env=env, partition="", n_cpus=0, n_gpus=0)
        # the cluster's shape as the controller reports it, not as the script intended
        part = cluster.run("sinfo", "-h", "-o", "%P").stdout.split()
        cluster.partition = next(p.rstrip("*") for p in part if p.endswith("*"))
        node = dict(
            kv.split("=", 1)
            for kv in cluster.run("scontrol", "show", "node", "-o").stdout.split()
            if "=" in kv
        )
        cluster.node = node["NodeName"]
        cluster.n_cpus = int(node["CPUTot"])
        gres = node.get("Gres", "(null)")
        cluster.n_gpus = int(gres.split(":")[-1].split("(")[0]) if gres.startswith("gpu") else 0
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        down = subprocess.run(
            ["bash", str(SCRIPT), "down", str(cluster_dir)], timeout=DOWN_TIMEOUT_S, check=False
        )
        if down.returncode != 0:
            raise RuntimeError(f"dev-cluster.sh down {cluster_dir} exited {down.returncode}")
