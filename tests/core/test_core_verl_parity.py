"""Parity with verl 0.9.1 (installed CPU-only as the project's `verl` extra): same inputs, same numbers.

verl is a required part of the test environment in CI, so it is imported directly: a
missing verl is a failure, never a skip.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics
from verl.utils import torch_functional as verl_F
from verl.workers.config import ActorConfig

from suite.core.advantages import gae_advantages, grpo_advantages, kl_k1, kl_k2, kl_k3
from suite.core.losses import AGG_MODES, agg_loss, entropy_from_logits, policy_loss, value_loss
from suite.core.metrics import rollout_corr_metrics

pytestmark = pytest.mark.verl

NO_DUAL = 1e12  # verl always applies its dual clip; a huge clip_ratio_c switches it off


def _actor_config(clip_low: float, clip_high: float, clip_c: float) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=clip_low, clip_ratio_high=clip_high, clip_ratio_c=clip_c,
    )


def _batch(seed: int, B: int = 6, T: int = 9, mismatch: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    behav = -torch.rand(B, T, generator=g) * 3
    prox = behav + mismatch * torch.randn(B, T, generator=g)
    logp = prox + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    return logp, prox, behav, adv, mask


policy_cases = dict(
    seed=st.integers(0, 2**31 - 1),
    agg=st.sampled_from(AGG_MODES),
    clip_low=st.floats(0.05, 0.4),
    clip_high=st.floats(0.05, 0.4),
    dual=st.sampled_from([None, 3.0, 1.5]),
)


@settings(max_examples=20, deadline=None)
@given(**policy_cases)
def test_ppo_equals_compute_policy_loss_vanilla(seed, agg, clip_low, clip_high, dual) -> None:
    logp, prox, _, adv, mask = _batch(seed)
    cfg = _actor_config(clip_low, clip_high, NO_DUAL if dual is None else dual)
    ref, ref_stats = core_algos.compute_policy_loss_vanilla(prox, logp, adv, mask.float(), agg, cfg)
    loss, stats = policy_loss(
        logp, prox, None, adv, mask, mode="naive", clip_low=clip_low, clip_high=clip_high, dual_clip=dual, agg=agg
    )
    torch.testing.assert_close(loss, ref)
    for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert stats[k] == pytest.approx(ref_stats[k], rel=1e-5, abs=1e-7), k


@settings(max_examples=20, deadline=None)
@given(cap=st.floats(1.0, 8.0), **policy_cases)
def test_tis_equals_vanilla_with_truncated_is_weights(seed, agg, clip_low, clip_high, dual, cap) -> None:
    logp, prox, behav, adv, mask = _batch(seed)
    cfg = _actor_config(clip_low, clip_high, NO_DUAL if dual is None else dual)
    w = torch.exp(prox - behav).clamp(max=cap)  # FlashRL TIS: min(pi_prox / pi_behav, C)
    ref, _ = core_algos.compute_policy_loss_vanilla(prox, logp, adv, mask.float(), agg, cfg, rollout_is_weights=w)
    loss, _ = policy_loss(
        logp, prox, behav, adv, mask, mode="tis", clip_low=clip_low, clip_high=clip_high,
        tis_cap=cap, dual_clip=dual, agg=agg,
    )
    torch.testing.assert_close(loss, ref)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_agg_loss_equals_verl(agg: str) -> None:
    _, _, _, loss_mat, mask = _batch(3)
    mask[2] = False  # a fully masked sequence is excluded from the seq means by both
    torch.testing.assert_close(agg_loss(loss_mat, mask, agg), core_algos.agg_loss(loss_mat, mask.float(), agg))


@pytest.mark.parametrize("agg", AGG_MODES)
def test_value_loss_equals_verl(agg: str) -> None:
    vpred, old, ret, _, mask = _batch(4)
    ref, ref_clip = core_algos.compute_value_loss(vpred, ret, old, mask.float(), cliprange_value=0.2, loss_agg_mode=agg)
    loss, stats = value_loss(vpred, old, ret, mask, clip_range_value=0.2, agg=agg)
    torch.testing.assert_close(loss, ref)
    assert stats["critic/vf_clipfrac"] == pytest.approx(ref_clip.item(), rel=1e-6)


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_equals_compute_grpo_outcome_advantage(norm_by_std: bool) -> None:
    g = torch.Generator().manual_seed(5)
    B, T = 13, 7
    index = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 4 + ["solo"], dtype=object)  # incl. a singleton
    scores = torch.randint(0, 2, (B,), generator=g).float() + 0.1 * torch.randn(B, generator=g)
    scores[4:8] = 1.0  # a group with zero std
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # [B, T]
    token_rewards = torch.zeros(B, T)
    token_rewards[torch.arange(B), lengths - 1] = scores  # outcome reward on the last token
    ref, _ = core_algos.compute_grpo_outcome_advantage(
        token_rewards, mask.float(), index, norm_adv_by_std_in_grpo=norm_by_std
    )
    ours = grpo_advantages(scores, list(index), mask, norm_by_std=norm_by_std)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("whiten", [True, False])
def test_gae_equals_compute_gae_advantage_return(whiten: bool) -> None:
    g = torch.Generator().manual_seed(6)
    B, T = 5, 11
    rewards, values = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()  # holes (e.g. observation tokens)
    mask[0, 6:] = 0  # and right padding
    ref_adv, ref_ret = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma=0.99, lam=0.95)
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.99, lam=0.95, whiten=whiten)
    torch.testing.assert_close(ret, ref_ret)
    if whiten:  # verl always whitens
        torch.testing.assert_close(adv, ref_adv)
    else:
        torch.testing.assert_close(adv, ref_ret - values)


def test_kl_estimators_equal_kl_penalty() -> None:
    g = torch.Generator().manual_seed(7)
    logp = -torch.rand(4, 50, generator=g) * 5
    ref = logp + torch.randn(4, 50, generator=g) * 3
    ref[0, :5] = logp[0, :5] + torch.tensor([25.0, -25.0, 12.0, -12.0, 0.0])  # hit both clamps
    torch.testing.assert_close(kl_k3(logp, ref), core_algos.kl_penalty(logp, ref, "low_var_kl"))
    torch.testing.assert_close(kl_k1(logp, ref), core_algos.kl_penalty(logp, ref, "k1"))
    torch.testing.assert_close(kl_k2(logp, ref), core_algos.kl_penalty(logp, ref, "k2"))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), mismatch=st.sampled_from([0.0, 0.01, 0.5]))
def test_rollout_corr_equals_compute_offpolicy_metrics(seed: int, mismatch: float) -> None:
    _, prox, behav, _, mask = _batch(seed, mismatch=mismatch)
    ref = compute_offpolicy_metrics(prox, behav, mask.float())
    ours = rollout_corr_metrics(prox, behav, mask)
    assert set(ours) == {f"rollout_corr/{k}" for k in ref}
    for k, v in ref.items():
        assert ours[f"rollout_corr/{k}"] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def test_entropy_equals_verl() -> None:
    logits = torch.randn(3, 4, 23, generator=torch.Generator().manual_seed(8)) * 4
    torch.testing.assert_close(entropy_from_logits(logits), verl_F.entropy_from_logits(logits))
