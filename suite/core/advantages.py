"""Advantages and rewards: GAE, GRPO group normalisation, DAPO filtering and overlong shaping,
KL estimators. Tensors are [B, T] (B sequences, T response tokens) unless noted.

Matched against verl 0.9.1 ``verl.trainer.ppo.core_algos`` (see tests/core/test_verl_parity.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from suite.core.losses import masked_mean

KL_ESTIMATORS = ("k1", "k2", "k3")


# ----------------------------------------------------------------------------- PPO / GAE


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` over the mask, with Bessel's correction, as verl
    ``torch_functional.masked_whiten`` (which raises for fewer than 2 valid entries; so do we)."""
    m = mask.to(values.dtype)
    n = m.sum()
    if n < 2:
        raise ValueError(f"masked_whiten needs at least 2 valid entries, got {int(n)}")
    mean = masked_mean(values, m)
    var = masked_mean((values - mean) ** 2, m) * n / (n - 1)
    out = (values - mean) * torch.rsqrt(var + 1e-8)
    return out if shift_mean else out + mean


@torch.no_grad()
def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv 1506.02438 Eq. 16).

    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``; returns
    ``G_t = A_t + V_t`` are the value-loss targets. Masked-out tokens are skipped: the next
    value and running advantage carry across them (verl ``compute_gae_advantage_return``),
    and the value after the last token is 0. With ``whiten`` the advantages (not the returns)
    are whitened over the mask, as verl does. Inputs [B, T] -> (advantages, returns) [B, T].
    The loop runs over T (the recursion is sequential in time), vectorised over B.
    """
    m = mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])  # [B]
    last_gae = torch.zeros_like(values[:, 0])  # [B]
    adv = torch.empty_like(values)  # [B, T]
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        mt = m[:, t]
        next_value = values[:, t] * mt + (1 - mt) * next_value
        last_gae = gae_t * mt + (1 - mt) * last_gae
        adv[:, t] = last_gae
    returns = adv + values  # [B, T]
    if whiten:
        adv = masked_whiten(adv, m)
    return adv, returns


# ----------------------------------------------------------------------------- GRPO / DAPO


def _group_index(group_ids: torch.Tensor | Sequence, device: torch.device) -> torch.Tensor:
    """Any group labels (tensor, numpy array of uids, list) -> dense long ids [B]."""
    if isinstance(group_ids, torch.Tensor):
        return torch.unique(group_ids, return_inverse=True)[1].to(device)
    labels: dict = {}
    dense = [labels.setdefault(g, len(labels)) for g in list(group_ids)]
    return torch.tensor(dense, dtype=torch.long, device=device)


def group_stats(
    scores: torch.Tensor, group_ids: torch.Tensor | Sequence
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased std and group size, each [B] (vectorised, no loops)."""
    idx = _group_index(group_ids, scores.device)  # [B]
    n_groups = int(idx.max()) + 1 if idx.numel() else 0
    count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, idx, torch.ones_like(scores))
    total = torch.zeros_like(count).index_add_(0, idx, scores)
    mean = (total / count)[idx]  # [B]
    sq = torch.zeros_like(count).index_add_(0, idx, (scores - mean) ** 2)
    var = sq / (count - 1).clamp(min=1)  # Bessel, as torch.std
    return mean, var.sqrt()[idx], count[idx]


def grpo_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor | Sequence,
    mask: torch.Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO outcome advantages (DeepSeekMath arXiv 2402.03300 Sec. 4.1.2):
    ``A_i = (r_i - mean_G r) / (std_G r + eps)`` broadcast over the response tokens.

    ``norm_by_std=False`` drops the std division (Dr. GRPO, arXiv 2503.20783). Conventions of
    verl ``compute_grpo_outcome_advantage``: unbiased std (``torch.std``), eps added to the
    std (not under the root), and a group of one sample uses mean 0 / std 1 (its advantage is
    its raw score). scores [B], group_ids [B] (any labels), mask [B, T] -> advantages [B, T].
    """
    mean, std, count = group_stats(scores, group_ids)  # [B] each
    single = count < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    adv = (scores - mean) / (std + eps) if norm_by_std else scores - mean  # [B]
    return adv[:, None] * mask.to(adv.dtype)  # [B, T]


def dapo_group_filter(correct: torch.Tensor, group_ids: torch.Tensor | Sequence) -> torch.Tensor:
    """DAPO dynamic sampling (arXiv 2503.14476 Eq. 11): keep a sample iff its group has
    ``0 < #correct < G`` (a group that is all right or all wrong has zero GRPO advantage and
    no gradient). correct [B] bool -> keep [B] bool. The trainer resamples to refill the batch.
    verl filters on ``std(metric) > 0`` and keeps singleton groups; for 0/1 correctness and
    G >= 2 the two agree, and a singleton is dropped here (0 < c < 1 is impossible).
    """
    c = correct.to(torch.float64)
    mean, _, count = group_stats(c, group_ids)  # [B]
    n_correct = torch.round(mean * count)
    return (n_correct > 0) & (n_correct < count)


def overlong_penalty(
    response_len: torch.Tensor, *, max_len: int, cache_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment (arXiv 2503.14476 Eq. 13), added to the task reward:

    ``0`` if ``L <= L_max - L_cache``; ``((L_max - L_cache) - L) / L_cache`` inside the
    buffer; ``-1`` beyond ``L_max``; all times ``penalty_factor``. Matches verl's DAPO reward
    manager (``min(-exceed_len / buffer_len * factor, 0)``) up to ``L_max``, beyond which verl
    keeps decreasing (it never sees longer responses) and DAPO, and we, clamp at -1.
    response_len [B] -> penalty [B] float32 (<= 0).
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"overlong shaping needs 0 < cache_len={cache_len} <= max_len={max_len}")
    length = response_len.to(torch.float32)
    pen = ((max_len - cache_len) - length) / cache_len  # [B]
    return pen.clamp(min=-1.0, max=0.0) * penalty_factor


# ----------------------------------------------------------------------------- KL


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log p - log q (unbiased for KL(p || q) under samples from p; Schulman 2020,
    http://joschu.net/blog/kl-approx.html). verl "kl"/"k1"."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log p - log q)^2 (low variance, biased). verl "mse"/"k2"."""
    return 0.5 * (logp - ref_logp).square()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = q/p - log(q/p) - 1 >= 0 (unbiased, low variance), exactly verl "low_var_kl"/"k3":
    the log ratio ``log q - log p`` is clamped to [-20, 20] and the result to [-10, 10]."""
    kl = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(kl) - kl - 1).clamp(-10.0, 10.0)


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate, kind in ("k1", "k2", "k3")."""
    fns = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
    if kind not in fns:
        raise ValueError(f"unknown KL estimator {kind!r}; allowed: {KL_ESTIMATORS}")
    return fns[kind](logp, ref_logp)


__all__ = [
    "KL_ESTIMATORS",
    "dapo_group_filter",
    "gae_advantages",
    "group_stats",
    "grpo_advantages",
    "kl_estimate",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "masked_whiten",
    "overlong_penalty",
]


# ----------------------------------------------------------------------------- the algorithms


def _gae_from_outcome(scores, lengths, mask, values, group_size, algo) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO: the outcome reward on each response's last token, then GAE against the critic's values."""
    rewards = torch.zeros_like(mask)  # [N, R]: outcome reward on the last response token
    last = (lengths - 1).clamp(min=0)
    rewards[torch.arange(len(last)), last] = scores
    return gae_advantages(rewards, values * mask, mask, gamma=algo.gamma, lam=algo.lam)


def _grpo_from_outcome(scores, lengths, mask, values, group_size, algo) -> tuple[torch.Tensor, None]:
    """GRPO / DAPO: group-normalised outcome rewards; groups of `group_size` are contiguous."""
    group_ids = torch.arange(len(scores)) // group_size  # [N]
    return grpo_advantages(scores, group_ids, mask, norm_by_std=algo.norm_adv_by_std), None


@dataclass(frozen=True)
class Algorithm:
    """One `algo=` option: its advantage estimator, and the algo config values it sets (`suite.config`
    registers each as a config option; the embedded trainer and the verl translation read the rest
    from here, so a new estimator is one entry below)."""

    verl_estimator: str  # verl's algorithm.adv_estimator
    critic: bool  # token-level advantages against a learned value model (a critic is trained)
    # (scores [N], lengths [N], mask [N, R], values [N, R] or None, group size, the algo config)
    # -> (advantages [N, R], value-loss returns [N, R] or None)
    advantages: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    config: Mapping[str, Any] = field(default_factory=dict)  # algo.* values beside the defaults


ALGORITHMS: dict[str, Algorithm] = {
    # PPO: token-level GAE with a critic (verl: adv_estimator=gae); G responses per prompt like GRPO,
    # so both see the same rollouts per step and compare at equal cost.
    "ppo": Algorithm("gae", True, _gae_from_outcome),
    "grpo": Algorithm("grpo", False, _grpo_from_outcome),
    # DAPO (arXiv 2503.14476): clip-higher, token-mean, dynamic sampling, overlong shaping, no KL.
    "dapo": Algorithm("grpo", False, _grpo_from_outcome, config={
        "clip_high": 0.28, "agg": "token-mean", "dynamic_sampling": True, "overlong_buffer": 8, "kl_coef": 0.0}),
}
