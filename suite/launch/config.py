"""What a launch needs besides the runs: the launcher (local or SLURM, how many at once, how
often to poll) and the per-run resources, as sweep and tune files both spell them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from suite.launch.profiles import DEFAULT_PROFILE

LAUNCHERS = ("local", "slurm")
MAX_POLL_S = 86_400.0  # the longest poll interval a driver accepts (seconds): one day


@dataclass
class LauncherConfig:
    name: str = "local"  # local (this machine, submitit LocalExecutor) | slurm (submitit job arrays)
    max_parallel: int = 2  # local launcher: runs at once on this machine (a SLURM array: array_parallelism)
    # slurm: array tasks running at once (the array's %N); default the cluster profile's array_parallelism
    # (its cap), so a cluster sweep runs as wide as the profile allows; `--max-parallel N` sets it too
    array_parallelism: Optional[int] = None
    profile: str = DEFAULT_PROFILE  # slurm: profile name in slurm/profiles/ (or a path to a .yaml)
    poll_s: float = 5.0  # seconds between job-state polls while waiting
    progress_s: float = 30.0  # seconds between aggregate lines while waiting without a terminal (a bar on one)
    max_requeue: int = 3  # preemptions/timeouts after which a run is not requeued (submitit max_num_timeout)
    # cells a file may expand to, counted before expansion (validation time grows with the cells:
    # docs/bench.md, "Measurements behind the code");
    # raise it on purpose for a bigger sweep (`--max-cells N`)
    max_cells: int = 10_000


@dataclass
class Resources:
    """Per-run resources; None = the profile's value (local launcher: only timeout_min is used)."""

    timeout_min: Optional[int] = None  # wall-clock limit of one job (minutes); then checkpoint + requeue
    nodes: Optional[int] = None  # nodes per run (multi-node: backend=verl, a later issue)
    gpus_per_node: Optional[int] = None  # GPUs per node
    cpus_per_task: Optional[int] = None  # CPU cores per run
    mem_gb: Optional[float] = None  # memory per node (GB)
