"""The backends' config sections and the value checks they share: `BackendConfig` (the section
every backend extends), `register_backend` (a backend's config module calls it when imported:
suite.embedded.config, suite.verl.config), and `check_choice` / `check_number` / `check_text`.

Below suite.config, which imports the backends' config modules to register them: those modules
import this one, never suite.config, so the registration is no import loop.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from suite.overrides import ConfigError
from suite.overrides import check as _check


@dataclass
class BackendConfig:
    name: str = "embedded"  # embedded (pure PyTorch, CPU) | verl (GPU clusters: verl + vLLM, suite.verl)


# Checks of a backend's own section and of what it needs from the task, run by validate.
BACKEND_CHECKS: dict[str, Callable[[DictConfig], None]] = {}
# Each backend's keys under `backend.` that hold local paths (comma-separated lists allowed): a
# relative one that exists is made absolute at compose (`absolute_paths`), because a run reads
# them from its own run directory (verl starts there), maybe on a SLURM compute node.
BACKEND_PATHS: dict[str, tuple[str, ...]] = {}


def register_backend(name: str, node: Any, check: Callable[[DictConfig], None], paths: tuple[str, ...] = ()) -> None:
    """Register backend ``name``'s config section (``backend=<name>``, a ``BackendConfig``
    or subclass instance), the check `suite.config.validate` runs on its configs, and its path keys
    (``BACKEND_PATHS``). Backends call it when their config module is imported
    (suite.embedded.config, suite.verl.config, listed in ``suite.config.BACKEND_MODULES``)."""
    ConfigStore.instance().store(group="backend", name=name, node=node)
    BACKEND_CHECKS[name] = check
    BACKEND_PATHS[name] = paths


def absolute_paths(value: str) -> str:
    """``value``, a path or a comma-separated list of them, with each relative one that exists
    under the working directory made absolute (``~`` expanded). Anything else stays as written:
    an absolute path, a path that exists only on the compute nodes, a hub id (``Qwen/Qwen2.5-7B``)."""
    out = []
    for part in value.split(",") if value else []:
        p = os.path.expanduser(part.strip())
        out.append(os.path.abspath(p) if not os.path.isabs(p) and os.path.exists(p) else part)
    return ",".join(out) if out else value


def check_choice(cfg: DictConfig, key: str, allowed: tuple) -> None:
    value = OmegaConf.select(cfg, key)
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def check_number(cfg: DictConfig, key: str, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False, hi_open: bool = False) -> None:
    """``key`` is a finite real number in the interval [lo, hi] (open at an end when asked)."""
    value = OmegaConf.select(cfg, key)
    def f(x):
        return str(x) if isinstance(x, int) else f"{x:g}"  # 2**32 in full, 0.5 not 0.500000

    lo_s = "" if lo is None else (f"> {f(lo)}" if lo_open else f">= {f(lo)}")
    hi_s = "" if hi is None else (f"< {f(hi)}" if hi_open else f"<= {f(hi)}")
    if lo is not None and hi is not None:
        domain = f"in {'(' if lo_open else '['}{f(lo)}, {f(hi)}{')' if hi_open else ']'}"
    else:
        domain = lo_s or hi_s
    # a bounded interval implies finite; a one-sided float bound says so (inf > 0 holds)
    kind = "" if (lo is not None and hi is not None) or isinstance(value, int) else "a finite number "
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    _check(ok, key, f"must be {kind}{domain}, got {value!r}")


def check_text(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    _check(isinstance(value, str) and value.strip() != "", key, f"must be a non-empty string, got {value!r}")
