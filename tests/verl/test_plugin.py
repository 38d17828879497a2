"""The suite's policy losses in verl's registry equal suite.core.losses (real verl 0.9.1, CPU).

verl hands a registered loss only log pi_prox (old_log_prob) and its rollout-IS weights; the
weights here are made by verl's own ``compute_rollout_correction_weights`` with the translator's
settings (token level, threshold 1e9), exactly as in a verl run.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")
pytestmark = pytest.mark.verl

from suite.core.losses import policy_loss  # noqa: E402
from suite.core.metrics import mismatch_ratio_metrics, policy_ratio_metrics  # noqa: E402
from suite.verl.translate import NEVER_TRUNCATE, loss_env  # noqa: E402

MODES = {"acr": "acr", "tbpo": "tbpo"}  # verl registry name -> suite.core.losses mode


@pytest.fixture(scope="module")
def verl_api():
    import verl  # noqa: F401  (loads the suite plugin through the verl.plugins entry point)
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.workers.config import FSDPActorConfig

    return POLICY_LOSS_REGISTRY, get_policy_loss_fn, compute_rollout_correction_weights, FSDPActorConfig


@pytest.fixture
def loss_env_vars(monkeypatch):
    from suite.config import compose_config

    import json

    params = {}
    for mode in MODES.values():  # the translator's JSON for each plugin mode, merged: one env serves both
        cfg = compose_config([f"correction={mode}", "correction.tis_cap=1.5", "correction.tbpo_delta_pos=0.01",
                              "correction.tbpo_delta_neg_low=0.01", "correction.tbpo_delta_neg_high=0.03"])
        params.update(json.loads(loss_env(cfg)["SUITE_LOSS_PARAMS"]))
    monkeypatch.setenv("SUITE_LOSS_PARAMS", json.dumps(params))
    return cfg


def _batch(seed: int, B: int = 6, T: int = 9):
    g = torch.Generator().manual_seed(seed)
    prox = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3  # log pi_prox  [B, T]
    # log pi_behav: r spread over both sides of 1
    behav = prox + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    logp = prox + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)  # log pi_theta
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()  # outcome advantages [B, T]
    adv[0] = -adv[0].abs()  # at least one negative and one positive sequence
    adv[1] = adv[1].abs()
    lengths = torch.tensor([T, T - 2, 3, T, 1, T - 4])[:B]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)  # [B, T] right-padded
    return logp, prox, behav, adv, mask


def _actor_config(FSDPActorConfig, clip_c: float, agg: str):
    return FSDPActorConfig(strategy="fsdp", rollout_n=4, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1,
                           clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=clip_c, loss_agg_mode=agg)


def test_registered_after_import_verl(verl_api):
    from suite.verl.plugin import plugin_modes

    registry, *_ = verl_api
    assert plugin_modes() == tuple(MODES)  # derived from the correction registry
    for name in MODES:
        assert name in registry, f"{name} missing from verl's POLICY_LOSS_REGISTRY: {sorted(registry)}"


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("verl_name", list(MODES))
@pytest.mark.parametrize("seed", [0, 1])
def test_registry_equals_core_losses(verl_api, loss_env_vars, verl_name, agg, seed):
    _, get_fn, rc_weights, FSDPActorConfig = verl_api
    cfg = loss_env_vars
    logp, prox, behav, adv, mask = _batch(seed)
    logp = logp.clone().requires_grad_(True)
    weights, _ = rc_weights(prox - behav, mask, rollout_is="token", rollout_is_threshold=NEVER_TRUNCATE)
    actor = _actor_config(FSDPActorConfig, 3.0, agg)
    loss, stats = get_fn(verl_name)(prox, logp, adv, mask, loss_agg_mode=agg, config=actor, rollout_is_weights=weights)
    (grad,) = torch.autograd.grad(loss, logp)

    logp2 = logp.detach().clone().requires_grad_(True)
    c = cfg.correction
    ref, ref_stats = policy_loss(
        logp2, prox, behav, adv, mask, mode=MODES[verl_name], clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg=agg,
        tis_cap=c.tis_cap, tbpo_delta_pos=c.tbpo_delta_pos, tbpo_delta_neg_low=c.tbpo_delta_neg_low,
        tbpo_delta_neg_high=c.tbpo_delta_neg_high, tbpo_seq_cap=c.tbpo_seq_cap,
    )
    (ref_grad,) = torch.autograd.grad(ref, logp2)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, ref_grad)
    # the loss's stats, plus the r and R token quantiles over the same valid tokens
    ratio_stats = {**mismatch_ratio_metrics(prox, behav, mask), **policy_ratio_metrics(logp, prox, mask)}
    assert stats.keys() == ref_stats.keys() | ratio_stats.keys()
    for k, v in {**ref_stats, **ratio_stats}.items():
        assert stats[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    valid = mask.bool()
    r_valid = torch.exp(prox - behav)[valid]  # independent reference: torch.quantile on the valid tokens
    for name, q in (("p1", 0.01), ("p50", 0.5), ("p99", 0.99)):
        assert stats[f"rollout_corr/ratio_{name}"] == pytest.approx(float(torch.quantile(r_valid, q)), rel=1e-9), name
        R_valid = torch.exp(logp.detach() - prox)[valid]
        assert stats[f"actor/ratio_{name}"] == pytest.approx(float(torch.quantile(R_valid, q)), rel=1e-9), name
    assert stats["rollout_corr/ratio_frac_above_2"] == pytest.approx(float((r_valid > 2).double().mean()), rel=1e-12)
    assert stats["rollout_corr/ratio_frac_below_0.5"] == pytest.approx(float((r_valid < 0.5).double().mean()),
                                                                      rel=1e-12)
    # the batch exercises the modes: clipping and (for acr) both sides of r = 1 occur
    assert ref_stats["actor/pg_clipfrac"] > 0
    if verl_name == "acr":
        assert (0 < ref_stats["actor/acr_relaxed_frac"] < 1
                and ref_stats["rollout_corr/rollout_is_ratio_fraction_high"] > 0)


def test_tis_translation_is_verl_vanilla(verl_api):
    """correction=tis runs verl's own vanilla loss with rollout_is=token, threshold C: equal to ours."""
    _, get_fn, rc_weights, FSDPActorConfig = verl_api
    logp, prox, behav, adv, mask = _batch(3)
    weights, _ = rc_weights(prox - behav, mask, rollout_is="token", rollout_is_threshold=2.0)
    actor = _actor_config(FSDPActorConfig, 3.0, "token-mean")
    loss, _ = get_fn("vanilla")(prox, logp, adv, mask, loss_agg_mode="token-mean", config=actor,
                                rollout_is_weights=weights)
    ref, _ = policy_loss(logp, prox, behav, adv, mask, mode="tis", clip_low=0.2, clip_high=0.28, dual_clip=3.0,
                         tis_cap=2.0)
    torch.testing.assert_close(loss, ref)


def test_data_parallel_scaling_matches_verl(verl_api, loss_env_vars):
    """Under dp > 1 verl normalises by global counts; with r = 1 ACR is verl's vanilla, so the two agree."""
    _, get_fn, rc_weights, FSDPActorConfig = verl_api
    logp, prox, _, adv, mask = _batch(4)
    weights, _ = rc_weights(torch.zeros_like(prox), mask, rollout_is="token", rollout_is_threshold=NEVER_TRUNCATE)
    for agg, info in (("token-mean", {"dp_size": 4, "batch_num_tokens": 3 * int(mask.sum())}),
                      ("seq-mean-token-mean", {"dp_size": 2, "global_batch_size": 15})):
        actor = _actor_config(FSDPActorConfig, 3.0, agg)
        actor.global_batch_info.update(info)
        ours, _ = get_fn("acr")(prox, logp, adv, mask, loss_agg_mode=agg, config=actor, rollout_is_weights=weights)
        theirs, _ = get_fn("vanilla")(prox, logp, adv, mask, loss_agg_mode=agg, config=actor, rollout_is_weights=None)
        torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-6, atol=1e-12)  # verl adds 1e-8 to seq lengths
        assert float(ours) != pytest.approx(float(policy_loss(logp, prox, prox, adv, mask, mode="acr", clip_low=0.2,
                                                              clip_high=0.28, dual_clip=3.0,
                                                              agg=agg)[0]))  # the scaling did something


def test_missing_weights_or_env_is_a_clear_error(verl_api, monkeypatch):
    _, get_fn, _, FSDPActorConfig = verl_api
    logp, prox, behav, adv, mask = _batch(5)
    actor = _actor_config(FSDPActorConfig, 3.0, "token-mean")
    with pytest.raises(RuntimeError, match="rollout_is=token"):
        get_fn("acr")(prox, logp, adv, mask, config=actor, rollout_is_weights=None)
    monkeypatch.delenv("SUITE_LOSS_PARAMS", raising=False)
    with pytest.raises(RuntimeError, match="SUITE_LOSS_PARAMS"):
        get_fn("acr")(prox, logp, adv, mask, config=actor, rollout_is_weights=torch.ones_like(prox))
    monkeypatch.setenv("SUITE_LOSS_PARAMS", '{"tbpo_seq_cap": 2.0}')
    with pytest.raises(RuntimeError, match="lacks tis_cap"):
        get_fn("acr")(prox, logp, adv, mask, config=actor, rollout_is_weights=torch.ones_like(prox))


def test_naive_translation_is_verl_vanilla_without_weights(verl_api):
    """correction=naive runs verl's stock vanilla loss on the recomputed old log-probs (pi_prox), no
    rollout IS weight: equal to the core's naive, which ignores pi_behav."""
    _, get_fn, _, FSDPActorConfig = verl_api
    logp, prox, behav, adv, mask = _batch(6)
    for agg in ("token-mean", "seq-mean-token-mean"):
        actor = _actor_config(FSDPActorConfig, 3.0, agg)
        theirs, _ = get_fn("vanilla")(prox, logp, adv, mask, loss_agg_mode=agg, config=actor, rollout_is_weights=None)
        ours, _ = policy_loss(logp, prox, behav, adv, mask, mode="naive", clip_low=0.2, clip_high=0.28, dual_clip=3.0,
                              agg=agg)
        torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-6, atol=1e-12)  # verl adds 1e-8 to seq lengths


def test_bypass_translation_is_verl_bypass_mode(verl_api):
    """correction=bypass runs verl's bypass mode (old log-prob := rollout log-prob, PPO clip): verl's
    own compute_policy_loss_bypass_mode on pi_behav equals the core's bypass."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.workers.config.actor import PolicyLossConfig

    _, get_fn, _, FSDPActorConfig = verl_api
    logp, prox, behav, adv, mask = _batch(7)
    rc = RolloutCorrectionConfig(rollout_is=None, bypass_mode=True, loss_type="ppo_clip")
    actor = FSDPActorConfig(strategy="fsdp", rollout_n=4, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1,
                            clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean",
                            policy_loss=PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=rc))
    theirs, _ = get_fn("bypass_mode")(behav, logp, adv, mask, loss_agg_mode="token-mean", config=actor,
                                      rollout_is_weights=None)
    ours, _ = policy_loss(logp, prox, behav, adv, mask, mode="bypass", clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    torch.testing.assert_close(ours, theirs.to(ours.dtype))
    naive, _ = policy_loss(logp, prox, behav, adv, mask, mode="naive", clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert not torch.allclose(naive, ours)  # the batch tells the two anchors apart
