"""SLURM cluster profiles (slurm/profiles/<name>.yaml): where and how SLURM runs a job, checked
so that every value reaches sbatch only as a plain `#SBATCH` option (docs/sweeps.md, "Cluster profiles")."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from suite.launch.fileio import NAME_RE, SweepError, check_positive, read_yaml, typed

# Profiles ship in slurm/profiles/ at the repository root (beside the suite package).
PROFILES_DIR = Path(__file__).resolve().parents[2] / "slurm" / "profiles"
DEFAULT_PROFILE = "dev"  # the local development cluster (slurm/dev-cluster.sh)
_SBATCH_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:+@%=/-]{1,200}$")


@dataclass
class SlurmProfile:
    """A cluster profile (slurm/profiles/<name>.yaml): where and how SLURM runs a cell."""

    description: str = ""  # one line: the machine it describes
    partition: Optional[str] = None  # sbatch --partition (None = the cluster default)
    account: Optional[str] = None  # sbatch --account
    qos: Optional[str] = None  # sbatch --qos
    constraint: Optional[str] = None  # sbatch --constraint (node features, e.g. h100)
    nodes: int = 1  # nodes per run (> 1: multi-node verl runs; embedded runs use one)
    tasks_per_node: int = 1  # processes per node (1: the runner starts its own workers, e.g. Ray)
    gpus_per_node: int = 0  # GPUs per node (--gpus-per-node)
    cpus_per_task: int = 1  # CPU cores per task
    mem_gb: Optional[float] = None  # memory per node in GB (None = the partition default)
    timeout_min: int = 60  # time limit of one job (minutes); requeued from the checkpoint after it
    array_parallelism: int = 64  # cap of concurrently running array tasks (min with launcher.max_parallel)
    signal_delay_s: int = 120  # USR2 this many seconds before the time limit (checkpoint + requeue)
    setup: List[str] = field(default_factory=list)  # trusted shell lines before the run (module load ...)
    additional: Dict[str, str] = field(default_factory=dict)  # extra sbatch options, e.g. {exclusive: "user"}



def find_profile(name: str, sweep_path: str | None = None) -> Path:
    """A profile name (slurm/profiles/<name>.yaml) or a path to a profile .yaml file."""
    if name.endswith((".yaml", ".yml")):
        p = Path(name)
        if not p.is_absolute() and sweep_path is not None and not p.exists():
            p = Path(sweep_path).parent / p
        return p
    return PROFILES_DIR / f"{name}.yaml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str, sweep_path: str | None = None) -> tuple[SlurmProfile, str]:
    """Read and check a cluster profile; errors name the profile file and key."""
    if not name.endswith((".yaml", ".yml")) and not NAME_RE.match(name):
        raise SweepError(f"launcher.profile={name!r} is not a profile name; "
                         f"available: {', '.join(available_profiles())}")
    path = find_profile(name, sweep_path)
    if not path.is_file():
        raise SweepError(
            f"launcher.profile={name!r}: no profile {path}; available: {', '.join(available_profiles())}"
        )
    _, data = read_yaml(path)
    prof = typed(str(path), SlurmProfile, data)
    check_positive(str(path), prof, ("nodes", "tasks_per_node", "cpus_per_task", "timeout_min",
                                      "array_parallelism", "mem_gb"))
    if prof.gpus_per_node < 0 or prof.signal_delay_s < 0:
        raise SweepError(f"{path}: gpus_per_node and signal_delay_s must be >= 0")
    for key in ("partition", "account", "qos", "constraint"):
        _check_sbatch_value(str(path), key, getattr(prof, key))
    for key, value in prof.additional.items():
        if not re.match(r"^[a-z][a-z0-9-_]*$", key):
            raise SweepError(f"{path}: additional: {key!r} is not an sbatch option name")
        _check_sbatch_value(str(path), f"additional.{key}", value)
    return prof, str(path)


def _check_sbatch_value(where: str, key: str, value: Any) -> None:
    if value is None:
        return
    if not _SBATCH_VALUE_RE.match(str(value)):
        raise SweepError(f"{where}: {key}={value!r}: only letters, digits and _.,:+@%=/- are allowed")
