"""UAQ: update-aware quantization by invariant scaling (QuRL, arXiv 2602.13953, Sec. 3.3).

For a normalisation layer with gain gamma feeding linear layers W (q/k/v; gate/up):

    y = W (gamma * xhat)  =  (W / s) ((s * gamma) * xhat)

so multiplying gamma by s and dividing the *input columns* of every fed W by s leaves the
network's function unchanged in exact arithmetic. Because every input column is divided by
the same s, "divide the input columns by s" is ``W / s`` for the whole weight [out, in].

Why it helps: a per-output-channel quantizer's step is ``max_j |W_ij| / 127``, so the step of
``W / s`` is s times smaller (the absolute quantization error shrinks by s), while an SGD
gradient w.r.t. ``W / s`` is s times larger (its input ``s * xhat`` is s times larger), so the
update grows by s: an s**2 gain in update-to-quantization-noise (about s with Adam, whose
update size does not scale with the gradient). Paper default s = 1.5; s = 2 was unstable.

The transform is applied once before RL and undone for export. In floating point
``undo(apply(m))`` is bit-exact when s is a power of two, and within one rounding (1 ulp) per
entry otherwise.

A LayerNorm bias, if present, is scaled with the gain (``s * (gamma * xhat + beta)``), which is
what keeps the fed linear layers' inputs exactly ``s`` times larger; linear biases are left
alone since ``(W / s)(s x) + b = W x + b``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

# {norm module suffix: [linear module suffixes it feeds]}, matched within each block: a norm
# named "<prefix><norm_suffix>" feeds "<prefix><linear_suffix>".
MAPPINGS: dict[str, dict[str, list[str]]] = {
    # suite.embedded.model: layers.{i}.attn_norm -> attn.{wq,wk,wv}; mlp_norm -> mlp.{w_gate,w_up}
    "embedded": {
        "attn_norm": ["attn.wq", "attn.wk", "attn.wv"],
        "mlp_norm": ["mlp.w_gate", "mlp.w_up"],
    },
    # Hugging Face LlamaForCausalLM: model.layers.{i}.input_layernorm -> self_attn.{q,k,v}_proj;
    # post_attention_layernorm -> mlp.{gate,up}_proj
    "llama": {
        "input_layernorm": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
        "post_attention_layernorm": ["mlp.gate_proj", "mlp.up_proj"],
    },
}
MAPPINGS["qwen2"] = MAPPINGS["llama"]  # Qwen2ForCausalLM uses the Llama module names

MappingSpec = str | Mapping[str, list[str]]


def resolve_mapping(mapping: MappingSpec) -> dict[str, list[str]]:
    """A mapping name ("embedded" | "llama" | "qwen2") or an explicit {norm: [linears]} dict."""
    if isinstance(mapping, str):
        if mapping not in MAPPINGS:
            raise ValueError(f"unknown UAQ mapping {mapping!r}; allowed: {sorted(MAPPINGS)} or a dict")
        return MAPPINGS[mapping]
    if not mapping:
        raise ValueError("UAQ mapping is empty")
    return {str(k): list(v) for k, v in mapping.items()}


def _check_s(s: float) -> float:
    s = float(s)
    if not math.isfinite(s) or s <= 0.0:
        raise ValueError(f"UAQ scale s={s}; must be finite and > 0")
    return s


def uaq_pairs(model: nn.Module, mapping: MappingSpec) -> list[tuple[str, list[str]]]:
    """Validate ``mapping`` against ``model`` and return [(norm name, [linear names])].

    Raises ValueError (and changes nothing) when: no norm matches, a fed linear is missing
    or has no 2-D weight, a norm has no 1-D gain, a gain's size differs from a linear's
    ``in_features``, or a parameter would be scaled twice (tied/shared weights).
    """
    spec = resolve_mapping(mapping)
    modules = dict(model.named_modules())
    pairs: list[tuple[str, list[str]]] = []
    for norm_suffix, lin_suffixes in spec.items():
        for name in modules:
            if name == norm_suffix:
                prefix = ""
            elif name.endswith("." + norm_suffix):
                prefix = name[: -len(norm_suffix)]
            else:
                continue
            pairs.append((name, [prefix + ls for ls in lin_suffixes]))
    if not pairs:
        raise ValueError(
            f"UAQ mapping {dict(spec)} matched no norm module in {type(model).__name__}"
        )
    seen: dict[int, str] = {}

    def claim(p: torch.Tensor, who: str) -> None:
        if id(p) in seen:
            raise ValueError(f"UAQ would scale one parameter twice: {seen[id(p)]} and {who} (tied weights?)")
        seen[id(p)] = who

    for norm_name, lin_names in pairs:
        gain = getattr(modules[norm_name], "weight", None)
        if not isinstance(gain, torch.Tensor) or gain.dim() != 1:
            raise ValueError(f"UAQ: norm {norm_name!r} has no 1-D gain .weight")
        claim(gain, f"{norm_name}.weight")
        bias = getattr(modules[norm_name], "bias", None)
        if isinstance(bias, torch.Tensor):
            claim(bias, f"{norm_name}.bias")
        for lin_name in lin_names:
            if lin_name not in modules:
                raise ValueError(f"UAQ: module {lin_name!r} (fed by {norm_name!r}) does not exist")
            w = getattr(modules[lin_name], "weight", None)
            if not isinstance(w, torch.Tensor) or w.dim() != 2:
                raise ValueError(f"UAQ: {lin_name!r} has no 2-D weight [out, in]")
            if w.shape[1] != gain.shape[0]:
                raise ValueError(
                    f"UAQ: {norm_name}.weight has {gain.shape[0]} entries but {lin_name}.weight "
                    f"has in_features={w.shape[1]}"
                )
            claim(w, f"{lin_name}.weight")
    return pairs


@torch.no_grad()
def _scale(model: nn.Module, pairs: list[tuple[str, list[str]]], s: float, undo: bool) -> None:
    modules = dict(model.named_modules())
    for norm_name, lin_names in pairs:
        norm = modules[norm_name]
        params = [norm.weight] + ([norm.bias] if isinstance(getattr(norm, "bias", None), torch.Tensor) else [])
        for p in params:
            p.div_(s) if undo else p.mul_(s)
        for lin_name in lin_names:
            w = modules[lin_name].weight  # all input columns alike: W / s
            w.mul_(s) if undo else w.div_(s)


def apply_uaq(model: nn.Module, s: float, mapping: MappingSpec) -> list[tuple[str, list[str]]]:
    """Apply UAQ in place: gain *= s, fed linear weights /= s (QuRL Sec. 3.3, ``WX = (W/s)(sX)``).

    Everything is validated before the first parameter changes, so an error never leaves a
    half-transformed model. Returns the (norm, linears) pairs that were scaled.
    """
    s = _check_s(s)
    pairs = uaq_pairs(model, mapping)
    _scale(model, pairs, s, undo=False)
    return pairs


def undo_uaq(model: nn.Module, s: float, mapping: MappingSpec) -> list[tuple[str, list[str]]]:
    """Invert :func:`apply_uaq` in place (gain /= s, fed linear weights *= s), e.g. for export."""
    s = _check_s(s)
    pairs = uaq_pairs(model, mapping)
    _scale(model, pairs, s, undo=True)
    return pairs


def uaq_param_groups(model: nn.Module, lr: float, s: float, mapping: MappingSpec,
                     weight_decay: float = 0.0) -> list[dict]:
    """AdamW parameter groups that make plain training behave as UAQ with scale ``s`` under Adam:
    the fed linear weights at ``lr * s``, the norm gains (and biases) at ``lr / s``, the rest at
    ``lr``; decoupled weight decay ``weight_decay / s`` and ``weight_decay * s`` on the first two.

    Why: Adam's step is invariant to a constant gradient scale. After UAQ, W' = W/s gets the
    gradient s * dL/dW and moves by lr * (Adam-normalised direction), i.e. W = s W' moves by
    s * lr; gamma' = s gamma gets dL/dgamma / s and moves by lr, i.e. gamma moves by lr / s. So
    with symmetric absmax quantizers (for which ``Q(W/s) = Q(W)/s``: UAQ leaves the rollout's
    codes unchanged) UAQ under Adam *is* this per-group learning rate, up to Adam's eps.
    Decoupled decay shrinks W' = W/s by ``lr * wd`` per step, i.e. W by the same factor, so the
    control's groups at ``lr * s`` / ``lr / s`` take ``wd / s`` / ``wd * s``.
    tests/core/test_core_uaq.py checks the equivalence step by step.
    """
    s = _check_s(s)
    pairs = uaq_pairs(model, mapping)
    modules = dict(model.named_modules())
    up, down = [], []
    for norm_name, linears in pairs:
        down += [p for p in modules[norm_name].parameters(recurse=False)]  # gain (and a LayerNorm bias)
        up += [modules[name].weight for name in linears]
    chosen = {id(p) for p in up + down}
    rest = [p for p in model.parameters() if id(p) not in chosen]
    return [{"params": up, "lr": lr * s, "weight_decay": weight_decay / s, "uaq_group": "fed_linears"},
            {"params": down, "lr": lr / s, "weight_decay": weight_decay * s, "uaq_group": "norm_gains"},
            {"params": rest, "lr": lr, "weight_decay": weight_decay, "uaq_group": "rest"}]


__all__ = ["MAPPINGS", "apply_uaq", "resolve_mapping", "uaq_pairs", "uaq_param_groups", "undo_uaq"]
