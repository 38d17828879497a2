"""Mismatch metrics between the rollout (behav) and trainer (prox) policies, their token-level
distribution, QaRL's error tokens (repetitive responses, arXiv 2604.07853), and weight-update
visibility through the quantizer (the quantity UAQ exists to raise, QuRL arXiv 2602.13953).

``rollout_corr_metrics`` reproduces verl 0.9.1
``verl.trainer.ppo.rollout_corr_helper.compute_offpolicy_metrics`` key for key (with verl's
``rollout_corr/`` prefix), with ``old_log_prob`` = our ``prox_logp`` (the full-precision
trainer) and ``rollout_log_prob`` = our ``behav_logp`` (the quantized rollout actor).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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


# ----------------------------------------------------------------------------- ratio distribution

# Token quantiles logged for r = pi_prox / pi_behav and R = pi_theta / pi_prox (key suffix -> q).
RATIO_QUANTILES = {"p1": 0.01, "p50": 0.5, "p99": 0.99}
# r outside [1/2, 2]: a token whose probability the quantized rollout got wrong by 2x or more.
RATIO_FRAC_LOW, RATIO_FRAC_HIGH = 0.5, 2.0


def masked_quantiles(values: torch.Tensor, mask: torch.Tensor, q: Sequence[float]) -> torch.Tensor:
    """Quantiles ``q`` of ``values`` over the tokens where ``mask`` is set, with the linear
    interpolation of ``numpy.quantile`` / ``torch.quantile`` (their default), in float64.

    ``values``, ``mask``: [B, T]; returns [len(q)]. Unlike ``torch.quantile`` it has no input size
    limit (a sort). An empty mask is an error.
    """
    v = values.detach()[mask.bool()].to(torch.float64).sort().values  # [N] valid tokens, ascending
    if v.numel() == 0:
        raise ValueError("masked_quantiles: mask has no valid token")
    qs = torch.tensor(list(q), dtype=torch.float64, device=v.device)  # [Q]
    if bool(((qs < 0) | (qs > 1)).any()):
        raise ValueError(f"quantiles must be in [0, 1], got {list(q)}")
    pos = qs * (v.numel() - 1)  # [Q] fractional rank
    lo = pos.floor().long()  # [Q]
    hi = pos.ceil().long()  # [Q]
    return torch.lerp(v[lo], v[hi], pos - lo.to(torch.float64))  # [Q]


def ratio_quantile_metrics(log_ratio: torch.Tensor, mask: torch.Tensor, prefix: str) -> dict[str, float]:
    """``{prefix}ratio_p1``, ``_p50``, ``_p99``: token quantiles of ``exp(clamp(log_ratio, +-20))``
    over the valid tokens of [B, T] ``log_ratio`` (the clamp is verl's SAFETY_BOUND)."""
    ratio = torch.exp(log_ratio.detach().to(torch.float64).clamp(-SAFETY_BOUND, SAFETY_BOUND))  # [B, T]
    vals = masked_quantiles(ratio, mask, list(RATIO_QUANTILES.values()))  # [Q]
    return {f"{prefix}ratio_{name}": float(v) for name, v in zip(RATIO_QUANTILES, vals)}


def mismatch_ratio_metrics(prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Token-level distribution of the rollout mismatch ``r = pi_prox / pi_behav`` ([B, T] inputs).

    ``rollout_corr/ratio_p1``, ``_p50``, ``_p99``    token quantiles of r (:func:`ratio_quantile_metrics`)
    ``rollout_corr/ratio_frac_below_0.5``            fraction of valid tokens with r < 0.5
    ``rollout_corr/ratio_frac_above_2``              fraction of valid tokens with r > 2
    verl 0.9.1 has no quantile of r; its ``rollout_is_ratio_fraction_high/_low`` count the same
    tails only for its configured IS threshold, hence fixed thresholds here. The fractions
    compare log r with log 0.5 and log 2 (verl's log-space checks).
    """
    log_r = (prox_logp - behav_logp).detach()  # [B, T]
    out = ratio_quantile_metrics(log_r, mask, "rollout_corr/")
    m = mask.to(log_r.dtype)
    out[f"rollout_corr/ratio_frac_below_{RATIO_FRAC_LOW:g}"] = float(
        masked_mean((log_r < math.log(RATIO_FRAC_LOW)).to(m), m))
    out[f"rollout_corr/ratio_frac_above_{RATIO_FRAC_HIGH:g}"] = float(
        masked_mean((log_r > math.log(RATIO_FRAC_HIGH)).to(m), m))
    return out


def policy_ratio_metrics(logp: torch.Tensor, prox_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``actor/ratio_p1``, ``_p50``, ``_p99``: token quantiles of the PPO ratio ``R = pi_theta / pi_prox``
    over the valid tokens of one (mini/micro-)batch ([B, T] inputs); R is pi_theta / pi_prox whatever
    the clip anchor of the loss mode."""
    return ratio_quantile_metrics(logp.detach() - prox_logp.detach(), mask, "actor/")


# ----------------------------------------------------------------------------- error tokens

REP_NGRAM = 4  # n of the n-gram repetition rate
ERROR_REP_THRESHOLD = 0.5  # a truncated response with at least this repetition rate is an error response


def ngram_repetition_rate(tokens: torch.Tensor, mask: torch.Tensor, n: int = REP_NGRAM) -> torch.Tensor:
    """Per response, the fraction of its n-grams that repeat an n-gram seen earlier in it.

    ``tokens``, ``mask``: [B, R] response token ids and valid-token mask. The n-grams of a row are
    its windows of n consecutive valid tokens; with W of them and D distinct,
    ``rate = (W - D) / W`` (0 when W = 0). E.g. ``[5, 6, 7, 8] * 3``: W = 9, D = 4, rate 5/9;
    a run of one token repeated L >= n times: (L - n) / (L - n + 1). Returns [B] float64.

    Exact and vectorised: each row's windows are sorted lexicographically (n + 1 stable sorts),
    so equal n-grams are adjacent and the repeats are the windows equal to their predecessor.
    """
    if n < 1:
        raise ValueError(f"n={n}; must be >= 1")
    B, R = tokens.shape
    if R < n:
        return torch.zeros(B, dtype=torch.float64, device=tokens.device)
    win = tokens.long().unfold(1, n, 1)  # [B, W, n]
    valid = mask.bool().unfold(1, n, 1).all(-1)  # [B, W]
    W = win.shape[1]
    order = torch.arange(W, device=tokens.device).expand(B, W)  # [B, W]
    # Radix sort, least significant key first: token n-1, ..., token 0, then validity (invalid last).
    keys = [win[..., j] for j in reversed(range(n))] + [(~valid).long()]
    for key in keys:
        k = key.gather(1, order)  # [B, W] key in the current order
        order = order.gather(1, torch.sort(k, dim=1, stable=True).indices)  # [B, W]
    s = win.gather(1, order[..., None].expand(B, W, n))  # [B, W, n] sorted n-grams
    sv = valid.gather(1, order)  # [B, W]
    repeat = (s[:, 1:] == s[:, :-1]).all(-1) & sv[:, 1:] & sv[:, :-1]  # [B, W - 1]
    n_win = valid.sum(-1).to(torch.float64)  # [B]
    return repeat.sum(-1).to(torch.float64) / n_win.clamp(min=1.0)  # [B]


def longest_token_run(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per response, the length of its longest run of one token id repeated at consecutive valid
    positions (``[3, 3, 3, 4]`` -> 3); 0 for an empty response.

    ``tokens``, ``mask``: [B, R]; returns [B] long. Vectorised: the run length at t is t minus the
    last position <= t that starts a run, plus 1 (a cumulative max).
    """
    B, R = tokens.shape
    valid = mask.bool()  # [B, R]
    pos = torch.arange(R, device=tokens.device).expand(B, R)  # [B, R]
    same = torch.zeros_like(valid)  # [B, R]: continues the run of the previous position
    same[:, 1:] = (tokens[:, 1:] == tokens[:, :-1]) & valid[:, 1:] & valid[:, :-1]
    start = torch.where(same, torch.zeros_like(pos), pos).cummax(dim=1).values  # [B, R] current run start
    run = (pos - start + 1) * valid  # [B, R]
    return run.amax(dim=1) if R else torch.zeros(B, dtype=torch.long, device=tokens.device)  # [B]


def error_token_metrics(
    tokens: torch.Tensor, mask: torch.Tensor, truncated: torch.Tensor, *,
    n: int = REP_NGRAM, threshold: float = ERROR_REP_THRESHOLD,
) -> dict[str, float]:
    """QaRL's error tokens (arXiv 2604.07853: long quantized-rollout responses turn repetitive and
    garbled, and the repetition a mid-response error induces runs on, Fig. 6), per step.

    ``tokens``, ``mask``: [B, R] response ids and valid mask (incl. the stop token); ``truncated``:
    [B] bool, the response hit max_new_tokens without the stop token. Means run over the B responses:
      ``response/rep4_rate/mean``, ``/max``     :func:`ngram_repetition_rate` (n = 4)
      ``response/longest_run/mean``, ``/max``   :func:`longest_token_run`, tokens
      ``response/error_ratio``                  fraction of error responses: truncated and
                                                repetition rate >= ``threshold`` (0.5: at least half
                                                its n-grams are repeats). A repetition loop never
                                                emits the stop token, and requiring truncation keeps
                                                short answers with a repeated sub-string out.
    Garbled tokens that do not repeat are not detectable from ids alone and are not counted.
    """
    rate = ngram_repetition_rate(tokens, mask, n)  # [B]
    run = longest_token_run(tokens, mask).to(torch.float64)  # [B]
    error = truncated.bool().to(rate.device) & (rate >= threshold)  # [B]
    return {
        f"response/rep{n}_rate/mean": float(rate.mean()),
        f"response/rep{n}_rate/max": float(rate.max()),
        "response/longest_run/mean": float(run.mean()),
        "response/longest_run/max": float(run.max()),
        "response/error_ratio": float(error.to(torch.float64).mean()),
    }


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


__all__ = [
    "error_token_metrics", "longest_token_run", "masked_quantiles", "mismatch_ratio_metrics",
    "model_update_visibility", "ngram_repetition_rate", "policy_ratio_metrics", "ratio_quantile_metrics",
    "rollout_corr_metrics", "update_visibility",
]
