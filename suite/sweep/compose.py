"""Composition of many cells of one sweep, counting Hydra's work.

`suite.config.compose_config` runs Hydra's first phase (the defaults list the group overrides
choose) once per distinct set of group overrides in a process and applies the other overrides
with OmegaConf (its docstring says how, and when Hydra composes in full instead), so a sweep of a
hundred cells composes in seconds (docs/bench.md, "Measurements behind the code").
`CellComposer` is that compose with a count of the full Hydra composes it caused, for the
benchmark and the tests. tests/sweep/test_compose.py checks it against Hydra's whole compose on
every override form.
"""

from __future__ import annotations

from omegaconf import DictConfig

from suite import config


class CellComposer:
    """Compose configs like `compose_config`, counting the Hydra composes of new group choices."""

    def __init__(self) -> None:
        self.hydra_composes = 0  # how many first-phase Hydra composes ran (for the benchmark)

    def compose(self, overrides: list[str] | tuple[str, ...]) -> DictConfig:
        before = len(config.GROUP_BASES)
        try:
            return config.compose_config(list(overrides))
        finally:
            self.hydra_composes += len(config.GROUP_BASES) - before
