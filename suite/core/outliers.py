"""Activation outliers by invariant rescaling: the inverse of SmoothQuant, for the INT8 dose axis.

The papers' INT8 (W8A8) mismatch comes from activation outliers: a few hidden channels of a
pretrained LLM carry values 10-100x the rest, so a per-token INT8 scale ``max_c |x_c| / 127`` is
set by them and every other channel of the token is quantized coarsely (Dettmers et al. 2022,
LLM.int8(), arXiv 2208.07339; SmoothQuant, Xiao et al. 2023, arXiv 2211.10438, Sec. 3). A tiny
model trained from scratch has none. SmoothQuant removes them by the per-channel invariant
``y = W x = (W diag(s)) (diag(s)^-1 x)``; we put them in with the inverse:

    a_c = alpha for c in C (the chosen channels), 1 otherwise
    gamma' = a * gamma            (the norm's gain, per channel)
    W'     = W diag(a)^-1         (each fed linear's input column c divided by a_c)
    W' (gamma' * xhat) = sum_c (W_:c / a_c) (a_c gamma_c xhat_c) = W (gamma * xhat)

for each norm and the linears it feeds (the UAQ mapping, suite.core.uaq ``MAPPINGS``: attention
norm -> q, k, v; MLP norm -> gate, up). UAQ is the scalar case ``a = s``. The function is
unchanged in exact arithmetic, and bit for bit in floating point when alpha is a power of two
(scaling by 2**k is exact, barring overflow and subnormals), so the full-precision model, its
log-probs and its gradients are those of the untransformed model, while the rollout's per-token
INT8 activations of the chosen channels are alpha times larger than the rest and the token's
scale grows with them.

Where it is applied (docs/math.md, "Activation outliers"): at every use of the weights by the
quantized rollout (the engine's weight sync) and by QaRL's aligned forward, on the trainer's
untransformed master weights. That is UAQ's per-group learning-rate compensation made exact:
applied once to the master weights, Adam would move ``W'_:c`` by about lr, i.e. ``W_:c`` by
``alpha * lr``, and ``gamma'_c`` by lr, i.e. ``gamma_c`` by ``lr / alpha`` (suite.core.uaq
``uaq_param_groups``), and the compensating rates ``lr / alpha`` and ``lr * alpha`` would fall on
single columns / entries of a tensor, which AdamW's parameter groups cannot address (the
gradient clip would see the ``alpha``-times larger column gradients too). Transforming at use
leaves the optimizer in the original coordinates: Adam's geometry and the clip are exactly the
untransformed run's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from suite.core.uaq import MappingSpec, uaq_pairs

Pairs = list[tuple[str, list[str]]]  # [(norm module name, [fed linear module names])]


def outlier_channels(dim: int, k: int) -> torch.Tensor:
    """The ``k`` channels of a width-``dim`` hidden state that carry the outliers: evenly spaced,
    ``c_i = floor(i * dim / k)`` for i < k (fixed, so every dose and seed scales the same ones).
    -> long [k]."""
    if not 0 <= k <= dim:
        raise ValueError(f"outlier channels k={k}; must be in [0, {dim}] (the hidden width)")
    return torch.tensor([(i * dim) // k for i in range(k)], dtype=torch.long)


def outlier_scale(dim: int, k: int, alpha: float, *, dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """The per-channel factor ``a`` [dim]: ``alpha`` on :func:`outlier_channels`, 1 elsewhere."""
    alpha = float(alpha)
    if not math.isfinite(alpha) or alpha <= 0.0:
        raise ValueError(f"outlier alpha={alpha}; must be finite and > 0")
    a = torch.ones(dim, dtype=dtype, device=device)
    a[outlier_channels(dim, k).to(a.device)] = alpha
    return a


def outlier_transform(params: Mapping[str, torch.Tensor], pairs: Pairs, alpha: float,
                      k: int) -> dict[str, torch.Tensor]:
    """``params`` (parameter name -> tensor) with the outlier transform applied; a new dict.

    For each (norm, linears) of ``pairs`` (:func:`outlier_pairs`): ``<norm>.weight`` (and a
    LayerNorm ``<norm>.bias``) times ``a``, each ``<linear>.weight`` [out, in] divided by ``a``
    along its input axis. Names of ``pairs`` missing from ``params`` are skipped (a dict of the
    quantized weights alone is transformed as they are in the full model). Differentiable and
    out of place: gradients flow back to the untransformed tensors. Other entries are the same
    tensor objects.
    """
    out = dict(params)
    for norm, linears in pairs:
        gains = [n for n in (f"{norm}.weight", f"{norm}.bias") if n in params]
        weights = [f"{lin}.weight" for lin in linears if f"{lin}.weight" in params]
        if not gains and not weights:
            continue
        ref = params[gains[0]] if gains else params[weights[0]]
        dim = ref.shape[0] if gains else ref.shape[1]
        a = outlier_scale(dim, k, alpha, dtype=ref.dtype, device=ref.device)  # [D]
        for name in gains:
            out[name] = params[name] * a  # [D]
        for name in weights:
            out[name] = params[name] / a  # [out, D] / [D]: input column c divided by a_c
    return out


def outlier_pairs(model: nn.Module, mapping: MappingSpec = "embedded") -> Pairs:
    """The (norm, fed linears) pairs of ``model`` the transform rescales: UAQ's mapping, validated
    (suite.core.uaq ``uaq_pairs``: gains 1-D, widths matching, nothing scaled twice)."""
    return uaq_pairs(model, mapping)


@torch.no_grad()
def apply_outliers(model: nn.Module, alpha: float, k: int, mapping: MappingSpec = "embedded") -> Pairs:
    """Apply the transform to ``model``'s parameters in place (e.g. to inspect a transformed
    model); runs apply it at use instead (module docstring). Returns the pairs rescaled."""
    pairs = outlier_pairs(model, mapping)
    params = dict(model.named_parameters())
    for name, value in outlier_transform(params, pairs, alpha, k).items():
        if value is not params[name]:
            params[name].copy_(value)
    return pairs


@torch.no_grad()
def undo_outliers(model: nn.Module, alpha: float, k: int, mapping: MappingSpec = "embedded") -> Pairs:
    """Invert :func:`apply_outliers` in place (the transform with ``1 / alpha``)."""
    return apply_outliers(model, 1.0 / float(alpha), k, mapping)


__all__ = ["apply_outliers", "outlier_channels", "outlier_pairs", "outlier_scale", "outlier_transform",
           "undo_outliers"]
