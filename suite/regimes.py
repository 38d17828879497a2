"""Regimes: named, documented presets of the settings that set the size of the rollout mismatch.

A regime is Hydra's "configuring experiments" pattern (https://hydra.cc/docs/patterns/configuring_experiments/):
a `_global_` config chosen with `regime=NAME` that changes a group's default choice and a few
values. Everything given on the command line still wins (`regime=paper quant=int8` rolls out in
INT8), and the composed config holds the resolved values only, so a run composed through a
regime has the same run id as one given the same values by hand.

`paper` was found by measurement (analysis/results/regime/README.md): the smallest change to
the default run whose median `rollout_corr/k3_kl` over the first RL steps reaches QuRL's 0.002.
INT8 W8A8 does not reach it on the embedded models at any temperature that still samples sensible
answers (docs/bench.md, "Measurements behind the code"), so the regime's precision is W4A16 (QaRL's),
standing in for the papers' INT8 mismatch; the studies label it so.

The level it reaches depends on the CPU kind (docs/architecture.md, "CPU kinds"): the search ran
on an AVX-512 VNNI/BF16 EPYC (native bf16); on an AVX2-only EPYC (bf16 emulated) and on an AMX
Xeon the same command stays below the papers' 0.002 (docs/bench.md, "Measurements behind the
code"). The preset keeps one definition on every kind,
so a run id means the same settings everywhere; each run records its measured k3 and `cpu_flags`.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

# name -> (group choices it overrides, values it sets); every key is an existing config field.
REGIMES: dict[str, tuple[dict[str, str], dict[str, dict]]] = {
    "paper": ({"quant": "w4a16"}, {"rollout": {"temperature": 1.5}}),
}


def register(cs: ConfigStore) -> None:
    """Store each regime as `regime/<name>` in the ConfigStore (package `_global_`)."""
    for name, (groups, values) in REGIMES.items():
        defaults = [{f"override /{g}": choice} for g, choice in groups.items()] + ["_self_"]
        cs.store(group="regime", name=name, package="_global_", node={"defaults": defaults, **values})
