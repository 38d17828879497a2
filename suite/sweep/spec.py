"""Sweep files: a base config plus matrix axes, expanded into validated cells.

    sweep = load_sweep("experiments/quickstart.yaml", ["steps=10"])
    for cell in sweep.cells: print(cell.index, cell.axes, cell.run_id)

The format is documented in docs/sweeps.md (and experiments/README.md). Every cell is
composed and validated here, before anything is created or submitted; the first bad one
raises `SweepError` naming the file, the cell and the key.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
import os
import re
import shlex
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from suite.launch.fileio import (  # noqa: F401 - read_yaml and format_value are the sweep files' API too
    NAME_RE,
    SweepError,
    axis_values,
    check_key,
    check_positive,
    format_value,
    override_key,
    read_yaml,
    scalar,
    typed,
)
from suite.launch.config import LAUNCHERS, MAX_POLL_S, LauncherConfig, Resources  # noqa: F401 - the sweep model's parts
from suite.launch.profiles import DEFAULT_PROFILE, SlurmProfile, load_profile  # noqa: F401 - load_profile: the launchers'

if TYPE_CHECKING:  # omegaconf is imported where a config is composed: `suite status` may need none
    from omegaconf import DictConfig

TOP_KEYS = ("name", "description", "base", "matrix", "include", "exclude", "resources", "launcher")


@dataclass
class Cell:
    """One run of a sweep."""

    index: int  # position in the expanded matrix (stable for a given file)
    overrides: List[str]  # Hydra overrides that reproduce the run: `suite run <overrides>`
    axes: Dict[str, str]  # the matrix/include values that define this cell (override key -> value)
    cfg: DictConfig  # composed and validated config
    run_id: str  # suite.config.run_id(cfg)
    run_dir: str  # absolute: <out_dir>/<run_id>

    @property
    def config_axes(self) -> dict[str, str]:
        """The experiment axes of the run (`suite.config.axes`): MLflow tags, report columns."""
        from suite.config import axes

        return axes(self.cfg)

    @property
    def steps(self) -> int:
        """RL steps of the run (`suite status` shows step N/steps)."""
        return int(self.cfg.steps)

    def command(self) -> list[str]:
        """argv that runs this cell by hand: `suite run ...` (embedded) or verl's main_ppo (verl),
        as its backend says (suite.backend.backend_command)."""
        from suite.backend import backend_command

        return backend_command(self.cfg, self.run_dir, list(self.overrides))


class RecordedCell(Cell):
    """A cell as a launch recorded it in `matrix.json`: its config is built only if asked for,
    from the config the launch recorded (`suite.config.config_from_record`), or composed from its
    overrides when the record has none (a launch before configs were recorded)."""

    def __init__(self, *, steps: int, config: Optional[dict] = None, **fields):
        self._cfg: Optional[DictConfig] = None
        self._steps = steps
        self._config = config
        super().__init__(cfg=None, **fields)

    @property
    def cfg(self) -> DictConfig:
        if self._cfg is None:
            from suite.config import compose_config, config_from_record

            self._cfg = (config_from_record(self._config) if self._config is not None
                         else compose_config(list(self.overrides)))
        return self._cfg

    @cfg.setter
    def cfg(self, value: Optional[DictConfig]) -> None:
        self._cfg = value

    @property
    def steps(self) -> int:
        return self._steps


def launch_hash(text: str, cli_overrides: list[str]) -> str:
    """What a launch recorded of the sweep file and its command-line overrides."""
    return hashlib.sha256(json.dumps([text, list(cli_overrides)]).encode()).hexdigest()


def sweep_command(sweep: "Sweep", verb: str = "sweep") -> str:
    """The command that launches (`sweep`), shows (`status`) or cancels this very sweep: its file
    (relative to the working directory when below it) with the overrides, and for `sweep` the
    `--only` narrowing, it was given."""
    rel = os.path.relpath(sweep.path)
    path = rel if not rel.startswith("..") else sweep.path
    only = [f"--only={o}" for o in sweep.only] if verb == "sweep" else []
    return "suite " + shlex.join([verb, path, *sweep.cli_overrides, *only])


def overrides_changed(before: list[str], now: list[str]) -> str:
    """How the cells' overrides on the command line differ ("" when they do not): keys added,
    dropped or given another value; launcher, cluster and resources overrides are not compared
    (resuming with more parallelism is fine)."""
    b = {override_key(x): x for x in split_overrides(before)[0]}
    n = {override_key(x): x for x in split_overrides(now)[0]}
    parts = [f"{n[k]} (was {b[k]})" for k in n if k in b and n[k] != b[k]]
    parts += [f"{n[k]} (new)" for k in n if k not in b] + [f"no {b[k]}" for k in b if k not in n]
    return "; ".join(parts)


def read_record(state_dir: str) -> Optional[tuple[dict, list[RecordedCell]]]:
    """The last launch's record in `state_dir` (`matrix.json`, schema suite.schemas.MatrixRecordFile) and its
    cells; None when there is none or it does not match its schema (then the cells are composed)."""
    from suite.schemas import MatrixRecordFile, SchemaError, read_json

    try:
        doc = read_json(MatrixRecordFile, os.path.join(state_dir, "matrix.json"))
    except (OSError, SchemaError):
        return None
    cells = [RecordedCell(index=c.index, overrides=list(c.overrides), axes=dict(c.axes), run_id=c.run_id,
                          run_dir=c.run_dir, steps=c.steps, config=c.config) for c in doc.cells]
    return doc.model_dump(), cells


# suite.config's Config.out_dir (tests/sweep/test_recorded.py checks it): where a sweep that does
# not set out_dir keeps its state
DEFAULT_OUT_DIR = "runs"
_PLAIN = re.compile(r"^[A-Za-z0-9_./~+@%:-]+$")  # an override value Hydra reads as this very string


def state_dir_of(out_dir: str, name: str) -> str:
    """Where sweep `name` keeps its state: `<out_dir>/_sweeps/<name>`, absolute."""
    return os.path.join(os.path.abspath(os.path.expanduser(out_dir)), "_sweeps", name)


def out_dir_of(overrides: list[str]) -> Optional[str]:
    """A cell's out_dir read from its overrides, without composing; None when an override of it
    is not a plain value (quotes, an interpolation, a delete): then only composing knows."""
    out = DEFAULT_OUT_DIR
    for line in overrides:
        key, eq, value = line.partition("=")
        if key.lstrip("+~") != "out_dir":
            continue
        if key.startswith("~") or not eq or not _PLAIN.match(value):
            return None
        out = value
    return out


@dataclass
class Sweep:
    name: str  # sweep name: MLflow parent run name, SLURM job name, state directory name
    path: str  # absolute path of the sweep file
    text: str  # the sweep file as read (logged as an artifact of the parent run)
    description: str
    launcher: LauncherConfig
    resources: Resources
    profile: Optional[SlurmProfile]  # resolved profile (slurm launcher only)
    profile_path: Optional[str]
    axis_keys: List[str]  # matrix (and include) keys, in file order
    cli_overrides: List[str]  # overrides given after the file, applied to every cell
    cells: List[Cell]
    state_dir: str  # <out_dir>/_sweeps/<name>: matrix, job ids, submitit folder, parent run id
    tracking_uri: str
    experiment: str
    # `suite status`: how the cells shown relate to the file as it is now ("" = composed here, or
    # recorded by a launch of this very file and overrides)
    launch_note: str = ""
    # where the per-job resources came from, when not simply the file's over the profile's (verl cells)
    resources_note: str = ""
    # `--only KEY=V1,V2`: the matrix narrowed to these axis values (cells keep their indices in the full matrix)
    only: List[str] = None  # type: ignore[assignment]
    matrix_size: int = 0  # cells of the file's whole matrix (more than len(cells) where --only narrowed it)

    def __post_init__(self):
        self.only = list(self.only or [])

    def matrix_rows(self) -> list[dict[str, str]]:
        rows = []
        for c in self.cells:
            row = {"cell": str(c.index), **{k: c.axes.get(k, "") for k in self.axis_keys}, "run_id": c.run_id,
                   "run_dir": c.run_dir, "overrides": " ".join(c.overrides)}
            rows.append(row)
        return rows

    def matrix_json(self) -> str:
        """The launch's record (`matrix.json`): the sweep's settings and each cell as composed, its
        resolved config included (the report reads it instead of composing the cell again)."""
        from suite.config import config_record

        return json.dumps({"name": self.name, "file": self.path, "cli_overrides": self.cli_overrides,
                           "state_dir": self.state_dir, "tracking_uri": self.tracking_uri,
                           "experiment": self.experiment, "launch_hash": launch_hash(self.text, self.cli_overrides),
                           "only": self.only,
                           "launcher": asdict(self.launcher), "resources": asdict(self.resources),
                           "cells": [{"index": c.index, "axes": c.axes, "config_axes": c.config_axes,
                                      "run_id": c.run_id, "run_dir": c.run_dir, "overrides": c.overrides,
                                      "steps": c.steps, "config": config_record(c.cfg)}
                                     for c in self.cells]}, indent=2)

    def matrix_csv(self) -> str:
        buf = io.StringIO()
        rows = self.matrix_rows()
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue()


# --------------------------------------------------------------------------- loading


def split_overrides(overrides: list[str] | tuple[str, ...]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """CLI overrides -> (config overrides, launcher fields, resources fields).

    `launcher=slurm`, `launcher.max_parallel=4`, `cluster=h100x8` (= launcher.profile) and
    `resources.timeout_min=30` configure the sweep; everything else is a Hydra override of
    every cell. The run config has no `launcher`, `cluster` or `resources` key, so nothing is
    ambiguous."""
    cfg_ov, launcher, resources = [], {}, {}
    for line in overrides:
        if not isinstance(line, str) or "=" not in line:
            if isinstance(line, str) and line.startswith("~"):
                cfg_ov.append(line)
                continue
            raise SweepError(f"override {line!r}: expected key=value")
        key, value = line.split("=", 1)
        if key == "launcher":
            launcher["name"] = value
        elif key in ("cluster", "profile", "launcher.profile"):
            launcher["profile"] = value
        elif key.startswith("launcher."):
            launcher[key[len("launcher."):]] = value
        elif key.startswith("resources."):
            resources[key[len("resources."):]] = value
        else:
            cfg_ov.append(line)
    return cfg_ov, launcher, resources


def _yaml_scalar(value: str) -> Any:
    """A CLI string as YAML would read it (so `launcher.max_parallel=4` is an int)."""
    import yaml

    try:
        return yaml.safe_load(value)
    except Exception:  # noqa: BLE001
        return value


def _base_overrides(where: str, base: Any) -> list[str]:
    if base is None:
        return []
    if isinstance(base, dict):
        return [f"{check_key(where, k)}={scalar(where, k, v)}" for k, v in base.items()]
    if isinstance(base, list):
        out = []
        for i, line in enumerate(base):
            if not isinstance(line, str) or ("=" not in line and not line.startswith("~")):
                raise SweepError(f"{where}[{i}]: {line!r} is not an override 'key=value'")
            check_key(f"{where}[{i}]", line.split("=", 1)[0])
            out.append(line)
        return out
    raise SweepError(f"{where}: must be a list of 'key=value' overrides or a mapping, got {type(base).__name__}")



def _rules(path, name: str, rules, what: str):
    """`include` / `exclude`: a list (or null) of non-empty mappings -> (where, mapping) pairs,
    checked one at a time as the caller consumes them."""
    if rules is None:
        return
    if not isinstance(rules, list):
        raise SweepError(f"{path}: {name}: must be a list of mappings, got {type(rules).__name__}")
    for i, rule in enumerate(rules):
        where = f"{path}: {name}[{i}]"
        if not isinstance(rule, dict) or not rule:
            raise SweepError(f"{where}: must be a non-empty mapping of {what}")
        yield where, rule

def _expand(path: str, matrix: Any, include: Any, exclude: Any,
            max_cells: int = LauncherConfig.max_cells) -> tuple[list[str], list[dict[str, str]]]:
    """Matrix (cartesian product, file order) + include entries, minus exclude rules; the
    number of cells is counted from the axis lengths first, and more than `max_cells` refused."""
    if matrix is None:
        matrix = {}
    if not isinstance(matrix, dict):
        raise SweepError(f"{path}: matrix: must be a mapping of override key -> list of values, "
                         f"got {type(matrix).__name__}")
    axes: dict[str, list[str]] = {}
    for k, vals in matrix.items():
        axes[check_key(f"{path}: matrix", k)] = axis_values(f"{path}: matrix", k, vals)
    keys = list(axes)
    includes = [(where, {check_key(where, k): axis_values(where, k, v) for k, v in entry.items()})
                for where, entry in _rules(path, "include", include, "override key -> value(s)")]
    total = math.prod(len(v) for v in axes.values()) if axes else 0
    for _, own in includes:
        total += math.prod(len(v) for v in own.values()) * math.prod(len(v) for k, v in axes.items() if k not in own)
    if total > max_cells:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in axes.items()) or "(no matrix)"
        raise SweepError(f"{path}: the matrix expands to {total:,} cells ({sizes}, plus {len(includes)} include "
                         f"entries), more than launcher.max_cells={max_cells:,}; raise it with --max-cells N "
                         f"(or launcher.max_cells=N) if you mean it")
    cells = [dict(zip(keys, combo)) for combo in itertools.product(*axes.values())] if axes else []

    for where, own in includes:
        for k in own:
            if k not in keys:
                keys.append(k)
        # An include entry is a small matrix of its own keys, crossed with the main axes it
        # does not name (e.g. an LR control run for every seed of the matrix).
        rest = {k: v for k, v in axes.items() if k not in own}
        grid = {**own, **rest}
        for combo in itertools.product(*grid.values()):
            cells.append(dict(zip(grid, combo)))

    for where, rule in _rules(path, "exclude", exclude, "axis -> value(s)"):
        rvals = {}
        for k, v in rule.items():
            check_key(where, k)
            if k not in keys:
                raise SweepError(f"{where}: key {k!r} is not a matrix or include axis; "
                                 f"axes: {', '.join(keys) or '(none)'}")
            rvals[k] = axis_values(where, k, v)
        before = len(cells)
        cells = [c for c in cells if not all(k in c and c[k] in vs for k, vs in rvals.items())]
        if len(cells) == before:
            raise SweepError(f"{where}: {rule} matches no cell (a typo in a value?)")
    if not cells:
        raise SweepError(f"{path}: the matrix is empty: give matrix axes or include entries "
                         f"(and do not exclude every cell)")
    return keys, cells


def load_sweep(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (), *,
               recorded: bool = False, only: list[str] | tuple[str, ...] = ()) -> Sweep:
    """Read a sweep file, expand its matrix, compose and validate every cell.

    `overrides` (the command line after the file) apply to every cell; `launcher=...`,
    `launcher.<field>=...`, `cluster=<profile>` and `resources.<field>=...` configure the
    sweep instead (see `split_overrides`). Raises `SweepError` naming the file, cell and key.

    With `recorded` (`suite status`, which only reads), a sweep that has been launched gets the
    cells its last launch recorded in the state dir (run ids and run dirs as submitted), none of
    them composed; when the file or the overrides differ from the launch's, `launch_note` says so.
    A sweep never launched (or with an unreadable record) is composed as `suite sweep` does.

    `only` (`--only KEY=V1,V2`, repeatable) keeps the cells whose axis KEY has one of the values;
    they keep their indices in the full matrix, so a later full launch shares their state.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise SweepError(f"{path}: no such sweep file{_file_hint(path)}")
    text, data = read_yaml(path)
    if not isinstance(data, dict):
        raise SweepError(f"{path}: must be a mapping with keys {', '.join(TOP_KEYS)}")
    for k in data:
        if k not in TOP_KEYS:
            raise SweepError(f"{path}: unknown key {k!r}; allowed: {', '.join(TOP_KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SweepError(f"{path}: name={name!r}: required; letters, digits and _.- only "
                         f"(it names a directory, an MLflow run and SLURM jobs)")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise SweepError(f"{path}: description must be a string")

    try:
        cli_cfg, cli_launcher, cli_resources = split_overrides(list(overrides))
    except SweepError as exc:
        raise SweepError(f"{path}: {exc}") from None
    launcher_data = data.get("launcher")
    if isinstance(launcher_data, dict) or launcher_data is None:  # anything else: _typed names the error
        launcher_data = {**(launcher_data or {}), **{k: _yaml_scalar(v) for k, v in cli_launcher.items()}}
    launcher = typed(f"{path}: launcher", LauncherConfig, launcher_data)
    if launcher.name not in LAUNCHERS:
        raise SweepError(f"{path}: launcher.name={launcher.name!r} is not a launcher; "
                         f"choose one of: {', '.join(LAUNCHERS)}")
    check_positive(f"{path}: launcher", launcher, ("max_parallel", "poll_s", "progress_s", "max_cells")
                   + (("array_parallelism",) if launcher.array_parallelism is not None else ()))
    if launcher.poll_s > MAX_POLL_S:  # time.sleep overflows past ~1e9 s: the driver would die mid-sweep
        raise SweepError(f"{path}: launcher.poll_s={launcher.poll_s!r} must be <= {MAX_POLL_S:g} (one day)")
    if launcher.max_requeue < 0:
        raise SweepError(f"{path}: launcher.max_requeue must be >= 0")
    resources_data = data.get("resources")
    cli_resource_values = {k: _yaml_scalar(v) for k, v in cli_resources.items()}
    if isinstance(resources_data, dict) or resources_data is None:
        resources_data = {**(resources_data or {}), **cli_resource_values}
    resources = typed(f"{path}: resources", Resources, resources_data)
    check_positive(f"{path}: resources", resources, ("timeout_min", "nodes", "cpus_per_task", "mem_gb"))
    if resources.gpus_per_node is not None and resources.gpus_per_node < 0:
        raise SweepError(f"{path}: resources.gpus_per_node must be >= 0")
    cli_only = typed(f"{path}: resources", Resources, cli_resource_values)
    profile = profile_path = None
    if launcher.name == "slurm":
        try:
            profile, profile_path = load_profile(launcher.profile, path)
        except SweepError as exc:
            raise SweepError(f"{path}: {exc}") from None
        if launcher.array_parallelism is None:  # the file's max_parallel sizes the laptop, not the cluster
            launcher.array_parallelism = launcher.max_parallel if "max_parallel" in cli_launcher \
                else profile.array_parallelism
        launcher.array_parallelism = min(launcher.array_parallelism, profile.array_parallelism)

    base = _base_overrides(f"{path}: base", data.get("base"))
    keys, raw_cells = _expand(path, data.get("matrix"), data.get("include"), data.get("exclude"), launcher.max_cells)
    base_keys = {override_key(b) for b in base}
    matrix_keys = list((data.get("matrix") or {}).keys())
    for k in matrix_keys:
        if override_key(k) in base_keys:
            raise SweepError(f"{path}: key {k!r} is both in base and a matrix axis; keep one "
                             f"(an include entry may override a base value for its cells)")
    for line in cli_cfg:
        if override_key(line) in {override_key(k) for k in keys}:
            raise SweepError(f"{path}: override {line!r} sets the matrix axis {override_key(line)!r}; narrow the "
                             f"axis with --only {line} (values of the matrix), or edit the file's matrix")
    # CLI overrides replace base entries of the same key; the rest are appended.
    cli_keys = {override_key(line) for line in cli_cfg}
    common = [b for b in base if override_key(b) not in cli_keys] + cli_cfg

    matrix_size = len(raw_cells)
    raw_cells = _narrow(path, keys, raw_cells, list(only))
    matrix_index = [i for i, _ in raw_cells]
    raw_cells = [values for _, values in raw_cells]

    def shell(state_dir: str, tracking_uri: str, experiment: str) -> Sweep:
        return Sweep(name=name, path=path, text=text, description=description, launcher=launcher,
                     resources=resources, profile=profile, profile_path=profile_path, axis_keys=keys,
                     cli_overrides=list(overrides), cells=[], state_dir=state_dir, tracking_uri=tracking_uri,
                     experiment=experiment, only=list(only), matrix_size=matrix_size)

    if recorded:  # what the last launch submitted is the truth
        found = _recorded_sweep(name, text, list(overrides), _cell_overrides(common, raw_cells[0]), shell)
        if found is not None:
            return found
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from suite.config import ConfigError, hardware_pins, run_id
    from suite.overrides import with_cause
    from suite.sweep.compose import CellComposer

    composer = CellComposer()
    cells: list[Cell] = []
    seen: dict[str, int] = {}
    for i, values in enumerate(raw_cells):
        ov = _cell_overrides(common, values)
        axis_lines = [f"{k}={v}" for k, v in values.items()]
        shown = " ".join(axis_lines) or "(base only)"
        try:
            cfg = composer.compose(ov)
            if profile is not None and cfg.backend.name == "verl":
                shape = _cluster_shape(ov, cfg, cli_only, profile, launcher.profile)
                if shape:
                    ov = ov + shape
                    cfg = composer.compose(ov)
        except (ConfigError, HydraException, OmegaConfBaseException, ValueError) as exc:
            raise SweepError(f"{path}: cell {i} ({shown}): {with_cause(exc)}") from None
        # Pin the hardware choices resolved here, so a compute node of another type that
        # composes the cell again computes the same numerics (or refuses: suite.hardware).
        ov = ov + [pin for pin in hardware_pins(cfg) if override_key(pin) not in {override_key(x) for x in ov}]
        rid = run_id(cfg)
        if rid in seen:
            j = seen[rid]
            raise SweepError(f"{path}: cell {i} ({shown}) is the same run as cell {j} "
                             f"({' '.join(f'{k}={v}' for k, v in raw_cells[j].items())}): run id {rid}; "
                             f"the keys that differ do not change the run (e.g. threads, tracking.*)")
        seen[rid] = i
        run_dir = os.path.abspath(os.path.join(os.path.expanduser(cfg.out_dir), rid))
        cells.append(Cell(index=matrix_index[i], overrides=ov, axes={k: _unquote(v) for k, v in values.items()},
                          cfg=cfg, run_id=rid, run_dir=run_dir))

    first = cells[0].cfg
    uris = {c.cfg.tracking.tracking_uri for c in cells}
    exps = {c.cfg.tracking.experiment for c in cells}
    if len(uris) > 1 or len(exps) > 1:
        raise SweepError(f"{path}: key tracking.tracking_uri/tracking.experiment: every cell of a sweep must "
                         f"log to one MLflow store and experiment (one parent run); got {sorted(uris)} {sorted(exps)}")
    nodes = resources.nodes or (profile.nodes if profile else 1)
    if nodes > 1:
        bad = [c.index for c in cells if c.cfg.backend.name == "embedded"]
        if bad:
            raise SweepError(f"{path}: cell {bad[0]}: resources.nodes={nodes}: the embedded backend runs on one "
                             f"node; multi-node profiles are for backend=verl")
    resources_note = ""
    if profile is not None and any(c.cfg.backend.name == "verl" for c in cells):
        resources, resources_note = _verl_resources(cells, cli_only, launcher.profile,
                                                    file_has_resources=bool(data.get("resources")))
    state_dir = state_dir_of(first.out_dir, name)
    return Sweep(name=name, path=path, text=text, description=description, launcher=launcher,
                 resources=resources, profile=profile, profile_path=profile_path, axis_keys=keys,
                 cli_overrides=list(overrides), cells=cells, state_dir=state_dir,
                 tracking_uri=first.tracking.tracking_uri, experiment=first.tracking.experiment,
                 resources_note=resources_note, only=list(only), matrix_size=matrix_size)


def _cluster_shape(ov: list[str], cfg, resources: Resources, profile: SlurmProfile, profile_name: str) -> list[str]:
    """The overrides that make a verl cell's Ray cluster the SLURM job's: ``backend.nnodes`` and
    ``backend.n_gpus_per_node`` follow the cluster profile (and the command line's ``resources.nodes`` /
    ``resources.gpus_per_node``: what the SLURM job gets, see :func:`_verl_resources`); a cell that sets
    either to another value is refused, naming both."""
    from omegaconf import OmegaConf

    from suite.config import ConfigError

    nodes = resources.nodes or profile.nodes
    gpus = resources.gpus_per_node if resources.gpus_per_node is not None else profile.gpus_per_node
    if cfg.backend.device == "cuda" and not gpus:
        raise ConfigError(f"cluster={profile_name} has no GPUs (gpus_per_node=0): backend=verl with "
                          f"backend.device=cuda needs a GPU profile, e.g. cluster=h100x8")
    out = []
    for key, want in (("backend.nnodes", nodes), ("backend.n_gpus_per_node", gpus)):
        given = [o for o in ov if override_key(o) == key]
        have = int(OmegaConf.select(cfg, key))
        if given and have != int(want):
            raise ConfigError(f"{given[-1]} contradicts cluster={profile_name} ({want}): the verl run's Ray "
                              f"cluster is the SLURM job's; drop {key} or choose a profile that has {key}={want}")
        if not given and want and have != int(want):
            out.append(f"{key}={int(want)}")
    return out


def _verl_resources(cells: list, cli: Resources, profile_name: str, file_has_resources: bool) -> tuple[Resources, str]:
    """A sweep of verl cells on SLURM: per-job resources are the cluster profile's, then the
    recipe's (the largest over the cells), then the command line's ``resources.*``. The sweep
    file's own ``resources:`` are not used: they size the laptop's embedded cells, and a GPU job
    sized by them (2 CPUs, 60 minutes) would starve verl's workers and never reach a checkpoint."""
    from suite.recipes import recipe_slurm

    merged: dict[str, Any] = {}
    names = sorted({c.cfg.backend.recipe for c in cells if c.cfg.backend.name == "verl" and c.cfg.backend.recipe})
    for name in names:
        for key, value in recipe_slurm(name).items():
            merged[key] = max(merged.get(key, value), value)
    for key, value in asdict(cli).items():
        if value is not None:
            merged[key] = value
    parts = [f"profile {profile_name}"] + [f"recipe {n}" for n in names] + (["the command line"] if any(
        v is not None for v in asdict(cli).values()) else [])
    note = "resources: " + ", then ".join(parts)
    if file_has_resources:
        note += " (the sweep file's resources: size embedded cells and are not used for verl cells)"
    return Resources(**{k: merged.get(k) for k in asdict(Resources())}), note


def _recorded_sweep(name: str, text: str, overrides: list[str], first_overrides: list[str], shell) -> Optional[Sweep]:
    """The sweep as its last launch recorded it, or None when it was never launched. The state
    dir is found from the first cell's out_dir (composed only when an override of it is not plain)."""
    out_dir = out_dir_of(first_overrides)
    if out_dir is None:
        from suite.config import compose_config

        out_dir = compose_config(first_overrides).out_dir
    state_dir = state_dir_of(out_dir, name)
    found = read_record(state_dir)
    if found is None:
        return None
    rec, cells = found
    sweep = shell(state_dir, rec["tracking_uri"], rec["experiment"])
    sweep.cells = cells
    sweep.only = list(rec.get("only") or [])  # what that launch narrowed the matrix to
    if rec.get("launch_hash") != launch_hash(text, overrides):
        try:
            when = time.strftime(" (%Y-%m-%d %H:%M)",
                                 time.localtime(os.path.getmtime(os.path.join(state_dir, "matrix.json"))))
        except OSError:
            when = ""
        launched = " ".join(rec.get("cli_overrides") or []) or "none"
        sweep.launch_note = (f"the sweep file or its overrides changed since the last launch{when}; showing the "
                             f"{len(cells)} cells that launch recorded (its overrides: {launched}; the file it "
                             f"read: {os.path.join(state_dir, 'sweep.yaml')}). "
                             f"`suite sweep` launches the file as it is now")
    return sweep


def _file_hint(path: str) -> str:
    """'; did you mean X?' for a misspelt sweep file: the closest YAML files of its directory (or of the
    suite's experiments/ when that directory does not exist), as a mistyped key gets the closest keys."""
    import difflib

    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return ""
    names = sorted(n for n in os.listdir(folder) if n.endswith((".yaml", ".yml")))
    close = difflib.get_close_matches(os.path.basename(path), names, n=2, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(os.path.join(os.path.dirname(path), c) for c in close) + "?"
    return f"; the sweep files there: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}" if names else ""


def _narrow(path: str, keys: list[str], raw_cells: list[dict[str, str]], only: list[str]) -> list[tuple[int, dict]]:
    """The cells `--only KEY=V1,V2` keeps, each with its index in the full matrix. One key given twice
    (`--only seed=0 --only seed=1`) keeps either value, as `--only seed=0,1` does; different keys keep
    the cells that have one of each key's values."""
    wanted: dict[str, list[str]] = {}
    for item in only:
        key, eq, values = item.partition("=")
        if not eq or not key or not values:
            raise SweepError(f"--only {item!r}: give KEY=VALUE or KEY=V1,V2 (an axis of the matrix: {', '.join(keys)})")
        if key not in keys:
            raise SweepError(f"{path}: --only {item!r}: {key!r} is not an axis of the matrix; its axes: "
                             f"{', '.join(keys)}")
        seen = {_unquote(c[key]) for c in raw_cells if key in c}
        given = [v.strip() for v in values.split(",")]
        unknown = [v for v in given if v not in seen]
        if unknown:
            raise SweepError(f"{path}: --only {item!r}: {key}={unknown[0]} is in no cell; its values: "
                             f"{', '.join(sorted(seen))}")
        wanted.setdefault(key, []).extend(given)
    cells = [(i, c) for i, c in enumerate(raw_cells)
             if all(_unquote(c.get(key, "")) in values for key, values in wanted.items())]
    if not cells:
        raise SweepError(f"{path}: --only {' '.join(only)}: no cell has all of these values")
    return cells


def _cell_overrides(common: list[str], values: dict[str, str]) -> list[str]:
    """A cell's overrides: the common ones (base, then command line) its axes do not set, then its axes."""
    own = {override_key(k) for k in values}
    return [line for line in common if override_key(line) not in own] + [f"{k}={v}" for k, v in values.items()]


def _unquote(v: str) -> str:
    if len(v) >= 2 and v[0] == "'" and v[-1] == "'":
        return v[1:-1].replace("\\'", "'").replace("\\\\", "\\")
    return v
