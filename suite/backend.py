"""The backend contract: `run(cfg, run_dir, on_eval) -> RunSummary` and `command(cfg, run_dir,
overrides) -> argv`, resolved by name.

A backend trains one composed run config in its run directory (suite.tracking.rundir) and
returns a `RunSummary`; a finished run directory returns its summary at once
(`already_finished`), an unfinished one resumes from its last checkpoint. `suite run`, sweep
cells and tuning trials reach a backend only through `suite.cell.run_cell`, which records the
MLflow outcome. The shape follows torchtune's recipe interface (a small Protocol, no
implementation inheritance; https://github.com/pytorch/torchtune/blob/v0.6.1/torchtune/recipe_interfaces.py).

Backends are imported when resolved, never at start-up: the verl backend pulls in nothing
heavy itself, but the embedded one imports torch and the model.
"""

from __future__ import annotations

import importlib
from typing import Any

from omegaconf import DictConfig

# the contract's types (re-exported: callers import them from here)
from suite.contract import Backend, OnEval, OpenRun, RunSummary  # noqa: F401

# name -> the backend's package: `<package>.backend` implements the contract (`run`, `command`),
# `<package>.config` registers its config section (suite.config imports it). The one list of backends.
BACKENDS: dict[str, str] = {
    "embedded": "suite.embedded",
    "verl": "suite.verl",
}


def _module(name: str):
    try:
        package = BACKENDS[name]
    except KeyError:
        raise ValueError(f"backend.name={name!r} has no runner; allowed: {', '.join(BACKENDS)}") from None
    return importlib.import_module(f"{package}.backend")


def get_backend(name: str) -> Backend:
    """The backend called `name` (`backend.name` of a run config)."""
    return _module(name).run


def backend_warm_start(cfg: DictConfig, *, progress: bool = False) -> dict[str, Any]:
    """Train (or find) the cached warm start a run of `cfg` would start from, creating no run dir
    (`suite run --warm-start-only`): the cache entry's info (`cache_path`, `cache_hit`). A backend
    has one where `<package>.backend` defines `warm_start`; ValueError naming those that do."""
    module = _module(cfg.backend.name)
    if not hasattr(module, "warm_start"):
        have = [name for name in BACKENDS if hasattr(_module(name), "warm_start")]
        raise ValueError(f"backend={cfg.backend.name} has no warm start; allowed: "
                         f"{', '.join('backend=' + name for name in have)}")
    return module.warm_start(cfg, progress=progress)


def backend_command(cfg: DictConfig, run_dir: str, overrides: list[str]) -> list[str]:
    """argv that runs `cfg` by hand in `run_dir` (a sweep's dry run prints it): `suite run
    <overrides>` for the embedded backend, verl's own trainer command for verl."""
    return list(_module(cfg.backend.name).command(cfg, run_dir, overrides))


def backend_missing(cfg: DictConfig) -> str | None:
    """What this environment lacks to run `cfg` with its backend, in one line (a backend checks
    where `<package>.backend` defines `missing`); None when nothing is missing. Asked before
    anything is created: a missing verl was a 55-line traceback after the run dir existed."""
    module = _module(cfg.backend.name)
    return module.missing(cfg) if hasattr(module, "missing") else None
