"""The engine's fused W8A8 path on CPU: per-token int8 quantization and the rescale around
``torch._int_mm`` as two C++ loops (csrc/int8_linear.cpp), built on first use.

Why: with native int8 GEMMs (AVX512-VNNI / AMX) the GEMMs are the cheap part of an int8
decode step; the per-token activation quantization (aminmax, maximum, div, where, round,
clamp, cast, finiteness check) and the rescale (int32 -> float, two multiplies, cast to
bf16) are many aten calls per linear, each a few microseconds of dispatch on decode-sized
tensors, which together cost more than the GEMM itself (docs/bench.md, "Results" and
"Measurements behind the code").

Numerics: the same float32 operations in the same order (the C++ file lists them), so the
codes, the scales and the outputs are bit-identical to the unfused path: the GEMM is the same
``torch._int_mm`` call, and its int32 sums are exact in any order (tests/embedded/test_fused.py
checks all three bit for bit, and the engine's tokens and log-probs).

Alternatives measured (docs/bench.md, "Measurements behind the code"): ``torch.compile``
(inductor, C++ backend) of the same function, weights as inputs, compiles slowly and then was
faster for the quantization but slower for the rescale: its per-call guard and wrapper
overhead is of the size of the work. The extension is built on first use
(suite.embedded.cext); where it cannot be, :func:`available` is False and the engine runs the
unfused path (same numbers).
"""

from __future__ import annotations

import torch

from suite.embedded import cext


def _load():
    if cext.build("suite_int8_linear", "int8_linear.cpp", python_module=False,
                  what="the engine runs the unfused W8A8 path (same numbers, slower)"):
        return torch.ops.suite_fused
    return None


def available() -> bool:
    """Whether the fused extension is built (building it on the first call: tens of seconds)."""
    return _load() is not None


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 | bfloat16 -> (codes int8 [M, K], scales float32 [M, 1]): the values of
    ``quantize_int8_per_token(x.float())``, which raises on a non-finite row as this does."""
    codes, scales, finite = _load().quant_rows(x)
    if not finite:
        from suite.core.quant import quantize_int8_per_token

        quantize_int8_per_token(x.float())  # raises the usual error naming the problem
    return codes, scales


def mm_rescale(codes: torch.Tensor, w_t: torch.Tensor, xs: torch.Tensor, ws: torch.Tensor,
               out_dtype: torch.dtype) -> torch.Tensor:
    """``(torch._int_mm(codes, w_t).float() * xs * ws).to(out_dtype)``: codes int8 [M, K], w_t int8
    [K, N] (a view of the weight codes: a sync writes new values into the same storage), xs
    float32 [M, 1], ws float32 [1, N] -> [M, N]."""
    return _load().mm_rescale(codes, w_t, xs, ws, out_dtype)


def pack_weight(codes: torch.Tensor) -> torch.Tensor:
    """Weight codes int8 [N, K] -> the packed layout of the exact int8 GEMM for CPUs without a
    VNNI dot product (csrc/int8_linear.cpp: int8 [ceil(N/8), ceil(K/2), 16], zero padded)."""
    return _load().pack_weight(codes)


def int_mm_packed(codes: torch.Tensor, packed: torch.Tensor, n: int, simd: bool = True) -> torch.Tensor:
    """codes int8 [M, K] x a packed weight of N output columns -> int32 [M, N]: the exact integer
    sums torch._int_mm computes with VNNI, by sign-extended int16 products (AVX2 ``vpmaddwd``, or
    plain integer loops where ``simd`` is False or the CPU has no AVX2)."""
    return _load().int_mm_packed(codes, packed, n, simd)


def packed_simd() -> bool:
    """Whether the packed GEMM runs its AVX2 loops here (else its plain integer loops)."""
    return _load().packed_simd()
