"""suite.core.advantages: hand-computed GAE, GRPO, DAPO filter, overlong shaping, KL."""

from __future__ import annotations

import math

import pytest
import torch

from suite.core.advantages import (
    dapo_group_filter,
    gae_advantages,
    grpo_advantages,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_whiten,
    overlong_penalty,
)

D = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=D)


def test_gae_hand() -> None:
    # gamma 0.9, lambda 0.8, reward only at the end
    #   delta2 = 1 - 0.7 = 0.3                 A2 = 0.3
    #   delta1 = 0.9 * 0.7 - 0.6 = 0.03        A1 = 0.03 + 0.72 * 0.3 = 0.246
    #   delta0 = 0.9 * 0.6 - 0.5 = 0.04        A0 = 0.04 + 0.72 * 0.246 = 0.21712
    r, v = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.6, 0.7]])
    adv, ret = gae_advantages(r, v, torch.ones(1, 3), gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(adv, t([[0.21712, 0.246, 0.3]]))
    torch.testing.assert_close(ret, t([[0.71712, 0.846, 1.0]]))


def test_gae_skips_masked_tokens() -> None:
    # a masked token in the middle is transparent: same as the 2-token sequence without it
    r, v = t([[0.0, 5.0, 1.0]]), t([[0.5, 9.0, 0.7]])
    adv, _ = gae_advantages(r, v, t([[1.0, 0.0, 1.0]]), gamma=0.9, lam=0.8, whiten=False)
    ref, _ = gae_advantages(t([[0.0, 1.0]]), t([[0.5, 0.7]]), torch.ones(1, 2), gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(adv[:, [0, 2]], ref)


def test_gae_whitened_over_mask() -> None:
    r = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=D)
    v = torch.randn(3, 5, generator=torch.Generator().manual_seed(1), dtype=D)
    mask = torch.ones(3, 5)
    mask[2, 3:] = 0
    adv, _ = gae_advantages(r, v, mask, gamma=1.0, lam=0.95)
    valid = adv[mask.bool()]
    torch.testing.assert_close(valid.mean(), t(0.0))
    torch.testing.assert_close(valid.std(), t(1.0), rtol=1e-6, atol=0)  # var + 1e-8 under the root
    with pytest.raises(ValueError, match="at least 2"):
        masked_whiten(r, torch.zeros_like(r))


def test_grpo_hand() -> None:
    scores = t([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 7, 7, 7, 7])
    mask = torch.ones(8, 3)
    mask[1, 2] = 0
    adv = grpo_advantages(scores, groups, mask)
    # group 0: mean 0.5, unbiased std sqrt(1/3); group 7: std 0 -> advantage 0
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(adv[:, 0], t([a, -a, -a, a, 0, 0, 0, 0]))
    assert adv[1, 2] == 0  # masked token
    adv_nostd = grpo_advantages(scores, groups, mask, norm_by_std=False)
    torch.testing.assert_close(adv_nostd[:, 0], t([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))


def test_grpo_string_ids_and_singletons() -> None:
    scores = t([2.0, 1.0, 3.0])
    adv = grpo_advantages(scores, ["p1", "p0", "p1"], torch.ones(3, 1))
    # "p0" alone: mean 0, std 1 (verl) -> raw score / (1 + eps)
    torch.testing.assert_close(adv[:, 0],
                               t([-0.5 / (math.sqrt(0.5) + 1e-6), 1.0 / (1 + 1e-6), 0.5 / (math.sqrt(0.5) + 1e-6)]))


def test_dapo_group_filter_hand() -> None:
    correct = torch.tensor([1, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 4])  # 0 mixed, 1 all right, 2 all wrong, 3/4 single
    keep = dapo_group_filter(correct.bool(), groups)
    assert keep.tolist() == [True] * 3 + [False] * 8


def test_overlong_penalty_hand() -> None:
    # L_max 20, L_cache 5: free up to 15, linear to -1 at 20, -1 beyond
    lengths = torch.tensor([10, 15, 16, 18, 20, 25])
    pen = overlong_penalty(lengths, max_len=20, cache_len=5)
    torch.testing.assert_close(pen, torch.tensor([0.0, 0.0, -0.2, -0.6, -1.0, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, max_len=20, cache_len=5, penalty_factor=0.5), pen * 0.5)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, max_len=20, cache_len=0)


def test_kl_estimators_hand() -> None:
    logp, ref = t([math.log(0.5), math.log(0.2)]), t([math.log(0.25), math.log(0.4)])
    torch.testing.assert_close(kl_k1(logp, ref), t([math.log(2), math.log(0.5)]))
    torch.testing.assert_close(kl_k2(logp, ref), t([0.5 * math.log(2) ** 2, 0.5 * math.log(0.5) ** 2]))
    # k3 = q/p - log(q/p) - 1 with q/p = [0.5, 2]
    torch.testing.assert_close(kl_k3(logp, ref), t([0.5 - math.log(0.5) - 1, 2 - math.log(2) - 1]))
    # clamps: log(q/p) = 30 -> 20 -> exp(20) - 21 -> clamped to 10
    assert kl_k3(t([0.0]), t([30.0])).item() == 10.0
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), kl_k3(logp, ref))
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        kl_estimate(logp, ref, "low_var")
