"""submitit executors for sweep cells and tuning trials: the local launcher, or SLURM with a
cluster profile from slurm/profiles/ (docs/sweeps.md, "Launchers")."""

from __future__ import annotations

import os
from pathlib import Path

from suite.launch.profiles import load_profile
from suite.launch.config import LauncherConfig, Resources
from suite.launch.fileio import SweepError

LOCAL_TIMEOUT_MIN = 7 * 24 * 60  # local runs have no scheduler time limit; submitit needs one


def make_executor(launcher: LauncherConfig, folder: str | os.PathLike, resources: Resources | None = None,
                  job_name: str = "suite", sweep_path: str | None = None):
    """A submitit executor for `launcher` (local, or slurm with `launcher.profile`), with the
    per-run `resources` over the profile's. Values reach sbatch only as quoted `#SBATCH`
    options (checked against a strict pattern when the profile is read); the run itself
    travels as a pickle, never through a shell."""
    import submitit

    resources = resources or Resources()
    folder = Path(folder)
    if launcher.name == "local":
        ex = submitit.LocalExecutor(folder=folder, max_num_timeout=launcher.max_requeue)
        ex.update_parameters(timeout_min=resources.timeout_min or LOCAL_TIMEOUT_MIN, signal_delay_s=30)
        return ex
    if launcher.name != "slurm":
        raise SweepError(f"launcher.name={launcher.name!r} is not a launcher; choose one of: local, slurm")
    prof, _ = load_profile(launcher.profile, sweep_path)
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=launcher.max_requeue)
    params = dict(
        job_name=job_name,
        time=int(resources.timeout_min or prof.timeout_min),
        nodes=int(resources.nodes or prof.nodes),
        ntasks_per_node=prof.tasks_per_node,
        cpus_per_task=int(resources.cpus_per_task or prof.cpus_per_task),
        signal_delay_s=prof.signal_delay_s,
        array_parallelism=max(1, min(launcher.max_parallel, prof.array_parallelism)),
        stderr_to_stdout=False,
    )
    gpus = resources.gpus_per_node if resources.gpus_per_node is not None else prof.gpus_per_node
    if gpus:
        params["gpus_per_node"] = int(gpus)
    mem = resources.mem_gb or prof.mem_gb
    if mem:
        params["mem"] = f"{int(mem)}GB" if float(mem) == int(mem) else f"{int(float(mem) * 1024)}MB"
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(prof, key):
            params[key] = getattr(prof, key)
    if prof.setup:
        params["setup"] = list(prof.setup)
    if prof.additional:
        params["additional_parameters"] = dict(prof.additional)
    ex.update_parameters(**params)
    return ex
