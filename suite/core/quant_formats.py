"""Number formats of the rollout actor's quantizers: INT8, FP8 E4M3 and 4-bit group-wise.

The pure per-format math behind the quantizer registry (:mod:`suite.core.quant`), which says
which of these each precision uses:

- INT8 W8A8 (QuRL, arXiv 2602.13953 Sec. 3): symmetric per-output-channel weights
  ``W ~= codes * scale``, ``scale = max_j |W_ij| / 127``; dynamic per-token activations
  quantized the same way along the feature axis.
- FP8 E4M3 (QuRL; ``torch.float8_e4m3fn``, max finite 448): ``W ~= fp8(W / scale) * scale``
  with ``scale = amax / 448`` taken per tensor, per output channel, or per 128x128 block
  (the DeepSeek-V3 / vLLM block layout). Saturating: values are clamped to +-448 before
  the cast, because E4M3FN has no inf and whether a plain cast of an out-of-range value
  saturates or gives NaN depends on the torch version and device.
- W4A16 (QaRL, arXiv 2604.07853): 4-bit group-wise weights along the input axis
  (group 128 by default), 16-bit activations. Symmetric follows compressed-tensors /
  llm-compressor (``scale = amax / 7.5``, codes in [-8, 7]); asymmetric uses an integer
  zero point with 0 forced into the range (so zero is exact), codes in [0, 15].
  The same math at b in {2, 3, 4, 6, 8} bits (``WINT_BITS``; codes [-2**(b-1), 2**(b-1) - 1],
  scale ``amax / (2**(b-1) - 0.5)``) is the weight-only dose axis W{b}A16.

Conventions shared by every quantizer here:

- Rounding is round-half-to-even (``torch.round`` and the float8 cast), so every entry's
  error is at most half of the quantization step at that entry.
- Scales are float32, or float64 when the input is float64 (so a float64 reference model can
  be quantized without float32 rounding in the way). An all-zero row/group/block gets
  scale 0 and quantizes to exact zeros (the division uses a safe scale of 1).
- A non-finite input raises ``ValueError`` naming the tensor (``name=``): a NaN weight would
  otherwise silently poison a whole channel's scale.
- Everything is vectorised; nothing loops over rows (it runs on every weight every RL step).
"""

from __future__ import annotations

import torch

FP8_GRANULARITIES = ("per_tensor", "per_channel", "block")

INT8_QMAX = 127  # symmetric: the -128 code is unused so that the grid is symmetric
FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn: 1.75 * 2**8
FP8_MANT_BITS = 3
FP8_MIN_NORMAL_EXP = -6  # 2**-6 is the smallest normal E4M3 value; below it spacing is 2**-9
W4_SYM_QMIN, W4_SYM_QMAX = -8, 7
W4_ASYM_QMAX = 15
# Weight-only group-wise integer widths the "wa16" quantizer serves (the dose axis W{8,6,4,3,2}A16).
WINT_BITS = (2, 3, 4, 6, 8)
# Group sizes (input entries per scale) "wa16" serves: powers of two as GPTQ / AWQ kernels use; a
# group wider than a row is the row (per-channel).
WINT_GROUP_SIZES = (8, 16, 32, 64, 128, 256)


def wint_range(bits: int, symmetric: bool) -> tuple[int, int]:
    """Integer code range of a ``bits``-wide group-wise weight: [-2**(b-1), 2**(b-1) - 1]
    symmetric, [0, 2**b - 1] asymmetric (b = 4: [-8, 7] and [0, 15], the W4A16 ranges)."""
    if bits not in WINT_BITS:
        raise ValueError(f"weight bits={bits!r}; allowed: {WINT_BITS}")
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)

# ----------------------------------------------------------------------------- helpers


def _raise_non_finite(w: torch.Tensor, name: str | None) -> None:
    n_nan = int(torch.isnan(w).sum())
    n_inf = int(torch.isinf(w).sum())
    raise ValueError(
        f"cannot quantize {name or 'tensor'} (shape {tuple(w.shape)}): "
        f"{n_nan} NaN and {n_inf} inf entries"
    )


def check_reduced(reduced: torch.Tensor, w: torch.Tensor, name: str | None) -> None:
    # min/max reductions propagate NaN and inf, so checking the (small) reduced tensor is
    # the same as checking w, without a separate full pass over every weight.
    if reduced.numel() and not bool(torch.isfinite(reduced).all()):
        _raise_non_finite(w, name)


def check_finite(w: torch.Tensor, name: str | None) -> None:
    if w.numel():
        mn, mx = torch.aminmax(w)
        check_reduced(torch.stack([mn, mx]), w, name)


def check_2d(w: torch.Tensor, name: str | None, what: str) -> None:
    if w.dim() != 2:
        raise ValueError(
            f"{what} expects a 2-D weight [out, in]; {name or 'tensor'} has shape {tuple(w.shape)}"
        )


def work_dtype(w: torch.Tensor) -> torch.dtype:
    # float64 stays float64 so a float64 reference model is quantized without f32 rounding.
    return torch.float64 if w.dtype == torch.float64 else torch.float32


def _safe(scale: torch.Tensor) -> torch.Tensor:
    # An all-zero row has scale 0: divide by 1 instead; its codes are then 0 anyway.
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _absmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """max |x| along ``dim`` (kept), in one pass (aminmax) instead of abs() then amax()."""
    mn, mx = torch.aminmax(x, dim=dim, keepdim=True)
    return torch.maximum(mx, -mn)


def pad_last(w: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = (-w.shape[-1]) % multiple
    return torch.nn.functional.pad(w, (0, pad)) if pad else w


def _tiles(x: torch.Tensor, b: int) -> torch.Tensor:
    """[out, in] -> zero-padded tiles [OB, b, IB, b]."""
    out_f, in_f = x.shape
    ob, ib = -(-out_f // b), -(-in_f // b)
    if (ob * b, ib * b) != (out_f, in_f):
        x = torch.nn.functional.pad(x, (0, ib * b - in_f, 0, ob * b - out_f))  # [OB*b, IB*b]
    return x.reshape(ob, b, ib, b)  # [OB, b, IB, b]


def _untile(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Tiles [OB, b, IB, b] -> [out, in], padding trimmed."""
    ob, b, ib, _ = t.shape
    return t.reshape(ob * b, ib * b)[: shape[0], : shape[1]]  # [out, in]


def to_groups(x: torch.Tensor, g: int) -> torch.Tensor:
    """[out, in] -> zero-padded groups [out, G, g] along the input axis."""
    return pad_last(x, g).reshape(x.shape[0], -1, g)  # [out, G, g]


def from_groups(t: torch.Tensor, in_f: int) -> torch.Tensor:
    """Groups [out, G, g] -> [out, in], padding trimmed."""
    return t.reshape(t.shape[0], -1)[:, :in_f]  # [out, in]


def group_len(group_size: int, in_f: int) -> int:
    # A row shorter than a group is one (short) group.
    return max(1, min(group_size, in_f))


# ----------------------------------------------------------------------------- cores
# Each core returns integer-valued float codes in a layout where the scales broadcast, so
# fake_quant can multiply straight back (bit-identical to dequantize(quantize(w))) without
# materialising per-entry scales or integer storage.


def _div(t: torch.Tensor, c: float) -> torch.Tensor:
    """``t / c`` as a true IEEE division on every device. CUDA compiles a division by a Python
    scalar into a multiplication by its reciprocal, which is 1 ulp off for some inputs, and then
    some codes are off by one against the CPU (docs/bench.md, "Measurements behind the code");
    dividing by a tensor is exact, so CPU and GPU quantize bit-identically."""
    return t / torch.full_like(t, c)


def _int8_core(xf: torch.Tensor, name: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    amax = _absmax(xf, -1)  # [..., 1]
    check_reduced(amax, xf, name)
    scales = _div(amax, INT8_QMAX)  # [..., 1]
    codes = torch.round_(xf / _safe(scales)).clamp_(-INT8_QMAX, INT8_QMAX)  # [..., in]
    return codes, scales


def _fp8_core(
    wf: torch.Tensor, granularity: str, b: int, name: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (float8 codes [out, in] or tiles [OB, b, IB, b] for "block", stored scales)."""
    if granularity == "per_tensor":
        amax = _absmax(wf.reshape(1, -1), -1)  # [1, 1]
        check_reduced(amax, wf, name)
        scales = _div(amax, FP8_E4M3_MAX)  # [1, 1]
        x = wf / _safe(scales)  # [out, in]
    elif granularity == "per_channel":
        amax = _absmax(wf, -1)  # [out, 1]
        check_reduced(amax, wf, name)
        scales = _div(amax, FP8_E4M3_MAX)  # [out, 1]
        x = wf / _safe(scales)  # [out, in]
    else:
        tiles = _tiles(wf, b)  # [OB, b, IB, b]
        amax = tiles.abs().amax(dim=(1, 3))  # [OB, IB]
        check_reduced(amax, wf, name)
        scales = _div(amax, FP8_E4M3_MAX)  # [OB, IB]
        x = tiles / _safe(scales)[:, None, :, None]  # [OB, b, IB, b]
    # Saturate before the cast: E4M3FN has no inf, an out-of-range cast would give NaN.
    codes = x.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scales


def _wint_core(
    wf: torch.Tensor, bits: int, group_size: int, symmetric: bool, name: str | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> (float codes in groups [out, G, g], scales [out, G], zeros [out, G] or None).

    Symmetric: ``scale = amax / (qmax + 0.5)`` (qmax = 2**(b-1) - 1; 7.5 for 4 bits, the
    compressed-tensors convention), codes in [-2**(b-1), qmax]. Asymmetric: ``scale = (hi - lo) /
    (2**b - 1)`` with 0 forced into [lo, hi], an integer zero point, codes in [0, 2**b - 1]."""
    qmin, qmax = wint_range(bits, symmetric)
    g = group_len(group_size, wf.shape[-1])
    # Zero padding is harmless: it changes neither the absmax nor a range that contains 0.
    groups = to_groups(wf, g)  # [out, G, g]
    if symmetric:
        amax = _absmax(groups, -1)  # [out, G, 1]
        check_reduced(amax, wf, name)
        scales = _div(amax, qmax + 0.5)  # [out, G, 1]
        codes = torch.round_(groups / _safe(scales)).clamp_(qmin, qmax)
        return codes, scales.squeeze(-1), None
    mn, mx = torch.aminmax(groups, dim=-1, keepdim=True)  # [out, G, 1] each
    check_reduced(torch.cat([mn, mx], -1), wf, name)
    lo, hi = mn.clamp(max=0.0), mx.clamp(min=0.0)  # 0 inside the range -> 0 is exact
    scales = _div(hi - lo, qmax)  # [out, G, 1]
    safe = _safe(scales)
    zeros = torch.round_(-lo / safe).clamp_(0, qmax)  # [out, G, 1]
    codes = torch.round_(groups / safe).add_(zeros).clamp_(0, qmax)  # [out, G, g]
    return codes, scales.squeeze(-1), zeros.squeeze(-1)


# ----------------------------------------------------------------------------- INT8


def quantize_int8_per_channel(
    w: torch.Tensor, *, name: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel INT8 weights (QuRL W8A8; as vLLM / SmoothQuant W8A8).

    ``scale_i = max_j |W_ij| / 127``, ``codes = clamp(round(W / scale), -127, 127)``.
    w [out, in] -> (codes int8 [out, in], scales [out, 1]).
    """
    check_2d(w, name, "quantize_int8_per_channel")
    return quantize_int8_per_token(w, name=name)  # same math: amax along the last (input) axis


def quantize_int8_per_token(
    x: torch.Tensor, *, name: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic symmetric per-token INT8 activations (QuRL W8A8 activations).

    x [..., in] -> (codes int8 [..., in], scales [..., 1]); each token's scale is its own
    absmax / 127, computed on the fly (no calibration).
    """
    codes, scales = _int8_core(x.to(work_dtype(x)), name)
    return codes.to(torch.int8), scales


# ----------------------------------------------------------------------------- FP8


def quantize_fp8(
    w: torch.Tensor,
    granularity: str = "per_channel",
    block_size: int = 128,
    *,
    name: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 weights with a saturating cast (QuRL FP8 rollout; vLLM fp8 weight layouts).

    ``scale = amax / 448`` over the tensor, each output row, or each ``block x block`` tile
    (DeepSeek-V3 block layout); ``codes = float8_e4m3fn(clamp(W / scale, -448, 448))``
    (round-to-nearest-even cast).
    w [out, in] -> (codes float8_e4m3fn [out, in], scales [1, 1] | [out, 1] | [OB, IB]).
    """
    if granularity not in FP8_GRANULARITIES:
        raise ValueError(f"fp8 granularity {granularity!r}; allowed: {FP8_GRANULARITIES}")
    check_2d(w, name, "quantize_fp8")
    codes, scales = _fp8_core(w.to(work_dtype(w)), granularity, block_size, name)
    if granularity == "block":
        # float8 has few kernels on CPU: untile through uint8, bit-exact.
        codes = _untile(codes.view(torch.uint8), w.shape).contiguous().view(torch.float8_e4m3fn)
    return codes, scales


# ----------------------------------------------------------------------------- W4A16


def quantize_w4(
    w: torch.Tensor,
    group_size: int = 128,
    symmetric: bool = True,
    *,
    name: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """4-bit group-wise weights along the input axis (QaRL W4A16; GPTQ/AWQ group layout).

    Symmetric (compressed-tensors / llm-compressor convention): ``scale = amax_group / 7.5``,
    ``codes = clamp(round(W / scale), -8, 7)`` (int8 storage); returns ``(codes, scales)``.

    Asymmetric (integer zero point; 0 forced into the range as compressed-tensors does, so 0
    is exact and every error stays within half a step):
    ``lo = min(min_g W, 0)``, ``hi = max(max_g W, 0)``, ``scale = (hi - lo) / 15``,
    ``zero = clamp(round(-lo / scale), 0, 15)``, ``codes = clamp(round(W / scale) + zero, 0, 15)``
    (uint8 storage); returns ``(codes, scales, zeros)`` -- the only quantizer with a third
    output, since the zero point is what makes it asymmetric. Decode: ``(codes - zero) * scale``.

    w [out, in] -> codes [out, in], scales [out, G], zeros uint8 [out, G]; G = ceil(in / g),
    g = min(group_size, in) (a row shorter than a group is one group). One code per byte:
    packing two per byte is a kernel concern. :func:`quantize_wint` with ``bits=4``.
    """
    return quantize_wint(w, 4, group_size, symmetric, name=name)


def quantize_wint(
    w: torch.Tensor,
    bits: int,
    group_size: int = 128,
    symmetric: bool = True,
    *,
    name: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """``bits``-wide group-wise weights along the input axis (W{8,6,4,3,2}A16; :data:`WINT_BITS`).

    :func:`quantize_w4`'s math with the code range of ``bits`` (:func:`wint_range`): symmetric
    ``scale = amax_group / (2**(b-1) - 0.5)``, ``codes = clamp(round(W / scale), -2**(b-1),
    2**(b-1) - 1)`` (int8 storage); asymmetric ``scale = (hi - lo) / (2**b - 1)``, integer zero
    point, codes in [0, 2**b - 1] (uint8 storage). Same layouts and returns as :func:`quantize_w4`.
    """
    check_2d(w, name, "quantize_wint")
    if group_size < 1:
        raise ValueError(f"group_size={group_size}; must be >= 1")
    codes, scales, zeros = _wint_core(w.to(work_dtype(w)), bits, group_size, symmetric, name)
    codes = from_groups(codes, w.shape[-1]).contiguous()  # [out, in]
    if symmetric:
        return codes.to(torch.int8), scales
    return codes.to(torch.uint8), scales, zeros.to(torch.uint8)


def float_spacing(y: torch.Tensor, mant_bits: int, min_normal_exp: int) -> torch.Tensor:
    """Gap between consecutive values of a binary float format at |y| (y float32/float64).

    For |y| in [2**e, 2**(e+1)) the gap is 2**(e - mant_bits); below the smallest normal
    2**min_normal_exp it is the subnormal gap 2**(min_normal_exp - mant_bits). 2**e is read
    off the exponent bits (masking the mantissa), which is exact and cheaper than frexp.
    """
    a = y.abs().clamp_(min=2.0**min_normal_exp)
    if a.dtype == torch.float64:
        pow2 = (a.view(torch.int64) & 0x7FF0000000000000).view(torch.float64)
    else:
        a = a.to(torch.float32)
        pow2 = (a.view(torch.int32) & 0x7F800000).view(torch.float32)
    return pow2.mul_(2.0**-mant_bits)



# ----------------------------------------------------------------------------- decode, fake-quant, step
# Per-format pieces of suite.core.quant's generic API. fake_quant_* multiply the cores' float
# codes straight back, bit-identical to dequantize(quantize(w)) without integer storage.


def dequantize_scaled(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes [out, in] * scales [out, 1] | [1, 1] (broadcast) in the scales' dtype, then ``dtype``."""
    return (codes.to(scales.dtype) * scales).to(dtype)


def dequantize_fp8_block(codes: torch.Tensor, scales: torch.Tensor, block_size: int, shape: torch.Size,
                         dtype: torch.dtype) -> torch.Tensor:
    """float8 codes [out, in] and block scales [OB, IB] -> [out, in] in ``dtype``."""
    tiles = _tiles(codes.to(scales.dtype), block_size)  # [OB, b, IB, b]
    return _untile(tiles.mul_(scales[:, None, :, None]), shape).to(dtype)  # [out, in]


def dequantize_w4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int,
                  shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """4-bit codes [out, in], scales [out, G] (and zeros [out, G]) -> ``(codes - zero) * scale``."""
    sd = scales.dtype
    g = group_len(group_size, shape[-1])
    c = to_groups(codes.to(sd), g)  # [out, G, g]
    if zeros is not None:
        c = c.sub_(zeros.to(sd)[..., None])
    return from_groups(c.mul_(scales[..., None]), shape[-1]).to(dtype)  # [out, in]


def fake_quant_int8(wd: torch.Tensor, name: str | None) -> torch.Tensor:
    """Per-output-channel INT8 round trip of a detached weight [out, in], in its dtype."""
    check_2d(wd, name, "fake_quant(int8)")
    codes, scales = _int8_core(wd.to(work_dtype(wd)), name)
    return codes.mul_(scales).to(wd.dtype)


def fake_quant_w4(wd: torch.Tensor, group_size: int, symmetric: bool, name: str | None) -> torch.Tensor:
    """Group-wise 4-bit round trip of a detached weight [out, in], in its dtype."""
    return fake_quant_wint(wd, 4, group_size, symmetric, name)


def fake_quant_wint(wd: torch.Tensor, bits: int, group_size: int, symmetric: bool, name: str | None) -> torch.Tensor:
    """Group-wise ``bits``-wide round trip of a detached weight [out, in], in its dtype."""
    check_2d(wd, name, f"fake_quant(w{bits}a16)")
    codes, scales, zeros = _wint_core(wd.to(work_dtype(wd)), bits, group_size, symmetric, name)
    if zeros is not None:
        codes = codes.sub_(zeros[..., None])
    return from_groups(codes.mul_(scales[..., None]), wd.shape[-1]).to(wd.dtype)  # [out, in]


def act_int8(rows: torch.Tensor, name: str | None) -> torch.Tensor:
    """Per-row (per-token) INT8 round trip of float32 rows [M, K]."""
    codes, scales = _int8_core(rows, name)  # [M, K], [M, 1]
    return codes.mul_(scales)


def act_fp8(rows: torch.Tensor, name: str | None) -> torch.Tensor:
    """Per-row (per-token) E4M3 round trip of float32 rows [M, K]."""
    codes, scales = _fp8_core(rows, "per_channel", 1, name)  # one scale per row
    return codes.to(torch.float32).mul_(scales)


def step_int8(wd: torch.Tensor, name: str | None) -> torch.Tensor:
    """INT8 step of a weight [out, in] (work dtype): its row's scale, uniform grid."""
    check_2d(wd, name, "quant_step(int8)")
    amax = _absmax(wd, -1)  # [out, 1]
    check_reduced(amax, wd, name)
    return _div(amax, INT8_QMAX).expand(wd.shape).contiguous()  # [out, in]


def step_w4(wd: torch.Tensor, group_size: int, symmetric: bool, name: str | None) -> torch.Tensor:
    """4-bit step of a weight [out, in] (work dtype): its group's scale, uniform grid."""
    return step_wint(wd, 4, group_size, symmetric, name)


def step_wint(wd: torch.Tensor, bits: int, group_size: int, symmetric: bool, name: str | None) -> torch.Tensor:
    """``bits``-wide group-wise step of a weight [out, in] (work dtype): its group's scale."""
    check_2d(wd, name, f"quant_step(w{bits}a16)")
    _, scales, _ = _wint_core(wd, bits, group_size, symmetric, name)  # [out, G]
    g = group_len(group_size, wd.shape[-1])
    per_group = scales[..., None].expand(*scales.shape, g)  # [out, G, g]
    return from_groups(per_group, wd.shape[-1]).contiguous()  # [out, in]


def step_fp8(wd: torch.Tensor, granularity: str, block_size: int, name: str | None) -> torch.Tensor:
    """E4M3 step of a weight [out, in] (work dtype): ``2**(floor(log2|w / scale|) - 3) * scale``,
    and ``2**-9 * scale`` in the subnormal range (non-uniform grid)."""
    check_2d(wd, name, "quant_step(fp8)")
    _, scales = _fp8_core(wd, granularity, block_size, name)
    if granularity == "block":
        tiles = _tiles(wd, block_size)  # [OB, b, IB, b]
        sc = scales[:, None, :, None]  # [OB, 1, IB, 1]
        y = (tiles / _safe(sc)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX)
        step = float_spacing(y, FP8_MANT_BITS, FP8_MIN_NORMAL_EXP).mul_(sc)  # [OB, b, IB, b]
        return _untile(step, wd.shape).contiguous()  # [out, in]
    y = (wd / _safe(scales)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX)  # [out, in]
    return float_spacing(y, FP8_MANT_BITS, FP8_MIN_NORMAL_EXP).mul_(scales)  # [out, in]
