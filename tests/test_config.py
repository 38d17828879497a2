"""The typed config: group options, overrides, validation errors, run ids."""

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from suite.config import ALGOS, CORRECTIONS, PRECISIONS, ConfigError, axes, compose_config, run_id


def test_defaults_are_the_papers_default_experiment():
    cfg = compose_config([])
    assert (cfg.quant.precision, cfg.correction.mode, cfg.uaq.s, cfg.algo.name) == ("int8", "acr", 1.5, "grpo")
    assert cfg.model.preset == "tiny" and cfg.warm_start.steps == 600 and cfg.warm_start.flaw_op == "auto"
    assert cfg.rollout.prompts_per_step * cfg.algo.group_size == 64
    assert cfg.rollout.max_new_tokens == 32 and cfg.steps == 150


def test_group_options_override_dataclass_defaults():
    cfg = compose_config(["algo=dapo"])
    # DAPO clip-higher / dynamic sampling / overlong shaping (arXiv 2503.14476).
    assert cfg.algo.name == "dapo" and cfg.algo.clip_high == 0.28 and cfg.algo.clip_low == 0.2
    assert cfg.algo.dynamic_sampling and cfg.algo.overlong_buffer > 0 and cfg.algo.agg == "token-mean"
    assert compose_config(["algo=ppo"]).algo.name == "ppo"
    cfg = compose_config(["quant=fp8", "quant.fp8_granularity=block", "correction=tis", "correction.tis_cap=8"])
    assert (cfg.quant.precision, cfg.quant.fp8_granularity, cfg.correction.mode, cfg.correction.tis_cap) == (
        "fp8", "block", "tis", 8.0)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("algo", ALGOS)
def test_every_cell_of_the_matrix_composes_or_is_rejected_by_rule(precision, correction, algo):
    overrides = [f"quant={precision}", f"correction={correction}", f"algo={algo}"]
    if correction == "tbpo" and algo == "ppo":
        with pytest.raises(ConfigError, match="correction.mode"):
            compose_config(overrides)
        return
    cfg = compose_config(overrides)
    assert axes(cfg)["precision"] == precision and axes(cfg)["correction"] == correction and axes(cfg)["algo"] == algo


def test_unknown_group_option_lists_the_options():
    with pytest.raises(HydraException) as err:
        compose_config(["quant=int9"])
    for option in PRECISIONS:
        assert option in str(err.value)


def test_unknown_key_is_rejected_at_compose_time():
    with pytest.raises(HydraException, match="uaq.scale"):
        compose_config(["uaq.scale=1.5"])


def test_type_error_names_the_key():
    with pytest.raises(HydraException) as err:
        compose_config(["train.lr=fast"])
    cause = err.value.__cause__
    assert isinstance(cause, OmegaConfBaseException) and "train.lr" in str(cause)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["algo.agg=mean"], "algo.agg"),
        (["uaq.s=0"], "uaq.s"),
        (["uaq.s=-1.5"], "uaq.s"),
        (["uaq.s=inf"], "uaq.s"),
        (["uaq.group_lr_s=0"], "uaq.group_lr_s"),
        (["uaq.group_lr_s=nan"], "uaq.group_lr_s"),
        (["uaq.s=1.5", "uaq.group_lr_s=1.5"], "uaq.group_lr_s"),
        (["quant.kernels=fast"], "quant.kernels"),
        (["quant.bf16_kernels=fast"], "quant.bf16_kernels"),
        (["quant.fp8_granularity=row"], "quant.fp8_granularity"),
        (["algo.group_size=1"], "algo.group_size"),
        (["train.minibatches=3"], "train.minibatches"),
        (["correction=tbpo", "algo=ppo"], "correction.mode"),
        (["quant=fp32", "correction.aligned_forward=true"], "correction.aligned_forward"),
        (["algo=ppo", "algo.dynamic_sampling=true"], "algo.dynamic_sampling"),
        (["algo.overlong_buffer=32"], "algo.overlong_buffer"),
        (["rollout.temperature=0"], "rollout.temperature"),
        (["task.difficulty=9"], "task.difficulty"),
        (["algo.clip_low=1.0"], "algo.clip_low"),
        (["task.eval_samples=-1"], "task.eval_samples"),
        (["task.eval_samples=1"], "task.eval_samples"),
    ],
)
def test_bad_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        compose_config(overrides)
    assert str(err.value).startswith(key)


def test_choice_error_lists_allowed_values():
    with pytest.raises(ConfigError) as err:
        compose_config(["algo.agg=mean"])
    assert "token-mean, seq-mean-token-mean, seq-mean-token-sum" in str(err.value)


def test_run_id_is_deterministic_and_semantic():
    base = run_id(compose_config([]))
    assert base == run_id(compose_config([]))
    assert base.startswith("grpo-int8-acr-s1.5-arith-seed0-")
    # Where results go does not change what is computed.
    assert base == run_id(compose_config(["out_dir=/elsewhere", "tracking.experiment=x", "threads=2"]))
    others = {run_id(compose_config(o)) for o in (["seed=1"], ["uaq.s=1.25"], ["train.lr=1e-3"], ["quant=fp8"])}
    assert base not in others and len(others) == 4
