"""Tune files: a base config, a search space, an objective, a sampler and a pruner.

A tune file (``experiments/tune_*.yaml``) is loaded into the typed :class:`TuneSpec`; a
mistyped key fails at load time naming it, and :func:`check_spec` rejects a bad search space
(empty range, log scale with a bound <= 0, unknown config key, a value the run config refuses)
before any trial starts. Nothing here imports Optuna at module level.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from suite.launch.config import MAX_POLL_S
from suite.overrides import first_line

PARAM_TYPES = ("float", "int", "categorical")
# The namespaces of the metric keys a run logs (docs/metrics.md): an objective outside them is
# a key no trial ever logs, so every trial would end FAIL with no value.
METRIC_NAMESPACES = ("actor", "critic", "perf", "quant", "response", "response_length", "rollout_corr", "timing_s",
                     "train", "val-core", "warm_start")
DIRECTIONS = ("maximize", "minimize")
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("none", "median", "successive_halving")
LAUNCHERS = ("local", "slurm")


class TuneSpecError(ValueError):
    """A tune file that cannot run; the message names the key (and the parameter)."""


@dataclass
class ParamSpec:
    type: str = "float"  # float | int | categorical
    low: Optional[float] = None  # float/int: lower bound (inclusive), in the config key's unit
    high: Optional[float] = None  # float/int: upper bound (inclusive)
    log: bool = False  # float/int: sample on a log scale (needs low > 0)
    step: Optional[float] = None  # float/int: grid spacing (int default 1); needed by sampler=grid for floats
    choices: Optional[List[Any]] = None  # categorical: the values to choose from


@dataclass
class ObjectiveSpec:
    # Metric key (docs/metrics.md) whose value at the run's last logged step is the trial's
    # objective. Pruning reports held-out accuracy, so a pruner needs this to be
    # val-core/<task>/acc/mean@1.
    metric: str = "val-core/arith/acc/mean@1"
    direction: str = "maximize"  # maximize | minimize


@dataclass
class SamplerSpec:
    name: str = "tpe"  # tpe (default) | random | grid (every combination of choices / steps)
    seed: Optional[int] = 0  # sampler seed; null = nondeterministic
    n_startup_trials: int = 5  # tpe: random trials before the model is used


@dataclass
class PrunerSpec:
    name: str = "median"  # none | median | successive_halving
    n_startup_trials: int = 3  # median: trials that must finish before any pruning
    n_warmup_steps: int = 0  # median: RL steps before a trial may be pruned
    interval_steps: int = 1  # median: check every N reported steps
    min_resource: int = 1  # successive_halving: RL steps of the first rung
    reduction_factor: int = 3  # successive_halving: eta, 1/eta of trials promoted per rung
    min_early_stopping_rate: int = 0  # successive_halving: s, first rung at min_resource * eta**s


@dataclass
class LauncherSpec:
    name: str = "local"  # local (submitit LocalExecutor, processes on this machine) | slurm
    profile: str = "dev"  # slurm: a profile name in slurm/profiles/ (partition, account, GPUs) or a .yaml path
    timeout_min: int = 120  # wall-clock limit of one trial job (minutes)
    cpus_per_task: int = 1  # CPU cores of one trial job; also its torch threads (threads=)


@dataclass
class TuneSpec:
    study: str = "tune"  # Optuna study name; also the MLflow parent run's name
    # Optuna storage: an SQLAlchemy URL (sqlite:///path.db, postgresql://...). A study in it
    # survives a crash; `suite tune FILE` again continues it. Relative sqlite paths are from the
    # directory `suite tune` runs in.
    storage: str = "sqlite:///runs/tune/optuna.db"
    out_dir: str = "runs/tune"  # trial run dirs: out_dir/<study>/trial-<n>; submitit logs in out_dir/<study>/jobs
    base: List[str] = field(default_factory=list)  # Hydra overrides of suite/config.py shared by every trial
    space: Dict[str, ParamSpec] = field(default_factory=dict)  # config key -> its search range
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    n_trials: int = 20  # trials in the study (all states); a resumed study runs only the missing ones
    parallelism: int = 1  # trials running at once
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    launcher: LauncherSpec = field(default_factory=LauncherSpec)
    poll_s: float = 2.0  # how often the driver checks its jobs (seconds)


def load_tune_file(path: str, extra_overrides: list[str] | tuple[str, ...] = ()) -> TuneSpec:
    """Read a tune YAML into a :class:`TuneSpec` (unknown keys fail, naming them), apply
    dotted ``extra_overrides`` (e.g. ``n_trials=4``) and check it with :func:`check_spec`."""
    if not os.path.exists(path):
        raise TuneSpecError(f"tune file {path!r} not found")
    from suite.launch.fileio import read_yaml

    _, data = read_yaml(path, TuneSpecError)  # UTF-8, duplicate keys refused, errors name the file
    if not isinstance(data, dict):
        raise TuneSpecError(f"{path}: must be a mapping of tune keys, got {type(data).__name__}")
    schema = OmegaConf.structured(TuneSpec)
    try:
        merged = OmegaConf.merge(schema, data)
        if extra_overrides:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(extra_overrides)))
    except OmegaConfBaseException as exc:
        raise TuneSpecError(f"{path}: {first_line(exc)}") from exc
    spec: TuneSpec = OmegaConf.to_object(merged)
    check_spec(spec)
    return spec


def _fail(key: str, message: str) -> None:
    raise TuneSpecError(f"{key}: {message}")


def _choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        _fail(key, f"{value!r} is not allowed; choose one of: {', '.join(allowed)}")


def check_param(name: str, p: ParamSpec) -> None:
    """Reject a bad range for parameter ``name`` (key ``space.<name>.<field>``)."""
    key = f"space.{name}"
    _choice(f"{key}.type", p.type, PARAM_TYPES)
    if p.type == "categorical":
        if not p.choices:
            _fail(f"{key}.choices", "a categorical parameter needs a non-empty list of choices")
        if len(set(map(repr, p.choices))) != len(p.choices):
            _fail(f"{key}.choices", f"has duplicates: {p.choices}")
        for f_name in ("low", "high", "step"):
            if getattr(p, f_name) is not None:
                _fail(f"{key}.{f_name}", "is for float/int parameters; a categorical one has only choices")
        if p.log:
            _fail(f"{key}.log", "is for float/int parameters")
        return
    if p.choices is not None:
        _fail(f"{key}.choices", f"is for categorical parameters; this one is type={p.type}")
    for f_name in ("low", "high"):
        v = getattr(p, f_name)
        if v is None:
            _fail(f"{key}.{f_name}", f"a {p.type} parameter needs low and high")
        if not math.isfinite(v):
            _fail(f"{key}.{f_name}", f"must be finite, got {v}")
        if p.type == "int" and v != int(v):
            _fail(f"{key}.{f_name}", f"an int parameter needs integer bounds, got {v}")
    if not p.low < p.high:
        _fail(key, f"empty range: low={p.low} must be < high={p.high} (fix a value in `base` instead)")
    if p.log and p.low <= 0:
        _fail(f"{key}.low", f"log=true needs low > 0, got {p.low}")
    if p.step is not None:
        if not p.step > 0:
            _fail(f"{key}.step", f"must be > 0, got {p.step}")
        if p.log:
            _fail(f"{key}.step", "cannot be combined with log=true (Optuna samples a log range continuously)")
        if p.type == "int" and p.step != int(p.step):
            _fail(f"{key}.step", f"an int parameter needs an integer step, got {p.step}")
        if p.step > p.high - p.low:
            _fail(f"{key}.step", f"step {p.step} is larger than the range {p.low}..{p.high}")


def _check_storage_driver(url: str) -> None:
    """The storage URL's database and driver exist here (SQLAlchemy's dialect registry, then the
    driver module), so a typo'd scheme or a missing driver is refused before a study is made."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        dialect = make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        _fail("storage", f"{url!r} is not a database URL SQLAlchemy knows ({str(exc).splitlines()[0][:160]}); "
                         "e.g. sqlite:///runs/tune/optuna.db or postgresql://user@host/db")
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        _fail("storage", f"{url!r}: the database driver is not installed here ({exc})")


def check_spec(spec: TuneSpec) -> None:
    """Check everything that can be checked without the run config (see also :func:`check_against_config`)."""
    if not spec.study or "/" in spec.study or spec.study.strip() != spec.study:
        _fail("study", f"must be a non-empty name without '/' or surrounding spaces, got {spec.study!r}")
    if "://" not in spec.storage:
        _fail("storage", f"must be an SQLAlchemy URL such as sqlite:///runs/tune/optuna.db, got {spec.storage!r}")
    _check_storage_driver(spec.storage)
    if not spec.space:
        _fail("space", "is empty: name at least one config key to search, "
                       "e.g. uaq.s: {type: float, low: 1.0, high: 2.0}")
    for name, p in spec.space.items():
        check_param(name, p)
    _choice("objective.direction", spec.objective.direction, DIRECTIONS)
    if not spec.objective.metric:
        _fail("objective.metric", "must name a metric key (docs/metrics.md)")
    if spec.objective.metric.split("/")[0] not in METRIC_NAMESPACES or "/" not in spec.objective.metric:
        _fail("objective.metric", f"{spec.objective.metric!r} is not a metric a run logs; keys are "
                                  f"<namespace>/..., namespaces: {', '.join(METRIC_NAMESPACES)} (docs/metrics.md)")
    if spec.n_trials < 1:
        _fail("n_trials", f"must be >= 1, got {spec.n_trials}")
    if spec.parallelism < 1:
        _fail("parallelism", f"must be >= 1, got {spec.parallelism}")
    if not (0 < spec.poll_s <= MAX_POLL_S):  # inf: a driver that never polls; past ~1e9 s time.sleep overflows
        _fail("poll_s", f"must be in (0, {MAX_POLL_S:g}] seconds, got {spec.poll_s}")
    _choice("sampler.name", spec.sampler.name, SAMPLERS)
    if spec.sampler.name == "grid":
        for name, p in spec.space.items():
            if p.type == "float" and p.step is None:
                _fail(f"space.{name}.step", "sampler=grid needs a step for every float parameter (or use choices)")
            if p.log and p.type != "categorical":
                _fail(f"space.{name}.log", "sampler=grid enumerates values; use choices or a step instead of log")
    if spec.sampler.n_startup_trials < 0:
        _fail("sampler.n_startup_trials", "must be >= 0")
    _choice("pruner.name", spec.pruner.name, PRUNERS)
    pr = spec.pruner
    for k in ("n_startup_trials", "n_warmup_steps", "min_early_stopping_rate"):
        if getattr(pr, k) < 0:
            _fail(f"pruner.{k}", "must be >= 0")
    for k in ("interval_steps", "min_resource"):
        if getattr(pr, k) < 1:
            _fail(f"pruner.{k}", "must be >= 1")
    if pr.reduction_factor < 2:
        _fail("pruner.reduction_factor", "must be >= 2")
    _choice("launcher.name", spec.launcher.name, LAUNCHERS)
    if spec.launcher.timeout_min < 1:
        _fail("launcher.timeout_min", "must be >= 1")
    if spec.launcher.cpus_per_task < 1:
        _fail("launcher.cpus_per_task", "must be >= 1")
    if spec.launcher.name == "slurm":
        from suite.launch.profiles import SweepError, load_profile

        try:
            load_profile(spec.launcher.profile)
        except SweepError as exc:
            _fail("launcher.profile", str(exc))


def held_out_metric(task: str) -> str:
    """The held-out accuracy key (docs/metrics.md) a pruner sees at each evaluation."""
    return f"val-core/{task}/acc/mean@1"


def param_override(key: str, value: Any) -> str:
    """A Hydra override setting ``key`` to ``value`` (floats keep full precision)."""
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, float):
        return f"{key}={value!r}"
    return f"{key}={value}"


def _corner_values(p: ParamSpec) -> list:
    if p.type == "categorical":
        return list(p.choices)
    cast = int if p.type == "int" else float
    return [cast(p.low), cast(p.high)]


def check_against_config(spec: TuneSpec, compose) -> DictConfig:
    """Compose the base config, then every parameter at each bound (each choice), so an unknown
    key or a value the run config refuses fails now, naming the parameter. ``compose`` is
    ``suite.config.compose_config``. Returns the base config."""
    from hydra.errors import HydraException

    from suite.config import ConfigError

    try:
        base = compose(list(spec.base))
    except (ConfigError, HydraException, OmegaConfBaseException) as exc:
        raise TuneSpecError(f"base: {first_line(exc)}") from exc
    from suite.hydra_compat import config_groups

    groups = set(config_groups())  # quant, algo, ...
    for name, p in spec.space.items():
        if name in groups:
            if p.type != "categorical":
                raise TuneSpecError(f"space.{name}: {name!r} is a config group: search it with type: categorical "
                                    f"and choices naming its options (e.g. quant: [int8, fp8])")
        elif OmegaConf.select(base, name, default="__missing__") == "__missing__" or OmegaConf.is_dict(
            OmegaConf.select(base, name)
        ):
            raise TuneSpecError(
                f"space.{name}: unknown parameter key {name!r}: not a value of the run config "
                f"(`suite run --cfg` prints every key)"
            )
        if name in ("seed", "out_dir", "threads") or name.startswith("tracking."):
            raise TuneSpecError(f"space.{name}: {name!r} is not a tunable setting")
        for v in _corner_values(p):
            try:
                compose([*spec.base, param_override(name, v)])
            except (ConfigError, HydraException, OmegaConfBaseException) as exc:
                raise TuneSpecError(f"space.{name}: value {v!r} is refused by the run config: "
                                    f"{first_line(exc)}") from exc
    metric = spec.objective.metric
    if metric.startswith("val-core/") and metric != held_out_metric(base.task.name):
        raise TuneSpecError(
            f"objective.metric: {metric!r} is not logged by task.name={base.task.name}; "
            f"its held-out accuracy is {held_out_metric(base.task.name)!r}"
        )
    if spec.pruner.name != "none" and metric != held_out_metric(base.task.name):
        raise TuneSpecError(
            f"pruner.name={spec.pruner.name}: trials report held-out accuracy at each evaluation, so a pruner "
            f"needs objective.metric={held_out_metric(base.task.name)!r}, not {metric!r}; or set pruner.name=none"
        )
    return base
