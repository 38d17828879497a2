"""Mismatch metrics between the rollout (behav) and trainer (prox) policies, and weight-update
visibility through the quantizer (the quantity UAQ exists to raise, QuRL arXiv 2602.13953).

``rollout_corr_metrics`` reproduces verl 0.9.1
``verl.trainer.ppo.rollout_corr_helper.compute_offpolicy_metrics`` key for key (with verl's
``rollout_corr/`` prefix), with ``old_log_prob`` = our ``prox_logp`` (the full-precision
trainer) and ``rollout_log_prob`` = our ``behav_logp`` (the quantized rollout actor).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from suite.core.losses import masked_mean, masked_sum
from suite.core.quant import QuantScheme, dequantize, quant_step, quantize

SAFETY_BOUND = 20.0  # verl rollout_corr_helper.SAFETY_BOUND: clamp on log-ratios before exp


def rollout_corr_metrics(
    prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Off-policy diagnostics of the rollout/trainer mismatch, as verl ``compute_offpolicy_metrics``.

    With ``rho = pi_prox / pi_behav`` per token ([B, T] inputs; means over valid tokens unless
    noted; "per sequence" means use the mean log-prob over the sequence's valid tokens):
      ``rollout_corr/kl``            mean(behav - prox): direct estimator of KL(behav || prox)
      ``rollout_corr/k3_kl``         mean(rho - log rho - 1): k3 estimator of KL(behav || prox)
      ``rollout_corr/training_ppl``  batch mean of per-sequence exp(-mean prox); ``training_log_ppl``
      ``rollout_corr/rollout_ppl``   same for behav; ``rollout_log_ppl``
      ``rollout_corr/log_ppl_diff``  batch mean of per-sequence (mean behav - mean prox)
                                     (= log(training_ppl / rollout_ppl) per sequence);
                                     ``log_ppl_abs_diff``, ``log_ppl_diff_max``, ``log_ppl_diff_min``
      ``rollout_corr/ppl_ratio``     batch mean of exp(log_ppl_diff)
      ``rollout_corr/chi2_token``    mean(rho^2) - 1, log rho clamped to +-20
      ``rollout_corr/chi2_seq``      batch mean of (prod_t rho_t)^2 - 1, sum of log rho clamped to +-20
    Batch means run over all B rows, as verl's (a row with no valid token counts with log-prob 0).
    verl's masked means add 1e-8 to the denominator; ours divide exactly.
    """
    if not bool(mask.any()):
        raise ValueError("rollout_corr_metrics: mask has no valid token")
    m = mask.to(prox_logp.dtype)
    mean_prox = masked_mean(prox_logp, m, dim=-1)  # [B]
    mean_behav = masked_mean(behav_logp, m, dim=-1)  # [B]
    log_ratio = prox_logp - behav_logp  # [B, T]; log rho
    log_ppl_diff = mean_behav - mean_prox  # [B]
    rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))  # [B, T]
    log_rho_seq = masked_sum(log_ratio, m, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B]
    out = {
        "training_ppl": torch.exp(-mean_prox).mean(),
        "training_log_ppl": (-mean_prox).mean(),
        "kl": masked_mean(behav_logp - prox_logp, m),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, m),
        "rollout_ppl": torch.exp(-mean_behav).mean(),
        "rollout_log_ppl": (-mean_behav).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "chi2_token": masked_mean(rho.square(), m) - 1.0,
        "chi2_seq": torch.exp(2.0 * log_rho_seq).mean() - 1.0,
    }
    return {f"rollout_corr/{k}": float(v.detach()) for k, v in out.items()}


# ----------------------------------------------------------------------------- visibility

_SUM_KEYS = ("n", "n_fp_changed", "n_visible", "n_code_changed", "ratio_sum", "n_ratio", "upd_sq", "step_sq")


def _codes_as_float(q) -> torch.Tensor:
    # float8 has no comparison kernels on CPU; +0 and -0 codes compare equal as floats.
    return q.codes.to(torch.float32) if q.codes.dtype != torch.float64 else q.codes


@torch.no_grad()
def _visibility_sums(
    before: torch.Tensor, after: torch.Tensor, scheme: QuantScheme, name: str | None
) -> dict[str, float]:
    if before.shape != after.shape:
        raise ValueError(f"{name or 'tensor'}: before {tuple(before.shape)} vs after {tuple(after.shape)}")
    b = before.detach()
    a = after.detach().to(b.dtype)
    qb = quantize(b, scheme, name=name)
    qa = quantize(a, scheme, name=name)
    visible = dequantize(qb, torch.float64) != dequantize(qa, torch.float64)  # each with its own scales
    code_changed = _codes_as_float(qb) != _codes_as_float(qa)
    step = quant_step(b, scheme, name=name).to(torch.float64)
    delta = (a.to(torch.float64) - b.to(torch.float64)).abs()
    has_step = step > 0
    ratio = torch.where(has_step, delta / torch.where(has_step, step, torch.ones_like(step)), torch.zeros_like(step))
    return {
        "n": float(b.numel()),
        "n_fp_changed": float((delta > 0).sum()),
        "n_visible": float(visible.sum()),
        "n_code_changed": float(code_changed.sum()),
        "ratio_sum": float(ratio.sum()),
        "n_ratio": float(has_step.sum()),
        "upd_sq": float(delta.square().sum()),
        "step_sq": float(step.square().sum()),
    }


def _visibility_from_sums(s: dict[str, float]) -> dict[str, float]:
    n = max(s["n"], 1.0)
    if s["step_sq"] > 0:
        norm_ratio = math.sqrt(s["upd_sq"] / s["step_sq"])
    else:
        norm_ratio = math.inf if s["upd_sq"] > 0 else 0.0
    return {
        "quant/update_fp_changed_frac": s["n_fp_changed"] / n,
        "quant/update_visible_frac": s["n_visible"] / n,
        "quant/update_code_changed_frac": s["n_code_changed"] / n,
        "quant/update_step_ratio": s["ratio_sum"] / max(s["n_ratio"], 1.0),
        "quant/update_norm_ratio": norm_ratio,
        "quant/update_rms": math.sqrt(s["upd_sq"] / n),
        "quant/step_rms": math.sqrt(s["step_sq"] / n),
    }


def update_visibility(
    before: torch.Tensor, after: torch.Tensor, scheme: QuantScheme, *, name: str | None = None
) -> dict[str, float]:
    """How much of a full-precision weight update the quantized rollout actor can see.

    ``before`` / ``after``: the full-precision weight [out, in] at two consecutive weight syncs.
    Each is quantized with its own scales (as the engine re-quantizes every sync). Keys:
      ``quant/update_fp_changed_frac``   fraction of entries with after != before
      ``quant/update_visible_frac``      fraction whose dequantized value changed
                                         (``fake_quant(after) != fake_quant(before)``): what
                                         the rollout actor actually sees change
      ``quant/update_code_changed_frac`` fraction whose stored code changed (a scale change
                                         alone moves values without moving codes)
      ``quant/update_step_ratio``        mean over entries of ``|after - before| / quant_step(before)``
                                         (entries with step 0, i.e. all-zero rows, are left out)
      ``quant/update_norm_ratio``        ``||after - before||_F / ||quant_step(before)||_F``
      ``quant/update_rms``, ``quant/step_rms``  the two RMS values of that ratio
    An update is invisible in expectation when the ratios are << 1/2 (QuRL Sec. 3.3: updates
    ~1e-7 against steps ~1e-3); UAQ multiplies the step ratio by about s**2 under SGD.
    """
    return _visibility_from_sums(_visibility_sums(before, after, scheme, name))


def model_update_visibility(
    before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor], scheme: QuantScheme
) -> dict[str, float]:
    """:func:`update_visibility` over named tensors (e.g. the quantized linear weights), pooled
    over entries: fractions and the step ratio are entry-weighted means over all tensors, and
    the norm ratio is ``sqrt(sum ||dW||^2 / sum ||step||^2)``. Same keys."""
    if set(before) != set(after):
        raise ValueError(f"before/after name sets differ: {sorted(set(before) ^ set(after))}")
    total = dict.fromkeys(_SUM_KEYS, 0.0)
    for name in before:
        for k, v in _visibility_sums(before[name], after[name], scheme, name).items():
            total[k] += v
    return _visibility_from_sums(total)


__all__ = ["model_update_visibility", "rollout_corr_metrics", "update_visibility"]
