"""submitit executors for sweep cells and tuning trials: the local launcher, or SLURM with a
cluster profile from slurm/profiles/ (docs/sweeps.md, "Launchers")."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

from suite.launch.config import LauncherConfig, Resources
from suite.launch.fileio import SweepError
from suite.launch.profiles import load_profile

LOCAL_TIMEOUT_MIN = 7 * 24 * 60  # local runs have no scheduler time limit; submitit needs one
CONTROLLER_LOG = "controllers.err"  # the local job controllers' stderr, in the submitit folder


@contextlib.contextmanager
def controller_stderr(executor):
    """Submit local jobs inside this block: the job controllers submitit starts (one process per
    job) inherit a stderr that is `<folder>/controllers.err`, not the terminal. A terminal's Ctrl-C
    reaches them with the driver, and the driver's own stop then lands in their cleanup: each
    printed a KeyboardInterrupt traceback over the driver's one-line answer. The jobs' own output
    goes to their log files either way; SLURM jobs have no controller here."""
    if type(executor).__name__ != "LocalExecutor":
        yield
        return
    folder = Path(executor.folder)
    folder.mkdir(parents=True, exist_ok=True)
    log = os.open(folder / CONTROLLER_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(log, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)


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
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=launcher.max_requeue)
    ex.update_parameters(**slurm_parameters(launcher, resources, job_name, sweep_path))
    return ex


def slurm_parameters(launcher: LauncherConfig, resources: Resources | None = None, job_name: str = "suite",
                     sweep_path: str | None = None) -> dict:
    """submitit's SlurmExecutor parameters for `launcher`'s profile with `resources` over it (the
    keyword arguments of its sbatch script)."""
    resources = resources or Resources()
    prof, _ = load_profile(launcher.profile, sweep_path)
    params = dict(
        job_name=job_name,
        time=int(resources.timeout_min or prof.timeout_min),
        nodes=int(resources.nodes or prof.nodes),
        ntasks_per_node=prof.tasks_per_node,
        cpus_per_task=int(resources.cpus_per_task or prof.cpus_per_task),
        signal_delay_s=prof.signal_delay_s,
        array_parallelism=max(1, min(launcher.array_parallelism or prof.array_parallelism, prof.array_parallelism)),
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
    return params


def sbatch_preview(launcher: LauncherConfig, folder: str | os.PathLike, n_jobs: int, resources: Resources | None = None,
                   job_name: str = "suite", sweep_path: str | None = None) -> str:
    """The sbatch script submitit would submit for `n_jobs` cells (one job, or an array of them),
    rendered by submitit's own script writer (`_make_sbatch_string`, what `SlurmExecutor` hands to
    sbatch; submitit is pinned below 1.6 in pyproject.toml) without a SLURM installation."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(launcher, resources, job_name, sweep_path)
    if n_jobs > 1:
        params["map_count"] = n_jobs
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=folder, **params)
