"""`compose_config`'s fast path (one Hydra compose per set of group choices, the rest applied with
OmegaConf's public API; `CellComposer` counts its Hydra composes) gives exactly Hydra's whole
compose (`fast=False`): the same config and the same errors, for every override form a sweep file
or command line can hold."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from suite.config import compose_config
from suite.hydra_compat import config_groups
from suite.sweep.compose import CellComposer

CASES = [
    [],
    ["quant=fp8", "seed=3"],
    ["quant=fp8", "quant.fp8_granularity=block", "uaq.s=1.0"],
    ["algo=dapo", "correction=tis", "correction.tis_cap=4.0", "train.lr=1e-4", "steps=7"],
    ["model=small", "task=word", "task.difficulty=3"],
    ["+tracking.tags.note=hello", "tracking.run_name='a b'"],
    ["++tracking.tags.cell=3", "++seed=5"],  # force-add: a new key and an existing one
    ["train.betas=[0.8,0.95]", "rollout.temperature=1.5", "regime=paper"],
    ["regime=paper", "quant=int8"],
    ["warm_start.flaw_op=none", "warm_start.flaw_prob=0.0", "tracking.tags={a: '1', b: '2'}"],
    ["seed=1", "seed=2"],  # the later wins
    ["~tracking.tags"],  # a delete: Hydra's own path
]


def _plain(cfg):
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("overrides", CASES, ids=lambda ov: " ".join(ov) or "defaults")
@pytest.mark.slow
def test_the_fast_path_composes_what_hydra_composes(overrides):
    try:
        want = compose_config(overrides, fast=False)
    except Exception as exc:  # noqa: BLE001
        with pytest.raises(type(exc)) as got:
            CellComposer().compose(overrides)
        assert str(got.value) == str(exc)
        return
    assert _plain(CellComposer().compose(overrides)) == _plain(want)


@pytest.mark.parametrize("overrides", [["nosuch=1"], ["+steps=3"], ["train.nosuch=2"], ["steps=abc"],
                                       ["quant=nosuch"], ["model.preset=tiny", "+model.extra=1"]])
def test_bad_overrides_fail_with_hydras_own_error(overrides):
    with pytest.raises(Exception) as want:
        compose_config(overrides, fast=False)
    with pytest.raises(type(want.value)) as got:
        CellComposer().compose(overrides)
    assert str(got.value) == str(want.value)


def test_one_hydra_compose_per_set_of_group_choices():
    c = CellComposer()
    for seed in range(5):
        c.compose(["quant=bf16", f"seed={seed}", "steps=3"])
    c.compose(["quant=fp8", "seed=0"])
    assert c.hydra_composes <= 2  # the cache may already hold them from another test


def test_config_groups_from_hydras_loader():
    groups = config_groups()
    assert "hydra" not in groups and groups["algo"] == ["dapo", "grpo", "ppo"]


def test_config_groups_are_listed_again_when_the_config_store_changes():
    """config_groups() asks Hydra once per ConfigStore content: a copy from the cache, and a new
    option stored later is listed."""
    from hydra.core.config_store import ConfigStore

    from suite.config import ModelConfig

    first = config_groups()
    first["model"].append("not-an-option")  # the caller's copy, not the cache
    assert "not-an-option" not in config_groups()["model"]
    repo = ConfigStore.instance().repo
    ConfigStore.instance().store(group="model", name="zz_test_preset", node=ModelConfig(preset="tiny"))
    try:
        assert config_groups()["model"] == [*first["model"][:-1], "zz_test_preset"]
    finally:
        del repo["model"]["zz_test_preset.yaml"]
    assert "zz_test_preset" not in config_groups()["model"]
