"""The quantizer registry: one :class:`Quantizer` per rollout precision, and the generic API.

What the rollout engine runs (docs/math.md, "Quantization"): every precision is one entry of
:data:`QUANTIZERS`, registered with :func:`register_quantizer` (the pattern of the correction
registry in suite.core.losses, after verl's ``@register_policy_loss``): how it quantizes,
decodes and fake-quantizes a weight, its quantization step, whether it quantizes activations
too (W8A8), and which GEMM a native kernel runs. Config choices, report orders and bench lists
derive from it; the backends keep what only they need beside it, keyed by the same names
(suite.embedded.qlinear ``ENGINE_LINEARS``, suite.verl.rollout_quant ``VERL_ROLLOUTS``), and
tests check that every precision has both (docs/architecture.md, "Add a precision").

- fp32: no quantization (the reference); bf16: a bfloat16 round trip (the papers' baseline).
- int8: W8A8 (QuRL, arXiv 2602.13953 Sec. 3): per-output-channel weights, per-token activations.
- fp8: E4M3 weights (per tensor, per channel or 128x128 blocks) and per-token E4M3 activations.
- w4a16: QaRL's (arXiv 2604.07853) 4-bit group-wise weights, 16-bit activations.
- wa16: the same group-wise weight-only quantizer at ``QuantScheme.bits`` in {2, 3, 4, 6, 8}
  (the dose axis W{b}A16 of the mismatch; "wa16" at 4 bits computes exactly as "w4a16").

The number formats themselves are in :mod:`suite.core.quant_formats` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from suite.core.quant_formats import (
    FP8_E4M3_MAX,
    FP8_GRANULARITIES,
    INT8_QMAX,
    act_fp8,
    act_int8,
    check_finite,
    dequantize_fp8_block,
    dequantize_scaled,
    WINT_BITS,
    WINT_GROUP_SIZES,
    dequantize_w4,
    fake_quant_int8,
    fake_quant_w4,
    fake_quant_wint,
    float_spacing,
    from_groups,
    group_len,
    pad_last,
    quantize_fp8,
    quantize_int8_per_channel,
    quantize_int8_per_token,
    quantize_w4,
    quantize_wint,
    step_fp8,
    step_int8,
    step_w4,
    step_wint,
    work_dtype,
)


@dataclass(frozen=True)
class QuantScheme:
    """How the rollout copy of a weight is quantized.

    precision: a name in :data:`QUANTIZERS` ("fp32" no quantization, "bf16" round trip through
        bfloat16, "int8" W8A8 per-output-channel weights, "fp8" E4M3 weights, "w4a16" 4-bit
        group-wise weights).
    fp8_granularity: scale layout for fp8 weights: "per_tensor" | "per_channel" | "block".
    block_size: side of the square fp8 weight block, in entries (128 as DeepSeek-V3 / vLLM).
    group_size: w4a16 / wa16 group length along the input axis, in entries (128 as GPTQ / AWQ).
    symmetric: w4a16 / wa16 symmetric (no zero point) or asymmetric (integer zero point).
    bits: wa16 weight width, one of :data:`WINT_BITS` (2, 3, 4, 6, 8); w4a16 is 4 bits whatever it says.
    """

    precision: str = "int8"
    fp8_granularity: str = "per_channel"
    block_size: int = 128
    group_size: int = 128
    symmetric: bool = True
    bits: int = 4

    def __post_init__(self) -> None:
        if self.precision not in QUANTIZERS:
            raise ValueError(f"QuantScheme.precision={self.precision!r}; allowed: {PRECISIONS}")
        if self.fp8_granularity not in FP8_GRANULARITIES:
            raise ValueError(
                f"QuantScheme.fp8_granularity={self.fp8_granularity!r}; "
                f"allowed: {FP8_GRANULARITIES}"
            )
        if self.block_size < 1:
            raise ValueError(f"QuantScheme.block_size={self.block_size}; must be >= 1")
        if self.group_size < 1:
            raise ValueError(f"QuantScheme.group_size={self.group_size}; must be >= 1")
        if self.bits not in WINT_BITS:
            raise ValueError(f"QuantScheme.bits={self.bits!r}; allowed: {WINT_BITS}")


@dataclass
class QTensor:
    """A quantized tensor: ``codes`` plus the scales (and zero points) that decode them.

    Layouts (``shape`` is the original ``[out, in]``):
      int8:  codes int8 [out, in], scales [out, 1]
      fp8:   codes float8_e4m3fn [out, in], scales [1, 1] | [out, 1] | [ceil(out/b), ceil(in/b)]
      w4a16: codes int8 (symmetric, [-8, 7]) or uint8 (asymmetric, [0, 15]) [out, in], one code
             per byte (packing two per byte is a kernel concern); scales [out, ceil(in/g)];
             zeros uint8 [out, ceil(in/g)] when asymmetric, else None
      wa16:  as w4a16, codes in [-2**(b-1), 2**(b-1) - 1] or [0, 2**b - 1] for b = scheme.bits
      fp32: codes = the tensor unchanged; bf16: codes = the tensor in bfloat16; scales None
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    zeros: torch.Tensor | None
    scheme: QuantScheme
    shape: torch.Size
    dtype: torch.dtype  # dtype of the original tensor; dequantize() returns it by default


Codes = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # (codes, scales, zeros)


@dataclass(frozen=True)
class Quantizer:
    """One rollout precision. The callables take the scheme and a tensor name for errors."""

    name: str  # config choice (quant=<name>), MLflow tag value, report label
    quantize: Callable[[torch.Tensor, QuantScheme, str | None], Codes]  # weight [out, in] -> QTensor parts
    dequantize: Callable[[QTensor, torch.dtype], torch.Tensor]  # -> [out, in] in the dtype asked
    # detached weight -> its rollout value in the same dtype (no gradient; fake_quant adds the STE)
    fake_quant: Callable[[torch.Tensor, QuantScheme, str | None], torch.Tensor]
    step: Callable[[torch.Tensor, QuantScheme, str | None], torch.Tensor]  # weight (work dtype) -> step, same shape
    # operand dtype of the native GEMM the rollout runs (suite.hardware: which kernel must be fast)
    gemm_dtype: torch.dtype
    # W8A8: float32 rows [M, K] -> their per-row (per-token) round trip; None = 16-bit activations
    act: Callable[[torch.Tensor, str | None], torch.Tensor] | None = None
    lossless: bool = False  # nothing is quantized (fp32): fake_quant is the identity, nothing to align
    low_bit: bool = True  # a low-bit rollout, not a 16/32-bit reference (report grouping)
    verl: bool = True  # backend=verl runs it (suite.verl.rollout_quant VERL_ROLLOUTS); else embedded only


QUANTIZERS: dict[str, Quantizer] = {}  # name -> Quantizer, in registration (= report) order


def register_quantizer(q: Quantizer) -> Quantizer:
    """Add ``q`` to :data:`QUANTIZERS` (a name registered twice is an error)."""
    if q.name in QUANTIZERS:
        raise ValueError(f"quantizer {q.name!r} registered twice")
    QUANTIZERS[q.name] = q
    return q


def _plain(q: QTensor, dtype: torch.dtype) -> torch.Tensor:
    return q.codes.to(dtype)


def _checked(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    def run(w: torch.Tensor, _scheme: QuantScheme, name: str | None) -> torch.Tensor:
        check_finite(w, name)
        return fn(w)

    return run


def _codes_only(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    def run(w: torch.Tensor, scheme: QuantScheme, name: str | None) -> Codes:
        return _checked(fn)(w, scheme, name), None, None

    return run


# fp32: the tensor as it is (a copy, so later in-place updates of the weight do not leak).
register_quantizer(Quantizer(
    "fp32", quantize=_codes_only(lambda w: w.detach().clone()), dequantize=_plain,
    fake_quant=_checked(lambda w: w), step=_checked(lambda w: float_spacing(w, 23, -126)),
    gemm_dtype=torch.float32, lossless=True, low_bit=False,
))
# bf16: round to nearest even bfloat16; the step is bf16's spacing (7 mantissa bits).
register_quantizer(Quantizer(
    "bf16", quantize=_codes_only(lambda w: w.to(torch.bfloat16)), dequantize=_plain,
    fake_quant=_checked(lambda w: w.to(torch.bfloat16).to(w.dtype)), step=_checked(lambda w: float_spacing(w, 7, -126)),
    gemm_dtype=torch.bfloat16, low_bit=False,
))
register_quantizer(Quantizer(
    "int8",
    quantize=lambda w, s, name: (*quantize_int8_per_channel(w, name=name), None),
    dequantize=lambda q, dtype: dequantize_scaled(q.codes, q.scales, dtype),
    fake_quant=lambda w, s, name: fake_quant_int8(w, name),
    step=lambda w, s, name: step_int8(w, name),
    gemm_dtype=torch.int8, act=act_int8,
))


def _fp8_dequantize(q: QTensor, dtype: torch.dtype) -> torch.Tensor:
    s = q.scheme
    if s.fp8_granularity == "block":
        return dequantize_fp8_block(q.codes, q.scales, s.block_size, q.shape, dtype)
    return dequantize_scaled(q.codes, q.scales, dtype)  # scales [out, 1] / [1, 1] broadcast


register_quantizer(Quantizer(
    "fp8",
    quantize=lambda w, s, name: (*quantize_fp8(w, s.fp8_granularity, s.block_size, name=name), None),
    dequantize=_fp8_dequantize,
    fake_quant=lambda w, s, name: dequantize(quantize(w, s, name=name), w.dtype),
    step=lambda w, s, name: step_fp8(w, s.fp8_granularity, s.block_size, name),
    gemm_dtype=torch.float8_e4m3fn, act=act_fp8,
))


def _w4_quantize(w: torch.Tensor, s: QuantScheme, name: str | None) -> Codes:
    out = quantize_w4(w, s.group_size, s.symmetric, name=name)
    return out[0], out[1], (out[2] if len(out) == 3 else None)


# w4a16: the rollout computes in bf16 on dequantized weights, so its native GEMM is a bf16 one.
register_quantizer(Quantizer(
    "w4a16",
    quantize=_w4_quantize,
    dequantize=lambda q, dtype: dequantize_w4(q.codes, q.scales, q.zeros, q.scheme.group_size, q.shape, dtype),
    fake_quant=lambda w, s, name: fake_quant_w4(w, s.group_size, s.symmetric, name),
    step=lambda w, s, name: step_w4(w, s.group_size, s.symmetric, name),
    gemm_dtype=torch.bfloat16,
))



def _wint_quantize(w: torch.Tensor, s: QuantScheme, name: str | None) -> Codes:
    out = quantize_wint(w, s.bits, s.group_size, s.symmetric, name=name)
    return out[0], out[1], (out[2] if len(out) == 3 else None)


# wa16: W{b}A16 for b = QuantScheme.bits (quant.weight_bits), the weight-only dose axis; like w4a16
# the rollout computes in bf16 on dequantized weights. Embedded backend only for now.
register_quantizer(Quantizer(
    "wa16",
    quantize=_wint_quantize,
    dequantize=lambda q, dtype: dequantize_w4(q.codes, q.scales, q.zeros, q.scheme.group_size, q.shape, dtype),
    fake_quant=lambda w, s, name: fake_quant_wint(w, s.bits, s.group_size, s.symmetric, name),
    step=lambda w, s, name: step_wint(w, s.bits, s.group_size, s.symmetric, name),
    gemm_dtype=torch.bfloat16, verl=False,
))

PRECISIONS = tuple(QUANTIZERS)  # fp32 | bf16 | int8 | fp8 | w4a16 | wa16
# Precisions whose rollout also quantizes the activations (per token, dynamically): W8A8.
W8A8_PRECISIONS = tuple(n for n, q in QUANTIZERS.items() if q.act is not None)
LOW_BIT_PRECISIONS = tuple(n for n, q in QUANTIZERS.items() if q.low_bit)
REFERENCE_PRECISIONS = tuple(n for n, q in QUANTIZERS.items() if not q.low_bit)


# ----------------------------------------------------------------------------- generic API


def quantize(w: torch.Tensor, scheme: QuantScheme, *, name: str | None = None) -> QTensor:
    """Quantize a weight [out, in] with ``scheme``; see :class:`QTensor` for the layouts."""
    codes, scales, zeros = QUANTIZERS[scheme.precision].quantize(w, scheme, name)
    return QTensor(codes=codes, scales=scales, zeros=zeros, scheme=scheme, shape=w.shape, dtype=w.dtype)


def dequantize(q: QTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode ``q`` to a dense tensor (default: the original dtype).

    Inverse of :func:`quantize` up to the rounding error, at most half of :func:`quant_step`
    per entry; ``dequantize(quantize(w, s))`` is bit-identical to ``fake_quant(w, s)``.
    """
    return QUANTIZERS[q.scheme.precision].dequantize(q, q.dtype if dtype is None else dtype)


def fake_quant(
    w: torch.Tensor, scheme: QuantScheme, ste: bool = False, *, name: str | None = None
) -> torch.Tensor:
    """Quantize then dequantize ``w`` in its own dtype: the weight the rollout actor sees.

    ``ste=True`` is the straight-through estimator of QaRL's rollout-aligned forward
    (arXiv 2604.07853; Bengio et al. 2013): the forward value is exactly the fake-quantized
    weight and the gradient w.r.t. ``w`` is the identity. With ``ste=False`` the result is
    detached (rounding has zero derivative almost everywhere, nothing useful flows back).
    "fp32" is the identity (``w`` itself); "bf16" is a bfloat16 round trip.
    """
    qz = QUANTIZERS[scheme.precision]
    if qz.lossless:
        return qz.fake_quant(w, scheme, name)
    with torch.no_grad():
        q = qz.fake_quant(w.detach(), scheme, name)
    if ste and w.requires_grad:
        # q + (w - w.detach()) has value exactly q (w - w is exactly 0) and d/dw = 1.
        return q + (w - w.detach())
    return q


def fake_quant_act(
    x: torch.Tensor,
    scheme: QuantScheme,
    ste: bool = False,
    *,
    group_size: int | None = None,
    name: str | None = None,
) -> torch.Tensor:
    """Dynamic per-token activation fake-quant of a W8A8 rollout, in ``x``'s dtype.

    What the rollout's int8 / fp8 linears do to their input (QuRL W8A8, arXiv 2602.13953
    Sec. 3; suite.embedded.qlinear ``Int8Linear`` / ``Fp8Linear``), so that QaRL's rollout-aligned
    forward (arXiv 2604.07853) can apply it too: each token (a row along the last axis, the
    features) gets its own scale, computed on the fly in float32 from ``x.float()`` as the
    engine and vLLM's quant kernels do.

    - "int8": ``s = max |x| / 127``, ``codes = clamp(round(x / s), -127, 127)``, value ``codes * s``
      (:func:`quantize_int8_per_token`).
    - "fp8": ``s = max |x| / 448``, value ``e4m3(clamp(x / s, +-448)) * s`` (:func:`quantize_fp8`
      "per_channel" on the rows).
    - every precision without ``Quantizer.act`` (fp32, bf16, w4a16): 16-bit (or full)
      activations: ``x`` itself, unchanged.

    ``group_size``: None = one scale per token; an int g = one scale per token and per group
    of g consecutive features (vLLM's block-FP8 linear quantizes activations in 1 x 128 groups
    matching its 128 x 128 weight blocks). ``ste=True``: straight-through estimator, value the
    fake-quantized ``x``, gradient the identity (as :func:`fake_quant`); otherwise detached.
    x [..., K] -> [..., K].
    """
    act = QUANTIZERS[scheme.precision].act
    if act is None or x.numel() == 0:
        return x
    with torch.no_grad():
        xd = x.detach()
        k = xd.shape[-1]
        rows = xd.reshape(-1, k).float()  # [M, K] float32, as the engine's x.float()
        m = rows.shape[0]
        if group_size is not None:
            g = group_len(group_size, k)
            rows = pad_last(rows, g).reshape(-1, g)  # [M * G, g]; zero padding leaves amax as it is
        q = act(rows, name)  # [rows, g or K]
        if group_size is not None:
            q = from_groups(q.reshape(m, -(-k // g), g), k)  # [M, G, g] -> [M, K]
        q = q.reshape(xd.shape).to(x.dtype)  # [..., K]
    if ste and x.requires_grad:
        return q + (x - x.detach())  # value exactly q, d/dx = 1
    return q


def quant_step(w: torch.Tensor, scheme: QuantScheme, *, name: str | None = None) -> torch.Tensor:
    """Per-entry quantization step of ``w`` under ``scheme``, same shape as ``w``.

    The step is the gap between the two grid points around the entry: the rounding error of
    :func:`fake_quant` is at most ``quant_step / 2`` per entry, and an update much smaller
    than a step is invisible to the quantized rollout actor (QuRL Sec. 3.3, the reason for UAQ).

    - int8 / w4a16 / wa16: the entry's scale (uniform grid).
    - fp8: the E4M3 spacing at ``|w| / scale`` times the scale (non-uniform grid):
      ``2**(floor(log2|w / scale|) - 3) * scale``, and ``2**-9 * scale`` in the subnormal range.
    - bf16 / fp32: the format's own spacing (ulp) at ``w`` (7 / 23 mantissa bits).
    An all-zero row has step 0 (its quantization is exact). Returned in float32 (float64 for
    float64 ``w``), without gradient.
    """
    return QUANTIZERS[scheme.precision].step(w.detach().to(work_dtype(w)), scheme, name)


__all__ = [
    "FP8_E4M3_MAX",
    "FP8_GRANULARITIES",
    "INT8_QMAX",
    "LOW_BIT_PRECISIONS",
    "PRECISIONS",
    "QUANTIZERS",
    "REFERENCE_PRECISIONS",
    "W8A8_PRECISIONS",
    "WINT_BITS",
    "WINT_GROUP_SIZES",
    "QTensor",
    "QuantScheme",
    "Quantizer",
    "dequantize",
    "fake_quant",
    "fake_quant_act",
    "quant_step",
    "quantize",
    "quantize_fp8",
    "quantize_int8_per_channel",
    "quantize_int8_per_token",
    "quantize_w4",
    "quantize_wint",
    "register_quantizer",
]
