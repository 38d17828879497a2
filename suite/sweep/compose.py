"""Fast, exact composition of many cells of one sweep.

`suite.config.compose_config` runs Hydra's whole compose (defaults list, ConfigStore lookups,
schema merges) for every call, which is slow enough that a large sweep would take minutes to
validate (docs/bench.md, "Measurements behind the code"). Hydra's own pipeline is two phases:

1. group overrides (``quant=fp8``, ``algo=dapo``) choose the defaults list and are merged;
2. every other override is applied to the merged config, in order (Hydra's docs,
   "Basic Override syntax": ``key=value`` changes a key that exists, ``+key=value`` adds one that
   does not, ``++key=value`` sets it either way).

`CellComposer` runs phase 1 through Hydra's public `compose` once per distinct set of group
overrides (a sweep has few), copies that config (through pickle), and runs phase 2 with
OmegaConf's public `OmegaConf.update` (what those three forms mean: `merge=True`, `force_add`
for the two adding forms); then the same post-processing and `validate` as `compose_config`.
Anything else (a delete ``~key``, sweep syntax ``a=1,2``, ``hydra.*`` keys, a parse error, an
override OmegaConf refuses, ``+key`` over an existing key) goes through `compose_config` itself,
so its result and errors are Hydra's. tests/sweep/test_compose.py checks equality with
`compose_config` on every form.
"""

from __future__ import annotations

import pickle

from hydra.errors import HydraException
from omegaconf import DictConfig

from suite.config import check_override_types, compose_config, finalize


def _hydra_compose(overrides: list[str]) -> DictConfig:
    """`compose_config` without its post-processing and validation (phase 1 + 2 by Hydra)."""
    from hydra import compose, initialize
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize(version_base="1.3", config_path=None, job_name="suite"):
        cfg = compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()
    return cfg


# Hydra's result per tuple of group overrides; the ConfigStore never changes in a process.
_BASE_CACHE: dict[tuple[str, ...], bytes] = {}
_PARSED: dict = {}  # override line -> hydra Override
_PARSER: list = []  # Hydra's override parser, made on first use


def parse_override(line: str):
    """Hydra's parse of one override line (its Override), each distinct line parsed once per
    process: the cells of a sweep share most lines, and Override objects are read-only for
    Hydra's apply step. Raises Hydra's parse error."""
    o = _PARSED.get(line)
    if o is None:
        if not _PARSER:
            from hydra.core.override_parser.overrides_parser import OverridesParser

            _PARSER.append(OverridesParser.create())
        o = _PARSED[line] = _PARSER[0].parse_overrides([line])[0]
    return o


class CellComposer:
    """Compose configs like `compose_config`, caching Hydra's work per set of group choices."""

    def __init__(self) -> None:
        from suite.hydra_compat import config_groups

        self._groups = set(config_groups())
        self._base = _BASE_CACHE  # shared: the ConfigStore is fixed for the process
        self.hydra_composes = 0  # how many full Hydra composes ran (for the benchmark)

    def compose(self, overrides: list[str] | tuple[str, ...]) -> DictConfig:
        overrides = list(overrides)
        try:
            parsed = [parse_override(line) for line in overrides]
        except Exception:  # noqa: BLE001 - let compose_config raise Hydra's own message
            return compose_config(overrides)
        group_lines: list[str] = []
        value_overrides = []
        for o in parsed:
            if o.is_sweep_override() or o.is_hydra_override() or o.is_delete() or o.package is not None:
                return compose_config(overrides)  # Hydra rejects or handles these itself
            value = o.value()
            if o.key_or_group in self._groups and not isinstance(value, dict):
                group_lines.append(o.input_line)
            else:
                value_overrides.append(o)
        key = tuple(group_lines)
        base = self._base.get(key)
        if base is None:
            # kept pickled: unpickling a DictConfig (types, struct flag and all) is faster than
            # copy.deepcopy of it (docs/bench.md, "Measurements behind the code")
            try:
                composed = _hydra_compose(group_lines)
            except HydraException:  # an unknown option: compose_config raises it with the closest options
                return compose_config(overrides)
            base = pickle.dumps(composed)
            self.hydra_composes += 1
            self._base[key] = base
        cfg = pickle.loads(base)
        if not apply_value_overrides(cfg, value_overrides):
            return compose_config(overrides)
        check_override_types(cfg, value_overrides)
        return finalize(cfg)  # the same post-processing as compose_config


def apply_value_overrides(cfg: DictConfig, parsed: list) -> bool:
    """Apply parsed `key=value`, `+key=value` and `++key=value` overrides to `cfg` in order, with
    OmegaConf's public API; False (cfg then half-changed: discard it) when one needs Hydra's own
    handling or error: `+key` over an existing value, or a value OmegaConf refuses."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for o in parsed:
        key, value = o.key_or_group, o.value()
        try:
            if o.is_add():
                if (OmegaConf.select(cfg, key, throw_on_missing=False) is not None
                        and not isinstance(value, (dict, list))):
                    return False
                OmegaConf.update(cfg, key, value, merge=True, force_add=True)
            elif o.is_force_add():
                OmegaConf.update(cfg, key, value, merge=True, force_add=True)
            else:
                OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException:
            return False
    return True

