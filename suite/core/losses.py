"""Policy and value losses: the correction registry (naive / bypass / TIS / ACR / TBPO), aggregation.

Three policies per token (decoupled PPO, Hilton et al. 2021, arXiv 2110.00641):
``behav`` (the quantized old actor that sampled the token), ``prox`` (the full-precision old
actor, the clip anchor) and ``logp`` (the policy being optimised). Per token
``R = pi_theta / pi_prox`` and ``r = pi_prox / pi_behav``. Every objective is maximised;
the functions return its negation as the loss. Tensors are [B, T] (B sequences, T response
tokens); ``mask`` is bool or 0/1 float of the same shape.

Every correction mode is one entry of :data:`CORRECTIONS`, registered with
:func:`register_correction` (verl's ``@register_policy_loss`` pattern, ``core_algos.py``): its
display label, which log-probs it needs, the paper / implementation it reproduces and how verl
runs it. Config choices, the verl plugin's registrations and translation, and report labels and
orders are derived from it (docs/architecture.md, "Add a correction").

Conventions follow verl 0.9.1 ``verl.trainer.ppo.core_algos.compute_policy_loss_vanilla`` and
``agg_loss`` so the embedded and verl backends report the same numbers:
- log-ratios are clamped to [-20, 20] before ``exp`` (verl's stability clamp and its
  rollout-correction SAFETY_BOUND);
- the dual clip (Ye et al. 2020, arXiv 1912.09729) caps the loss of negative-advantage tokens
  at ``-A * dual_clip``; unlike verl (always on, ``clip_ratio_c = 3``), ``dual_clip=None`` is off;
- IS weights multiply the per-token loss *after* clipping (verl's ``rollout_is_weights``).
Where a mask sums to zero the loss is 0 (verl divides by zero there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LOG_RATIO_BOUND = 20.0  # verl: clamp(negative_approx_kl, -20, 20); rollout_corr SAFETY_BOUND = 20

# TBPO defaults. QaRL (arXiv 2604.07853) does not state its deltas in a form we could recover;
# we take GSPO's sequence-level clip ranges (arXiv 2507.18071: eps_low 3e-4, eps_high 4e-4),
# because a geometric-mean sequence ratio concentrates near 1 and token-level 0.2 would never
# bind; the upper edge of the negative band (the dual clip) is set an order of magnitude wider,
# mirroring verl's token-level dual clip (3) being ~10x its eps (0.2). All are config options.
TBPO_DELTA_POS = 4e-4
TBPO_DELTA_NEG_LOW = 3e-4
TBPO_DELTA_NEG_HIGH = 3e-3
TBPO_SEQ_CAP = 2.0
# TBPO's sequence-level importance weight w_seq = pi_prox / pi_behav of the whole response, in one of two
# forms. QaRL's text (2nd-hand) defines it length-normalised, as its sequence ratio R_seq and GSPO: the
# geometric mean exp(mean_t log r_t), which sits near 1 at any length. verl's sequence-level rollout IS
# (rollout_is=sequence) is the product exp(sum_t log r_t), the unbiased sequence weight, which drifts away
# from 1 as responses grow and so meets the cap C_seq far more often. Both are offered; the default is QaRL's.
TBPO_SEQ_WEIGHTS = ("geomean", "product")
TBPO_SEQ_WEIGHT = "geomean"


def _fmask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.to(like.dtype)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set; masked-out entries may hold inf/NaN (they are
    replaced, not multiplied by 0)."""
    m = _fmask(mask, values)
    v = torch.where(m != 0, values, torch.zeros_like(values)) * m
    return v.sum() if dim is None else v.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the mask (torchtune ``rlhf.masked_mean``; verl ``masked_mean``
    without its +1e-8). An empty mask gives 0."""
    m = _fmask(mask, values)
    n = m.sum() if dim is None else m.sum(dim)
    return masked_sum(values, m, dim) / torch.where(n > 0, n, torch.ones_like(n))


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, agg: str) -> torch.Tensor:
    """Aggregate a per-token loss [B, T] to a scalar, as verl ``core_algos.agg_loss`` (dp=1).

    - "token-mean": sum over all valid tokens / #valid tokens (DAPO, arXiv 2503.14476 Eq. 8;
      verl's default).
    - "seq-mean-token-mean": mean over tokens within a sequence, then over sequences with at
      least one valid token (GRPO, DeepSeekMath arXiv 2402.03300 Eq. 3).
    - "seq-mean-token-sum": sum over tokens within a sequence, mean over sequences.
    verl adds 1e-8 to the per-sequence token count in "seq-mean-token-mean"; we divide exactly.
    """
    if agg not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation agg={agg!r}; allowed: {AGG_MODES}")
    m = _fmask(mask, loss_mat)
    if agg == "token-mean":
        return masked_mean(loss_mat, m)
    n_tok = m.sum(-1)  # [B]
    seq = masked_sum(loss_mat, m, dim=-1)  # [B]
    if agg == "seq-mean-token-mean":
        seq = seq / torch.where(n_tok > 0, n_tok, torch.ones_like(n_tok))  # [B]
    return masked_mean(seq, n_tok > 0)


def _f(x: torch.Tensor) -> float:
    return float(x.detach())


def _check_shapes(mode: str, **tensors: torch.Tensor | None) -> torch.Size:
    shape = None
    for name, t in tensors.items():
        if t is None:
            raise ValueError(f"policy_loss(mode={mode!r}) needs {name}")
        if shape is None:
            shape = t.shape
        elif t.shape != shape:
            raise ValueError(f"policy_loss: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    assert shape is not None
    return shape


@dataclass(frozen=True)
class Correction:
    """One correction mode: what it is, what it needs, where it comes from, how verl runs it."""

    name: str  # config choice (correction=<name>) and MLflow tag value
    label: str  # report label
    needs_prox: bool  # uses log pi_prox (the full-precision recompute)
    needs_behav: bool  # uses log pi_behav (the rollout engine's log-probs)
    params: tuple[str, ...]  # correction.* config fields it reads (besides clip ranges and dual clip)
    level: str  # "token" or "sequence"
    reproduces: str  # the paper / implementation it reproduces (docs/math.md)
    # verl: "vanilla" = stock loss, no rollout correction; "bypass" = verl's rollout-correction
    # bypass mode (old log-prob := rollout log-prob, PPO clip); "tis" = verl's token-level rollout IS;
    # "plugin" = a loss of ours registered by suite.verl.plugin under `name`
    verl: str


CORRECTIONS: dict[str, Correction] = {}  # name -> Correction, in registration (= report) order
_LOSS_FNS: dict[str, Callable] = {}


def register_correction(name: str, *, label: str, needs_prox: bool, needs_behav: bool, params: tuple[str, ...] = (),
                        level: str = "token", reproduces: str, verl: str):
    """Decorator: register ``fn(logp, prox, behav, adv, mask, **kw) -> (loss, stats)`` as ``name``."""

    def deco(fn: Callable) -> Callable:
        if name in CORRECTIONS:
            raise ValueError(f"correction {name!r} registered twice")
        CORRECTIONS[name] = Correction(name, label, needs_prox, needs_behav, tuple(params), level, reproduces, verl)
        _LOSS_FNS[name] = fn
        return fn

    return deco


def policy_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor | None,
    behav_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    tis_cap: float = 2.0,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    tbpo_delta_pos: float = TBPO_DELTA_POS,
    tbpo_delta_neg_low: float = TBPO_DELTA_NEG_LOW,
    tbpo_delta_neg_high: float = TBPO_DELTA_NEG_HIGH,
    tbpo_seq_cap: float = TBPO_SEQ_CAP,
    tbpo_seq_weight: str = TBPO_SEQ_WEIGHT,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled-PPO policy loss under a quantized rollout actor; returns ``(loss, stats)``.

    All tensors [B, T]; ``logp`` carries the gradient, ``prox_logp`` / ``behav_logp`` are
    treated as constants (a mode that does not need one accepts None). ``mode`` is a name in
    :data:`CORRECTIONS`. Per token, with ``clip(x, lo, hi) = min(max(x, lo), hi)`` (the upper
    bound wins when hi < lo) and ``lo = 1 - clip_low``:

    - "naive"  (FlashRL's uncorrected baseline, "without TIS", and stock verl):
      ``min(R A, clip(R, lo, 1+clip_high) A)``, ``R = pi_theta / pi_prox``; pi_behav sampled the
      tokens but is ignored, so the gradient carries the mismatch's bias.
    - "bypass" (QuRL's uncorrected baseline: the quantized actor is the old policy; verl's
      rollout-correction bypass mode, ``bypass_mode=true, loss_type=ppo_clip``): the same with
      ``R' = pi_theta / pi_behav``; importance-correct with respect to the sampler; ``prox_logp``
      is unused.
    - "tis"    (FlashRL truncated IS, Yao et al. 2025): ``min(r, C) * naive``, ``C = tis_cap``;
      equals verl vanilla with ``rollout_is_weights = min(exp(prox - behav), C)``.
    - "acr"    (QuRL Eq. ACR, arXiv 2602.13953): ``min(r, C) * min(R A, clip(R, lo, (1+clip_high)/r) A)``.
    - "tbpo"   (QaRL TBPO, arXiv 2604.07853), sequence level: ``R_s = exp(mean_t log(pi_theta/pi_prox))``,
      ``w_s = min(exp(mean_t log(pi_prox/pi_behav)), tbpo_seq_cap)`` (``tbpo_seq_weight="product"``:
      ``exp(sum_t ...)``, verl's sequence-level IS weight; TBPO_SEQ_WEIGHTS); a token with A > 0 has
      objective ``w_s * A * min(R_s, 1 + tbpo_delta_pos)``; a token with A < 0 has
      ``w_s * A * R_s`` inside the trust band ``[1 - tbpo_delta_neg_low, 1 + tbpo_delta_neg_high]``
      and is masked (objective 0, no gradient) outside it. Masked tokens stay in the
      aggregation's denominator, like clipped ones, so the loss scale does not jump with the
      number of masked sequences. The advantage is used per token (for outcome rewards it is
      constant within a sequence, making the rule per sequence). ``dual_clip``, ``clip_*`` and
      ``tis_cap`` do not apply. With A = 0 the objective is 0.

    ``dual_clip`` (verl ``clip_ratio_c``, > 1; None = off) caps the loss of A < 0 tokens at
    ``-A * dual_clip`` in the token-level modes, before the IS weight multiplies it.

    Stats (detached Python floats; masked means over valid tokens unless noted):
      all modes: ``actor/pg_clipfrac`` (tokens whose objective is clipped / masked: verl's
      definition ``-A*clip(R) > -A*R`` for token-level modes), ``actor/ppo_kl`` (mean of
      ``anchor - logp``, anchor = prox, or behav for bypass; verl's name).
      token-level modes: ``actor/pg_clipfrac_high_bound`` (clipped with A > 0: the upper bound
      binds), ``actor/pg_clipfrac_low_bound`` (clipped with A < 0: the lower bound binds),
      ``actor/pg_clipfrac_lower`` (verl's name: dual clip active; 0 when off).
      tis / acr / tbpo: ``rollout_corr/rollout_is_mean``, ``rollout_corr/rollout_is_max`` (of the
      truncated weights), ``rollout_corr/rollout_is_ratio_fraction_high`` (fraction truncated:
      raw weight > cap) -- verl's rollout-correction names; tbpo's are sequence weights (mean
      token-weighted as verl's sequence mode, fraction over sequences).
      acr: ``actor/acr_relaxed_frac`` (r < 1: upper bound above 1+clip_high),
      ``actor/acr_tightened_frac`` (r > 1: upper bound below 1+clip_high),
      ``actor/acr_inverted_frac`` (upper bound below the lower bound).
      tbpo: ``actor/tbpo_masked_seq_frac`` (sequences with a negative-advantage token outside
      the band / sequences with a valid token), ``actor/tbpo_pos_clip_seq_frac`` (sequences
      with a positive-advantage token and R_s > 1 + delta_pos), ``actor/tbpo_seq_ratio_mean``.
    """
    if mode not in CORRECTIONS:
        raise ValueError(f"unknown policy loss mode={mode!r}; allowed: {tuple(CORRECTIONS)}")
    if agg not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation agg={agg!r}; allowed: {AGG_MODES}")
    c = CORRECTIONS[mode]
    needs = {"logp": logp, "advantages": advantages, "mask": mask}
    if c.needs_prox:
        needs["prox_logp"] = prox_logp
    if c.needs_behav:
        needs["behav_logp"] = behav_logp
    _check_shapes(mode, **needs)
    return _LOSS_FNS[mode](
        logp, prox_logp, behav_logp, advantages, mask, agg=agg, clip_low=clip_low, clip_high=clip_high,
        tis_cap=tis_cap, dual_clip=dual_clip, tbpo_delta_pos=tbpo_delta_pos, tbpo_delta_neg_low=tbpo_delta_neg_low,
        tbpo_delta_neg_high=tbpo_delta_neg_high, tbpo_seq_cap=tbpo_seq_cap, tbpo_seq_weight=tbpo_seq_weight,
    )


def _is_weights(prox_logp: torch.Tensor, behav_logp: torch.Tensor, m: torch.Tensor, tis_cap: float):
    """r = pi_prox / pi_behav [B, T] and FlashRL's truncated weight min(r, C), with verl's stats."""
    if tis_cap <= 0.0:
        raise ValueError(f"tis_cap={tis_cap}; must be > 0")
    log_r = (prox_logp - behav_logp).detach().clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B, T]
    r = torch.exp(log_r)  # [B, T]
    is_w = r.clamp(max=tis_cap)  # [B, T]; FlashRL TIS weight min(r, C)
    stats = {
        "rollout_corr/rollout_is_mean": _f(masked_mean(is_w, m)),
        "rollout_corr/rollout_is_max": _f(torch.where(m != 0, is_w, torch.zeros_like(is_w)).amax()) if m.any() else 0.0,
        "rollout_corr/rollout_is_ratio_fraction_high": _f(masked_mean((r > tis_cap).to(m), m)),
    }
    return r, is_w, stats


def _token_clip(logp, anchor, advantages, mask, *, agg, clip_low, clip_high, dual_clip, is_w=None, hi=None,
                stats=None, **_):
    """The token-level clipped objective against ``anchor``, optionally IS-weighted, with an
    optional per-token upper bound ``hi`` (ACR); shared by naive, bypass, tis and acr."""
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"clip_low={clip_low} must be in [0, 1) and clip_high={clip_high} >= 0")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip={dual_clip}; must be > 1 (verl clip_ratio_c) or None")
    m = _fmask(mask, logp)
    stats = dict(stats or {})
    log_ratio = (logp - anchor.detach()).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    lo = 1.0 - clip_low
    if hi is None:
        hi = 1.0 + clip_high
    # clip(R, lo, hi) = min(max(R, lo), hi): the upper bound wins when hi < lo (QuRL ACR).
    clipped_ratio = ratio.clamp(min=lo).clamp(max=hi)  # [B, T]
    loss1 = -advantages * ratio  # [B, T]
    loss2 = -advantages * clipped_ratio  # [B, T]
    loss_t = torch.maximum(loss1, loss2)  # [B, T]; = -min(R A, clip(R) A)
    clipped = (loss2 > loss1).to(m)
    dual = torch.zeros_like(m)
    if dual_clip is not None:
        loss3 = -advantages * dual_clip  # [B, T]
        neg = advantages < 0
        dual = (neg & (loss_t > loss3)).to(m)
        loss_t = torch.where(neg, torch.minimum(loss_t, loss3), loss_t)  # [B, T]
    if is_w is not None:
        loss_t = loss_t * is_w  # verl: pg_losses * rollout_is_weights, after clipping
    loss = agg_loss(loss_t, m, agg)

    stats["actor/pg_clipfrac"] = _f(masked_mean(clipped, m))
    stats["actor/pg_clipfrac_high_bound"] = _f(masked_mean(clipped * (advantages > 0).to(m), m))
    stats["actor/pg_clipfrac_low_bound"] = _f(masked_mean(clipped * (advantages < 0).to(m), m))
    stats["actor/pg_clipfrac_lower"] = _f(masked_mean(dual, m))
    stats["actor/ppo_kl"] = _f(masked_mean(-log_ratio, m))
    return loss, stats


@register_correction(
    "naive", label="naive", needs_prox=True, needs_behav=False,
    reproduces="FlashRL's uncorrected baseline ('without TIS') and stock verl with a quantized rollout: PPO "
               "clip against the recomputed pi_prox, pi_behav ignored",
    verl="vanilla")
def _naive(logp, prox_logp, behav_logp, advantages, mask, **kw):
    return _token_clip(logp, prox_logp, advantages, mask, **kw)


@register_correction(
    "bypass", label="bypass", needs_prox=False, needs_behav=True,
    reproduces="QuRL's uncorrected baseline (the quantized actor as the old policy) and verl's "
               "rollout-correction bypass mode (bypass_mode=true, loss_type=ppo_clip): PPO clip anchored on "
               "pi_behav, no IS weight",
    verl="bypass")
def _bypass(logp, prox_logp, behav_logp, advantages, mask, **kw):
    return _token_clip(logp, behav_logp, advantages, mask, **kw)


@register_correction(
    "tis", label="TIS", needs_prox=True, needs_behav=True, params=("tis_cap",),
    reproduces="FlashRL truncated importance sampling (Yao et al. 2025): min(r, C) x the naive objective",
    verl="tis")
def _tis(logp, prox_logp, behav_logp, advantages, mask, *, tis_cap, **kw):
    _, is_w, stats = _is_weights(prox_logp, behav_logp, _fmask(mask, logp), tis_cap)
    return _token_clip(logp, prox_logp, advantages, mask, is_w=is_w, stats=stats, **kw)


@register_correction(
    "acr", label="ACR", needs_prox=True, needs_behav=True, params=("tis_cap",),
    reproduces="QuRL adaptive clipping range (arXiv 2602.13953): upper clip (1 + eps_high) / r, TIS weight",
    verl="plugin")
def _acr(logp, prox_logp, behav_logp, advantages, mask, *, tis_cap, clip_high, **kw):
    m = _fmask(mask, logp)
    r, is_w, stats = _is_weights(prox_logp, behav_logp, m, tis_cap)
    hi = (1.0 + clip_high) / r  # [B, T]; QuRL ACR: the upper bound adapts to r
    lo = 1.0 - kw["clip_low"]
    stats["actor/acr_relaxed_frac"] = _f(masked_mean((r < 1).to(m), m))
    stats["actor/acr_tightened_frac"] = _f(masked_mean((r > 1).to(m), m))
    stats["actor/acr_inverted_frac"] = _f(masked_mean((hi < lo).to(m), m))
    return _token_clip(logp, prox_logp, advantages, mask, is_w=is_w, hi=hi, stats=stats, clip_high=clip_high, **kw)


@register_correction(
    "tbpo", label="TBPO", needs_prox=True, needs_behav=True, level="sequence",
    params=("tbpo_delta_pos", "tbpo_delta_neg_low", "tbpo_delta_neg_high", "tbpo_seq_cap", "tbpo_seq_weight"),
    reproduces="QaRL trust-band policy optimisation (arXiv 2604.07853): sequence ratio, dual-clipped band "
               "for negative samples",
    verl="plugin")
def _tbpo(logp, prox_logp, behav_logp, advantages, mask, *, agg, tbpo_delta_pos, tbpo_delta_neg_low,
          tbpo_delta_neg_high, tbpo_seq_cap, tbpo_seq_weight=TBPO_SEQ_WEIGHT, **_):
    return _tbpo_loss(logp, prox_logp, behav_logp, advantages, mask, agg=agg, delta_pos=tbpo_delta_pos,
                      delta_neg_low=tbpo_delta_neg_low, delta_neg_high=tbpo_delta_neg_high, seq_cap=tbpo_seq_cap,
                      seq_weight=tbpo_seq_weight)


def _tbpo_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor | None,
    behav_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg: str,
    delta_pos: float,
    delta_neg_low: float,
    delta_neg_high: float,
    seq_cap: float,
    seq_weight: str = TBPO_SEQ_WEIGHT,
) -> tuple[torch.Tensor, dict[str, float]]:
    """TBPO (QaRL arXiv 2604.07853); see :func:`policy_loss` for the objective."""
    if seq_weight not in TBPO_SEQ_WEIGHTS:
        raise ValueError(f"tbpo_seq_weight={seq_weight!r}; allowed: {', '.join(TBPO_SEQ_WEIGHTS)}")
    if delta_pos < 0 or delta_neg_high < 0 or not 0 <= delta_neg_low < 1:
        raise ValueError(
            f"tbpo deltas: delta_pos={delta_pos} >= 0, delta_neg_low={delta_neg_low} in [0, 1), "
            f"delta_neg_high={delta_neg_high} >= 0 required"
        )
    if seq_cap <= 0:
        raise ValueError(f"tbpo_seq_cap={seq_cap}; must be > 0")
    _check_shapes("tbpo", logp=logp, prox_logp=prox_logp, behav_logp=behav_logp, advantages=advantages, mask=mask)
    assert prox_logp is not None and behav_logp is not None
    m = _fmask(mask, logp)
    valid_seq = m.sum(-1) > 0  # [B]
    n_seq = valid_seq.to(m).sum().clamp(min=1)

    # GSPO-style length-normalised sequence ratio (arXiv 2507.18071 Eq. 7), gradient via logp.
    log_r_seq = masked_mean(logp - prox_logp.detach(), m, dim=-1).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B]
    r_seq = torch.exp(log_r_seq)  # [B]
    log_r = (prox_logp - behav_logp).detach()  # [B, T]
    # geomean: mean_t log r (QaRL, length-normalised); product: sum_t log r (verl's sequence IS weight)
    log_w = (masked_mean(log_r, m, dim=-1) if seq_weight == "geomean" else (log_r * m).sum(-1))  # [B]
    log_w = log_w.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B]
    w_raw = torch.exp(log_w)  # [B]
    w = w_raw.clamp(max=seq_cap)  # [B]

    R = r_seq[:, None].expand_as(advantages)  # [B, T]
    pos = advantages > 0  # [B, T]
    neg = advantages < 0  # [B, T]
    hi_pos = 1.0 + delta_pos
    in_band = (R >= 1.0 - delta_neg_low) & (R <= 1.0 + delta_neg_high)  # [B, T]
    obj_pos = advantages * R.clamp(max=hi_pos)  # [B, T]; = min(R A, clip(R, ., hi) A) for A > 0
    obj_neg = torch.where(in_band, advantages * R, torch.zeros_like(R))  # [B, T]; outside band: masked
    obj = torch.where(pos, obj_pos, torch.where(neg, obj_neg, torch.zeros_like(R)))  # [B, T]
    loss_t = -w[:, None] * obj  # [B, T]
    loss = agg_loss(loss_t, m, agg)

    valid_tok = m != 0
    masked_tok = neg & ~in_band & valid_tok  # [B, T]
    pos_clip_tok = pos & (R > hi_pos) & valid_tok  # [B, T]
    stats = {
        "actor/pg_clipfrac": _f(masked_mean((masked_tok | pos_clip_tok).to(m), m)),
        "actor/ppo_kl": _f(masked_mean(prox_logp - logp, m)),
        "actor/tbpo_masked_seq_frac": _f((masked_tok.any(-1) & valid_seq).to(m).sum() / n_seq),
        "actor/tbpo_pos_clip_seq_frac": _f((pos_clip_tok.any(-1) & valid_seq).to(m).sum() / n_seq),
        "actor/tbpo_seq_ratio_mean": _f(masked_mean(r_seq, valid_seq)),
        "rollout_corr/rollout_is_mean": _f(masked_mean(w[:, None].expand_as(m), m)),
        "rollout_corr/rollout_is_max": (_f(torch.where(valid_seq, w, torch.zeros_like(w)).amax())
                                        if bool(valid_seq.any()) else 0.0),
        "rollout_corr/rollout_is_ratio_fraction_high": _f(((w_raw > seq_cap) & valid_seq).to(m).sum() / n_seq),
    }
    return loss, stats


def value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_range_value: float,
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss, as verl ``compute_value_loss`` (PPO, Schulman et al. 2017; trl):

    ``0.5 * agg(max((V - G)^2, (clip(V, V_old - c, V_old + c) - G)^2))``.
    Stats: ``critic/vf_clipfrac`` (clipped term larger), ``critic/vpred_mean``.
    """
    vclip = torch.maximum(torch.minimum(vpreds, values + clip_range_value), values - clip_range_value)  # [B, T]
    l1 = (vpreds - returns) ** 2  # [B, T]
    l2 = (vclip - returns) ** 2  # [B, T]
    loss = 0.5 * agg_loss(torch.maximum(l1, l2), mask, agg)
    m = _fmask(mask, vpreds)
    stats = {
        "critic/vf_clipfrac": _f(masked_mean((l2 > l1).to(m), m)),
        "critic/vpred_mean": _f(masked_mean(vpreds, m)),
    }
    return loss, stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of softmax(logits) over the last axis: [..., V] -> [...].

    ``logsumexp(z) - sum(softmax(z) * z)``, as verl ``torch_functional.entropy_from_logits``.
    """
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


__all__ = [
    "AGG_MODES",
    "CORRECTIONS",
    "Correction",
    "agg_loss",
    "entropy_from_logits",
    "masked_mean",
    "masked_sum",
    "policy_loss",
    "register_correction",
    "value_loss",
]
