"""suite.core.losses: hand-computed objectives for every mode, aggregation, properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from suite.core.losses import (
    AGG_MODES,
    agg_loss,
    entropy_from_logits,
    masked_mean,
    policy_loss,
    value_loss,
)

D = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=D)


def logs(x) -> torch.Tensor:
    return torch.log(t(x))


# ----------------------------------------------------------------------------- aggregation


def test_agg_loss_hand() -> None:
    loss = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)  # row 2 empty
    torch.testing.assert_close(agg_loss(loss, mask, "token-mean"), t(10.0 / 4))
    torch.testing.assert_close(agg_loss(loss, mask, "seq-mean-token-mean"), t((2.0 + 4.0) / 2))
    torch.testing.assert_close(agg_loss(loss, mask, "seq-mean-token-sum"), t((6.0 + 4.0) / 2))


def test_agg_and_masked_mean_ignore_non_finite_padding() -> None:
    loss = t([[1.0, float("inf")], [3.0, float("nan")]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=D)
    for agg in AGG_MODES:
        torch.testing.assert_close(agg_loss(loss, mask, agg), t(2.0))
    torch.testing.assert_close(masked_mean(loss, mask, dim=-1), t([1.0, 3.0]))
    assert masked_mean(loss, torch.zeros_like(mask)).item() == 0.0  # empty mask: 0, not NaN


def test_unknown_mode_and_agg_list_allowed_values() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="token-mean.*seq-mean-token-mean"):
        agg_loss(x, x.bool(), "sum")
    with pytest.raises(ValueError, match="naive.*bypass.*tis.*acr.*tbpo"):
        policy_loss(x, x, x, x, x.bool(), mode="grpo")
    with pytest.raises(ValueError, match="token-mean"):
        policy_loss(x, x, x, x, x.bool(), mode="naive", agg="token-sum")


# ----------------------------------------------------------------------------- token modes


def _ppo_case():
    # R = [1.5, 0.5, 1.1, 0.7], A = [+1, -1, +2, +1], eps = 0.2:
    #   t0: min(1.5, 1.2) * 1 = 1.2   (upper bound binds)
    #   t1: min(-0.5, -0.8) = -0.8    (lower bound binds)
    #   t2: min(2.2, 2.2) = 2.2
    #   t3: min(0.7, 0.8) = 0.7       (lower bound does not bind for A > 0)
    prox = t([[-1.0, -2.0, -0.5, -3.0]])
    logp = prox + logs([[1.5, 0.5, 1.1, 0.7]])
    adv = t([[1.0, -1.0, 2.0, 1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    return logp, prox, adv, mask


def test_ppo_hand() -> None:
    logp, prox, adv, mask = _ppo_case()
    loss, stats = policy_loss(logp, prox, None, adv, mask, mode="naive")
    torch.testing.assert_close(loss, t(-(1.2 - 0.8 + 2.2 + 0.7) / 4))
    assert stats["actor/pg_clipfrac"] == 0.5
    assert stats["actor/pg_clipfrac_high_bound"] == 0.25
    assert stats["actor/pg_clipfrac_low_bound"] == 0.25
    assert stats["actor/pg_clipfrac_lower"] == 0.0
    assert math.isclose(stats["actor/ppo_kl"], -math.log(1.5 * 0.5 * 1.1 * 0.7) / 4, rel_tol=1e-12)


def test_ppo_gradient_zero_where_clipped() -> None:
    logp, prox, adv, mask = _ppo_case()
    logp = logp.clone().requires_grad_(True)
    policy_loss(logp, prox, None, adv, mask, mode="naive")[0].backward()
    # d(-A R / 4)/d logp = -A R / 4 where unclipped; 0 where clipped
    torch.testing.assert_close(logp.grad, t([[0.0, 0.0, -2.0 * 1.1 / 4, -0.7 / 4]]))


def test_dual_clip_hand() -> None:
    # A = -1, R = 4: PPO loss is 4 (min(-4, -1.2) = -4); dual clip c = 3 caps it at 3.
    prox = t([[-1.0, -1.0]])
    logp = prox + logs([[4.0, 2.0]])
    adv = t([[-1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = policy_loss(logp, prox, None, adv, mask, mode="naive", dual_clip=3.0)
    torch.testing.assert_close(loss, t((3.0 + 2.0) / 2))
    assert stats["actor/pg_clipfrac_lower"] == 0.5
    loss_off, _ = policy_loss(logp, prox, None, adv, mask, mode="naive")
    torch.testing.assert_close(loss_off, t((4.0 + 2.0) / 2))
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, prox, None, adv, mask, mode="naive", dual_clip=0.9)


def test_bypass_uses_behav_as_anchor() -> None:
    logp, prox, adv, mask = _ppo_case()
    # bypass ignores prox: the same numbers as naive with behav in prox's place
    loss, stats = policy_loss(logp, None, prox, adv, mask, mode="bypass")
    torch.testing.assert_close(loss, t(-(1.2 - 0.8 + 2.2 + 0.7) / 4))
    assert stats["actor/pg_clipfrac"] == 0.5
    with pytest.raises(ValueError, match="behav_logp"):
        policy_loss(logp, prox, None, adv, mask, mode="bypass")


def test_naive_is_ppo_against_prox_and_ignores_behav() -> None:
    """The papers' baseline: the clip anchor is the recomputed full-precision pi_prox; whatever the
    quantized sampler's log-probs were, the loss and its gradient do not change."""
    logp, prox, adv, mask = _ppo_case()
    logp = logp.clone().requires_grad_(True)
    behav_far = prox + t([[2.0, -3.0, 0.7, 1.5]])  # a sampler far from prox
    losses, grads = [], []
    for behav in (None, prox.clone(), behav_far):
        loss, stats = policy_loss(logp, prox, behav, adv, mask, mode="naive")
        (g,) = torch.autograd.grad(loss, logp)
        losses.append(loss)
        grads.append(g)
        assert stats["actor/pg_clipfrac"] == 0.5 and "rollout_corr/rollout_is_mean" not in stats
    for loss, g in zip(losses, grads):
        torch.testing.assert_close(loss, t(-(1.2 - 0.8 + 2.2 + 0.7) / 4))  # hand value of _ppo_case
        torch.testing.assert_close(g, t([[0.0, 0.0, -2.0 * 1.1 / 4, -0.7 / 4]]))


def test_bypass_is_ppo_against_behav_and_ignores_prox() -> None:
    """verl's bypass mode: R' = pi_theta / pi_behav. With logp = behav + log R' the hand values of
    _ppo_case come back whatever prox is; with prox in the anchor's place they would not."""
    logp, behav, adv, mask = _ppo_case()
    other_prox = behav + t([[0.3, -0.3, 0.2, 0.1]])
    for prox in (None, other_prox):
        loss, _ = policy_loss(logp, prox, behav, adv, mask, mode="bypass")
        torch.testing.assert_close(loss, t(-(1.2 - 0.8 + 2.2 + 0.7) / 4))
    naive, _ = policy_loss(logp, other_prox, behav, adv, mask, mode="naive")
    assert not torch.allclose(naive, t(-(1.2 - 0.8 + 2.2 + 0.7) / 4))


def test_the_registry_names_every_mode_once_with_what_it_needs() -> None:
    from suite.core.losses import CORRECTIONS

    assert tuple(CORRECTIONS) == ("naive", "bypass", "tis", "acr", "tbpo")
    needs = {n: (c.needs_prox, c.needs_behav) for n, c in CORRECTIONS.items()}
    assert needs == {"naive": (True, False), "bypass": (False, True), "tis": (True, True), "acr": (True, True),
                     "tbpo": (True, True)}
    assert {n: c.label for n, c in CORRECTIONS.items()} == {"naive": "naive", "bypass": "bypass", "tis": "TIS",
                                                             "acr": "ACR", "tbpo": "TBPO"}
    x = torch.zeros(1, 2)
    for name, c in CORRECTIONS.items():  # a mode that needs a log-prob refuses None, naming it
        for arg, needed in (("prox_logp", c.needs_prox), ("behav_logp", c.needs_behav)):
            if needed:
                args = [x, None if arg == "prox_logp" else x, None if arg == "behav_logp" else x, x, x.bool()]
                with pytest.raises(ValueError, match=arg):
                    policy_loss(*args, mode=name)


def test_tis_hand() -> None:
    # r = prox / behav = [0.5, 3.0 (capped at C = 2), 1.0]; R = [1.5, 1.0, 0.5]; A = [+1, +1, -1]
    #   t0: 0.5 * min(1.5, 1.2) = 0.6
    #   t1: 2.0 * min(1.0, 1.0) = 2.0
    #   t2: 1.0 * min(-0.5, -0.8) = -0.8
    prox = t([[-1.0, -2.0, -1.5]])
    behav = prox - logs([[0.5, 3.0, 1.0]])
    logp = prox + logs([[1.5, 1.0, 0.5]])
    adv = t([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = policy_loss(logp, prox, behav, adv, mask, mode="tis", tis_cap=2.0)
    torch.testing.assert_close(loss, t(-(0.6 + 2.0 - 0.8) / 3))
    assert math.isclose(stats["rollout_corr/rollout_is_mean"], (0.5 + 2.0 + 1.0) / 3, rel_tol=1e-12)
    assert math.isclose(stats["rollout_corr/rollout_is_max"], 2.0, rel_tol=1e-12)
    assert math.isclose(stats["rollout_corr/rollout_is_ratio_fraction_high"], 1 / 3)


def test_acr_hand_relaxed_tightened_inverted() -> None:
    # eps_low = eps_high = 0.2, C = 2; hi = 1.2 / r, lo = 0.8; clip = min(max(R, lo), hi)
    #   t0: r = 0.8 (< 1, relaxed): hi = 1.5; R = 1.4, A = +1 -> 0.8 * min(1.4, 1.4) = 1.12
    #       (TIS/PPO would clip at 1.2: 0.8 * 1.2 = 0.96)
    #   t1: r = 1.2 (> 1, tightened): hi = 1.0; R = 1.1, A = +1 -> 1.2 * min(1.1, 1.0) = 1.2
    #   t2: r = 2.0: hi = 0.6 < lo = 0.8 (inverted; upper wins); R = 0.7, A = +1
    #       -> 2 * min(0.7, 0.6) = 1.2
    #   t3: r = 2.0, hi = 0.6; R = 0.7, A = -1 -> 2 * min(-0.7, -0.6) = -1.4
    #   t4: r = 0.5: hi = 2.4; R = 0.5, A = -1 -> 0.5 * min(-0.5, -0.8) = -0.4 (lower binds)
    r = t([[0.8, 1.2, 2.0, 2.0, 0.5]])
    R = t([[1.4, 1.1, 0.7, 0.7, 0.5]])
    prox = t([[-1.0, -0.3, -2.0, -2.5, -0.7]])
    behav, logp = prox - torch.log(r), prox + torch.log(R)
    adv = t([[1.0, 1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    loss, stats = policy_loss(logp, prox, behav, adv, mask, mode="acr")
    torch.testing.assert_close(loss, t(-(1.12 + 1.2 + 1.2 - 1.4 - 0.4) / 5))
    assert math.isclose(stats["actor/acr_relaxed_frac"], 2 / 5)
    assert math.isclose(stats["actor/acr_tightened_frac"], 3 / 5)
    assert math.isclose(stats["actor/acr_inverted_frac"], 2 / 5)
    # clipped: t1 (A>0, R above hi), t2 (A>0, R above hi), t4 (A<0, R below lo); not t0, t3
    assert math.isclose(stats["actor/pg_clipfrac"], 3 / 5)
    assert math.isclose(stats["actor/pg_clipfrac_high_bound"], 2 / 5)
    assert math.isclose(stats["actor/pg_clipfrac_low_bound"], 1 / 5)
    # TIS on the same tokens differs exactly at t0 (0.96 instead of 1.12), t1 (1.2 * min(1.1, 1.2)
    # = 1.32), t2 (2 * min(0.7, 1.2) = 1.4) and t3 (2 * min(-0.7, -0.8) = -1.6)
    tis, _ = policy_loss(logp, prox, behav, adv, mask, mode="tis")
    torch.testing.assert_close(tis, t(-(0.96 + 1.32 + 1.4 - 1.6 - 0.4) / 5))


def test_masked_tokens_do_not_count() -> None:
    logp, prox, adv, mask = _ppo_case()
    big = torch.cat([logp, t([[50.0]])], 1)  # a padded token with absurd values
    pad = torch.cat([mask, torch.zeros(1, 1, dtype=torch.bool)], 1)
    for mode in ("naive", "tis", "acr", "bypass"):
        a, _ = policy_loss(logp, prox, prox, adv, mask, mode=mode)
        b, _ = policy_loss(big, torch.cat([prox, t([[0.0]])], 1), torch.cat([prox, t([[-60.0]])], 1),
                           torch.cat([adv, t([[1e6]])], 1), pad, mode=mode)
        torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------- TBPO


def _tbpo_case():
    # 5 sequences x 3 tokens; deltas: pos 0.1, neg band [0.9, 1.2]; C_seq = 2.
    # log R per token (mean over valid tokens = log R_seq); log r per token (mean = log w_raw)
    log_R = t([
        [0.3, 0.0, 0.3],  # seq0: A=+1, R_s = e^0.2 = 1.221 > 1.1 -> clipped: 1.1 * w
        [0.05, 0.05, 99.0],  # seq1: A=+1, R_s = e^0.05 (last token padded) -> R_s * w
        [-0.2, -0.2, -0.2],  # seq2: A=-1, R_s = e^-0.2 = 0.819 < 0.9 -> masked
        [0.1, 0.1, 0.1],  # seq3: A=-1, R_s = e^0.1 = 1.105 in band -> -R_s * w
        [0.25, 0.25, 0.25],  # seq4: A=-1, R_s = e^0.25 = 1.284 > 1.2 -> masked
    ])
    log_r = t([
        [0.0, 0.0, 0.0],  # w = 1
        [math.log(1.5), math.log(1.5), -99.0],  # w = 1.5
        [math.log(3.0)] * 3,  # w_raw = 3 -> capped at 2
        [-0.5, -0.5, -0.5],  # w = e^-0.5
        [0.0, 0.0, 0.0],
    ])
    mask = torch.ones(5, 3, dtype=torch.bool)
    mask[1, 2] = False
    adv = t([[1.0] * 3, [1.0] * 3, [-1.0] * 3, [-1.0] * 3, [-1.0] * 3])
    prox = -torch.rand(5, 3, generator=torch.Generator().manual_seed(0), dtype=D)
    return prox + log_R, prox, prox - log_r, adv, mask


TB = dict(tbpo_delta_pos=0.1, tbpo_delta_neg_low=0.1, tbpo_delta_neg_high=0.2, tbpo_seq_cap=2.0)


def test_tbpo_hand() -> None:
    logp, prox, behav, adv, mask = _tbpo_case()
    loss, stats = policy_loss(logp, prox, behav, adv, mask, mode="tbpo", **TB)
    obj = [1.1 * 1.0, math.exp(0.05) * 1.5, 0.0, -math.exp(0.1) * math.exp(-0.5), 0.0]  # per sequence
    n_tok = [3, 2, 3, 3, 3]
    torch.testing.assert_close(loss, t(-sum(o * n for o, n in zip(obj, n_tok)) / 14))
    loss_seq, _ = policy_loss(logp, prox, behav, adv, mask, mode="tbpo", agg="seq-mean-token-mean", **TB)
    torch.testing.assert_close(loss_seq, t(-sum(obj) / 5))
    assert math.isclose(stats["actor/tbpo_masked_seq_frac"], 2 / 5)
    assert math.isclose(stats["actor/tbpo_pos_clip_seq_frac"], 1 / 5)
    assert math.isclose(stats["actor/pg_clipfrac"], 9 / 14)  # tokens of seq0, seq2, seq4
    assert math.isclose(stats["rollout_corr/rollout_is_ratio_fraction_high"], 1 / 5)
    assert math.isclose(stats["rollout_corr/rollout_is_max"], 2.0, rel_tol=1e-12)


def test_tbpo_gradient_only_inside_trust_region() -> None:
    logp, prox, behav, adv, mask = _tbpo_case()
    logp = logp.clone().requires_grad_(True)
    policy_loss(logp, prox, behav, adv, mask, mode="tbpo", **TB)[0].backward()
    g = logp.grad
    assert torch.equal(g[0], torch.zeros(3, dtype=D))  # positive, clipped above
    assert torch.equal(g[2], torch.zeros(3, dtype=D))  # negative, below the band: masked
    assert torch.equal(g[4], torch.zeros(3, dtype=D))  # negative, above the band: masked
    assert g[1, 2] == 0  # padding
    # seq1: loss = -(2 tokens * w * R_s) / 14, dR_s/dlogp_t = R_s / 2 per valid token
    torch.testing.assert_close(g[1, :2], t([-1.5 * math.exp(0.05) / 14] * 2))
    # seq3: loss = -(3 * w * (-R_s)) / 14 -> gradient +w R_s / 14 per token (pushes logp down)
    torch.testing.assert_close(g[3], t([math.exp(-0.5) * math.exp(0.1) / 14] * 3))


def test_tbpo_defaults_are_sequence_scale() -> None:
    # on-policy first step: R_s = 1 everywhere, nothing masked or clipped whatever the deltas
    prox = -torch.rand(4, 6, generator=torch.Generator().manual_seed(1), dtype=D)
    adv = t([[1.0] * 6, [-1.0] * 6, [0.5] * 6, [-2.0] * 6])
    _, stats = policy_loss(prox, prox, prox, adv, torch.ones(4, 6, dtype=torch.bool), mode="tbpo")
    assert stats["actor/tbpo_masked_seq_frac"] == 0.0 and stats["actor/pg_clipfrac"] == 0.0


# ----------------------------------------------------------------------------- properties


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    clip_low=st.floats(0.0, 0.5),
    clip_high=st.floats(0.0, 0.5),
    tis_cap=st.floats(1.0, 8.0),
    dual=st.sampled_from([None, 3.0]),
    agg=st.sampled_from(AGG_MODES),
)
def test_tis_and_acr_equal_naive_when_behav_is_prox(seed, clip_low, clip_high, tis_cap, dual, agg) -> None:
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 7
    prox = -torch.rand(B, T, generator=g, dtype=D) * 3
    logp = (prox + 0.4 * torch.randn(B, T, generator=g, dtype=D)).requires_grad_(True)
    adv = torch.randn(B, T, generator=g, dtype=D)
    mask = torch.rand(B, T, generator=g) > 0.3
    kw = dict(clip_low=clip_low, clip_high=clip_high, tis_cap=tis_cap, dual_clip=dual, agg=agg)
    ref, ref_stats = policy_loss(logp, prox, None, adv, mask, mode="naive", **kw)
    (g_ref,) = torch.autograd.grad(ref, logp)
    for mode in ("tis", "acr"):
        loss, stats = policy_loss(logp, prox, prox.clone(), adv, mask, mode=mode, **kw)
        (g_mode,) = torch.autograd.grad(loss, logp)
        torch.testing.assert_close(loss, ref)
        torch.testing.assert_close(g_mode, g_ref)
        for k in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
            assert stats[k] == ref_stats[k]


# ----------------------------------------------------------------------------- value / entropy


def test_value_loss_hand() -> None:
    # V_old = 0, clip 0.5: v = 1.0 -> clipped 0.5; G = 2: max((1-2)^2, (0.5-2)^2) = 2.25
    #                      v = 0.2 -> unclipped;   G = -1: max(1.44, 1.44) = 1.44
    vpred, old, ret = t([[1.0, 0.2]]), t([[0.0, 0.0]]), t([[2.0, -1.0]])
    loss, stats = value_loss(vpred, old, ret, torch.ones(1, 2), clip_range_value=0.5)
    torch.testing.assert_close(loss, t(0.5 * (2.25 + 1.44) / 2))
    assert stats["critic/vf_clipfrac"] == 0.5


def test_entropy_from_logits() -> None:
    torch.testing.assert_close(entropy_from_logits(torch.zeros(2, 5, dtype=D)), t([math.log(5)] * 2))
    p = t([0.5, 0.25, 0.25])
    torch.testing.assert_close(entropy_from_logits(torch.log(p) + 3.0), -(p * p.log()).sum())
def test_tbpo_sequence_weight_as_geometric_mean_or_product_by_hand():
    """w_seq = min(exp(mean_t log r), C) (QaRL's, the default) or min(exp(sum_t log r), C) (verl's
    sequence IS weight), r = pi_prox / pi_behav over the valid tokens; one sequence of A > 0 inside
    the band, so the loss is -w * A * R_seq with R_seq = 1 (logp = prox)."""
    import math

    from suite.core.losses import policy_loss

    prox = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    behav = torch.tensor([[-1.1, -2.3, -0.45, 0.0]])  # log r = 0.1, 0.3, -0.05 (the last token is padding)
    mask = torch.tensor([[1, 1, 1, 0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    common = dict(mode="tbpo", agg="token-mean", tbpo_delta_pos=0.1, tbpo_seq_cap=2.0)
    for form, log_w in (("geomean", (0.1 + 0.3 - 0.05) / 3), ("product", 0.1 + 0.3 - 0.05)):
        loss, stats = policy_loss(prox.clone(), prox, behav, adv, mask, tbpo_seq_weight=form, **common)
        w = min(math.exp(log_w), 2.0)
        assert loss.item() == pytest.approx(-w, rel=1e-6), form
        assert stats["rollout_corr/rollout_is_mean"] == pytest.approx(w, rel=1e-6)
    long_behav = behav - 0.5  # log r grows with length in the product, stays per-token in the mean
    _, geo = policy_loss(prox.clone(), prox, long_behav, adv, mask, tbpo_seq_weight="geomean", **common)
    _, prod = policy_loss(prox.clone(), prox, long_behav, adv, mask, tbpo_seq_weight="product", **common)
    assert geo["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0 and prod["rollout_corr/rollout_is_max"] == 2.0
    with pytest.raises(ValueError, match="tbpo_seq_weight='sum'; allowed: geomean, product"):
        policy_loss(prox, prox, behav, adv, mask, tbpo_seq_weight="sum", **common)
