"""The rollout engine's quantized block linears, one factory per precision (``ENGINE_LINEARS``).

As in QuRL (arXiv 2602.13953) and vLLM's quantized serving, every block linear of the engine's
copy (``wq, wk, wv, wo, w_gate, w_up, w_down``) is a quantized linear; every quantizer comes
from :mod:`suite.core.quant`, and :data:`ENGINE_LINEARS` holds, for each of its precisions, how
the engine builds such a linear and its per-sync loader (docs/architecture.md, "Add a precision"):

- ``fp32``: a plain float32 copy (the reference; its log-probs equal the trainer's).
- ``bf16``: the whole copy in bfloat16 (the papers' baseline rollout); logits go to float32
  for sampling and log-probs.
- ``int8``: W8A8 as QuRL / vLLM: per-output-channel int8 weights, activations quantized
  dynamically *per token* (one scale per row, so a sequence never depends on its
  batch-mates), an int8 x int8 -> int32 GEMM, rescaled by ``act_scale * weight_scale``,
  output in bfloat16. Embeddings, norms, attention and ``lm_head`` in bfloat16, as in vLLM,
  whose quantized models keep ``dtype=bfloat16`` outside the W8A8 GEMMs: an INT8 rollout
  carries the BF16 rollout's rounding *plus* its quantization error, which is why QuRL's
  INT8/FP8 mismatch sits above BF16's.
- ``fp8``: E4M3 weights (``QuantScheme.fp8_granularity``) and per-token dynamic E4M3
  activations (W8A8-FP8); the rest in bfloat16, as for int8.
- ``w4a16``: QaRL's group-wise 4-bit weights dequantized once per sync into bfloat16; the
  whole copy computes in bfloat16 (a W4A16 kernel's numerics; no 4-bit kernel is used).
- ``wa16``: the same at ``QuantScheme.bits`` in {2, 3, 4, 6, 8} (the weight-only dose axis).

Kernels (``native``): True runs the low-precision GEMMs with low-precision kernels:
``torch._int_mm`` for int8 (on a CPU without VNNI / AMX the suite's exact AVX2 kernel,
:data:`INT8_GEMMS`), bf16 GEMMs for bf16 / w4a16, ``torch._scaled_mm`` for fp8
(row-wise scales; "block" fp8 is always dequantized). False ("emulated") runs the same
arithmetic as float32 GEMMs with identical numerics: int8 codes as floats (products are exact
integers and their float32 sums stay exact while ``K * 127**2 < 2**24``, i.e. K <= 1040, beyond
that up to a relative 2**-24), bf16 values as floats (exact products, float32 accumulation,
output rounded to bf16 -- what a bf16 GEMM does), fp8 weights dequantized at sync and
activations fake-quantized per token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from suite.core.quant import (
    QuantScheme,
    fake_quant,
    quantize_fp8,
    quantize_int8_per_channel,
    quantize_int8_per_token,
)
from suite.embedded import fused as fused_int8

# The block linears a rollout engine quantizes (vLLM keeps embeddings, norms, lm_head in 16 bit).
QUANTIZED_LINEARS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w_gate", "mlp.w_up", "mlp.w_down")
# Linears that read the same input share one activation quantizer (see SharedActQuant).
SAME_INPUT = {"wq": "qkv", "wk": "qkv", "wv": "qkv", "wo": "wo", "w_gate": "gate_up", "w_up": "gate_up",
              "w_down": "w_down"}
# Activations [M, K] with "per_channel" scales: one scale per row, i.e. per token.
_FP8_PER_TOKEN = QuantScheme(precision="fp8", fp8_granularity="per_channel")


# ----------------------------------------------------------------------------- low-precision linears


class SharedActQuant:
    """Dynamic per-token activation quantizer shared by the linears that read the same input
    (``wq, wk, wv`` read the attention norm's output, ``w_gate, w_up`` the MLP norm's): the
    input is quantized once, as a fused QKV / gate-up kernel does. Per-token scales make this
    exactly the same as quantizing it for each linear separately."""

    def __init__(self, fn: Callable):
        self.fn = fn  # x [M, K] -> the quantized activation its linears consume
        self._x: torch.Tensor | None = None
        self._out = None

    def __call__(self, x: torch.Tensor):
        # Identity, not value: the same tensor object is passed to each sibling linear within
        # one forward; holding the reference keeps a later tensor from reusing its id.
        if x is not self._x:
            self._x, self._out = x, self.fn(x.reshape(-1, x.shape[-1]))  # [M, K]
        return self._out

    def clear(self) -> None:
        self._x = self._out = None


def _int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 [M, K] x int8 [K, N] -> int32 [M, N]. cuBLAS needs M > 16 and K, N multiples of 8
    (as torchao's ``safe_int_mm``): pad M with zero rows on CUDA. The CPU kernel takes any shape."""
    m = a.shape[0]
    if a.is_cuda and m <= 16:
        return torch._int_mm(F.pad(a, (0, 0, 0, 17 - m)), b)[:m]  # [M, N]
    return torch._int_mm(a, b)


class Int8ActQuant:
    """The int8 engine's per-token activation quantizer, x [M, K] -> (codes int8 [M, K], scales
    float32 [M, 1]), scales computed in float32 from the bf16 activations as vLLM's quant kernels
    do. ``fused``: the C++ loops of suite.embedded.fused (the same bits, fewer aten calls)."""

    def __init__(self, fused: bool | None = None):
        self.fused = fused  # None: decided by the first Int8Linear that reads it (its device)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused:
            return fused_int8.quant_rows(x)
        return quantize_int8_per_token(x.float())


# The integer GEMM an Int8Linear runs (``Int8Linear.gemm``): ``int_mm`` is torch._int_mm (oneDNN's
# VNNI / AMX kernels on CPU, cuBLAS on CUDA); ``packed`` the suite's exact AVX2 kernel on packed
# weights (suite.embedded.fused, for CPUs without VNNI, where oneDNN's int8 kernel is slow or
# inexact); ``float32`` the emulation (codes as floats, a float32 GEMM: exact while K <= 1040).
INT8_GEMMS = ("int_mm", "packed", "float32")


def int8_gemm_for(native: bool, device: torch.device) -> str:
    """The integer GEMM a ``native`` (else emulated) Int8Linear on ``device`` runs: torch._int_mm
    on CUDA and on CPUs with VNNI / AMX, else the packed kernel where the extension builds (the
    same exact sums), else the float32 emulation (the same sums while K <= 1040; the extension's
    build warned)."""
    from suite.hardware import cpu_features

    if not native:
        return "float32"
    if device.type != "cpu" or cpu_features().int8_native:
        return "int_mm"
    return "packed" if fused_int8.available() else "float32"


class Int8Linear(nn.Module):
    """W8A8 linear (QuRL Sec. 3; SmoothQuant / vLLM W8A8 layout): int8 per-output-channel
    weights, int8 per-token dynamic activations, integer GEMM (``gemm``, one of
    :data:`INT8_GEMMS`), float rescale. ``fused`` (CPU): the GEMM and its rescale as one call of
    suite.embedded.fused, the same bits as the unfused ``_int_mm`` (or emulated ``F.linear``) +
    ``mul_`` + ``to``."""

    def __init__(self, in_features: int, out_features: int, native: bool, act_quant: SharedActQuant, device=None):
        super().__init__()
        self.in_features, self.out_features, self.native, self.act_quant = in_features, out_features, native, act_quant
        device = torch.device(device or "cpu")
        fused_quant = isinstance(act_quant.fn, Int8ActQuant)  # else a plain quantizer function
        if fused_quant and act_quant.fn.fused is None:  # the extension is CPU code: no build elsewhere
            act_quant.fn.fused = device.type == "cpu" and fused_int8.available()
        self.fused = fused_quant and act_quant.fn.fused
        self.gemm = int8_gemm_for(native, device)
        # Emulated: the int8 codes stored as float32, for a float32 GEMM over integers.
        code_dtype = torch.float32 if self.gemm == "float32" else torch.int8
        self.register_buffer("codes", torch.zeros(out_features, in_features, dtype=code_dtype, device=device))
        self.register_buffer("scale", torch.zeros(1, out_features, device=device))  # [1, N] f32
        # The packed kernel's weight layout (filled at each load, in place); not state: derived.
        self.register_buffer("packed", torch.zeros(0, dtype=torch.int8, device=device), persistent=False)
        if self.gemm == "packed":
            self.packed = fused_int8.pack_weight(self.codes)

    @torch.no_grad()
    def load(self, w: torch.Tensor) -> None:
        codes, scales = quantize_int8_per_channel(w)  # int8 [N, K], f32 [N, 1]
        self.codes.copy_(codes)
        self.scale.copy_(scales.view(1, -1))  # [1, N]
        if self.gemm == "packed":
            self.packed.copy_(fused_int8.pack_weight(self.codes))  # in place: views of it stay valid

    def gemm_weight(self) -> torch.Tensor:
        """The weight operand of ``fused.mm_rescale`` for this linear's GEMM: the packed weight, or
        the codes' [K, N] view (a sync writes into both in place)."""
        return self.packed if self.gemm == "packed" else self.codes.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, xs = self.act_quant(x)  # int8 [M, K], f32 [M, 1]
        if self.fused:
            y = fused_int8.mm_rescale(xq, self.gemm_weight(), xs, self.scale, x.dtype)  # [M, N]
            return y.view(*x.shape[:-1], self.out_features)  # [..., N]
        if self.gemm == "packed":
            acc = fused_int8.int_mm_packed(xq, self.packed, self.out_features).float()  # [M, N] int32 -> f32
        elif self.gemm == "int_mm":
            acc = _int_mm(xq, self.codes.t()).float()  # [M, N] int32 -> f32
        else:
            acc = F.linear(xq.float(), self.codes)  # [M, N], exact integer sums (module doc)
        y = acc.mul_(xs).mul_(self.scale)  # [M, N]
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)  # [..., N]


EXACT_FLOAT32_K = 1040  # the largest K whose float32 sums of int8 products are exact (module doc)


def share_operands(mods: list[Int8Linear]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One GEMM for linears that read the same input (q, k, v; gate, up): their codes, scales and
    packed weights become row views of one buffer each, so a weight sync, which writes every
    linear's buffers in place, fills the group's; returns the group's weight operand for
    ``fused.mm_rescale`` and its scales [1, sum N]. Integer sums are exact in any order, so the
    group's outputs, split by columns, are each linear's bit for bit. None where that does not
    hold or the layouts do not join: float32 emulation beyond K = 1040 (rounded sums, in an order
    that may depend on N), packed blocks of 8 columns that would straddle two linears."""
    gemm, k = mods[0].gemm, mods[0].in_features
    if any(m.gemm != gemm or m.in_features != k for m in mods) or (gemm == "float32" and k > EXACT_FLOAT32_K):
        return None
    if gemm == "packed" and any(m.out_features % 8 for m in mods):
        return None
    codes = torch.cat([m.codes for m in mods])  # [sum N, K]
    scale = torch.cat([m.scale for m in mods], 1)  # [1, sum N]
    packed = torch.cat([m.packed for m in mods]) if gemm == "packed" else None  # [sum N / 8, KP, 16]
    n0 = 0
    for m in mods:
        n1 = n0 + m.out_features
        m.codes, m.scale = codes[n0:n1], scale[:, n0:n1]
        if packed is not None:
            m.packed = packed[n0 // 8 : n1 // 8]
        n0 = n1
    return (packed if packed is not None else codes.t()), scale


class Fp8Linear(nn.Module):
    """W8A8-FP8 linear (QuRL FP8 rollout): E4M3 weights, per-token dynamic E4M3 activations.

    Native: ``torch._scaled_mm`` on the float8 codes with row-wise scales (bf16 output on CUDA,
    where row-wise scaling requires it; float32 on CPU). Emulated: weights dequantized at
    load, activations fake-quantized per token, float32 GEMM.
    """

    def __init__(self, in_features: int, out_features: int, scheme: QuantScheme, native: bool,
                 act_quant: SharedActQuant, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.scheme, self.native, self.act_quant = scheme, native, act_quant
        if native:
            self.register_buffer("codes", torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn,
                                                      device=device))
            self.register_buffer("scale", torch.zeros(1, out_features, device=device))  # [1, N]
        else:
            self.register_buffer("weight", torch.zeros(out_features, in_features, device=device))  # [N, K]

    @torch.no_grad()
    def load(self, w: torch.Tensor) -> None:
        if self.native:
            codes, scales = quantize_fp8(w, self.scheme.fp8_granularity, self.scheme.block_size)
            self.codes.copy_(codes)
            self.scale.copy_(scales.reshape(-1, 1).expand(self.out_features, 1).reshape(1, -1))  # [1, N]
        else:
            self.weight.copy_(fake_quant(w.float(), self.scheme))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native:
            xq, xs = self.act_quant(x)  # fp8 [M, K], f32 [M, 1]
            out_dtype = torch.bfloat16 if xq.is_cuda else torch.float32
            y = torch._scaled_mm(xq, self.codes.t(), scale_a=xs.float(), scale_b=self.scale,
                                 out_dtype=out_dtype)  # [M, N]
        else:
            y = F.linear(self.act_quant(x), self.weight)  # [M, N], fake-quantized activations
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)  # [..., N]


class Bf16EmulatedLinear(nn.Module):
    """A bf16 linear run as a float32 GEMM over bf16 values: products of bf16 numbers are exact
    in float32, the sum is accumulated in float32 and the output rounded to bf16 -- what a
    native bf16 GEMM computes (up to summation order), at float32 speed on CPUs without bf16
    GEMM kernels. ``weight`` holds bf16-representable values in float32."""

    def __init__(self, in_features: int, out_features: int, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, device=device))  # [N, K]

    @torch.no_grad()
    def load(self, w: torch.Tensor) -> None:
        self.weight.copy_(w.to(torch.bfloat16))  # round to bf16 (nearest even), keep as float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight).to(torch.bfloat16)


def bf16_matmul_emulated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Attention's bf16 matmuls, emulated as Bf16EmulatedLinear does."""
    return torch.matmul(a.float(), b.float()).to(torch.bfloat16)


def _w4_loader(target: nn.Module, scheme: QuantScheme) -> Callable[[torch.Tensor], None]:
    """Sync of a w4a16 / wa16 linear: the group-wise fake-quant weight (QaRL), rounded to bf16
    (into a bf16 ``nn.Linear``, or a Bf16EmulatedLinear's float32 buffer), in place."""

    def load(w: torch.Tensor) -> None:
        target.weight.copy_(fake_quant(w.float(), scheme).to(torch.bfloat16))

    return load



# ----------------------------------------------------------------------------- the registry

Loader = Callable[[torch.Tensor], None]  # full-precision weight [out, in] -> written into the linear


@dataclass(frozen=True)
class EngineLinear:
    """How the engine builds the block linears of one precision of suite.core.quant.QUANTIZERS.

    build(lin, scheme, native, act_quant, device) -> (module, loader), or None to keep the
    copied ``nn.Linear`` (cast to the engine's dtype) as it is. act_quant(scheme, native) ->
    the per-token activation quantizer a W8A8 linear reads (x [M, K] -> what its forward
    consumes), shared by the linears of one input; None = 16-bit activations. native_ok(scheme):
    whether a native kernel exists for this scheme at all.
    """

    build: Callable[[nn.Linear, QuantScheme, bool, "SharedActQuant | None", torch.device],
                    "tuple[nn.Module, Loader] | None"]
    act_quant: Callable[[QuantScheme, bool], Callable] | None = None
    native_ok: Callable[[QuantScheme], bool] = lambda scheme: True


ENGINE_LINEARS: dict[str, EngineLinear] = {}  # precision -> EngineLinear


def register_engine_linear(precision: str, *, act_quant: Callable | None = None, native_ok: Callable | None = None):
    """Decorator: register ``build`` as the engine's block linear for ``precision``."""

    def deco(build: Callable) -> Callable:
        if precision in ENGINE_LINEARS:
            raise ValueError(f"engine linear {precision!r} registered twice")
        ENGINE_LINEARS[precision] = EngineLinear(build, act_quant, native_ok or (lambda scheme: True))
        return build

    return deco


def _own(mod: nn.Module) -> tuple[nn.Module, Loader]:
    return mod, mod.load


@register_engine_linear("fp32")
def _fp32(lin, scheme, native, act_quant, device):
    return None  # the float32 copy itself


@register_engine_linear("bf16")
def _bf16(lin, scheme, native, act_quant, device):
    return None if native else _own(Bf16EmulatedLinear(lin.in_features, lin.out_features, device))


def _int8_act_quant(scheme: QuantScheme, native: bool) -> Int8ActQuant:
    # Fused wherever the extension builds (CPU): bit-identical, so not part of the run's numerics.
    return Int8ActQuant()


def set_int8_fused(model: nn.Module, on: bool) -> None:
    """Switch every Int8Linear of ``model`` (and its activation quantizers) to the fused path or
    back, e.g. to time both side by side; ``on`` needs a CPU copy and the built extension."""
    for mod in model.modules():
        if isinstance(mod, Int8Linear):
            if on and not (mod.codes.device.type == "cpu" and isinstance(mod.act_quant.fn, Int8ActQuant)
                           and fused_int8.available()):
                raise ValueError("set_int8_fused(on=True) needs a CPU engine's Int8ActQuant and the fused "
                                 "extension (suite.embedded.fused.available())")
            mod.fused = mod.act_quant.fn.fused = on
            mod.act_quant.clear()


def set_int8_gemm(model: nn.Module, gemm: str) -> None:
    """Switch every native Int8Linear of a CPU ``model`` to the integer GEMM ``gemm`` ("int_mm" or
    "packed"; the same exact sums where torch._int_mm is exact), e.g. to time both side by side.
    On an engine, call RolloutEngine.set_int8_gemm: its C++ layer loop holds the weight operands."""
    if gemm not in ("int_mm", "packed"):
        raise ValueError(f"set_int8_gemm: gemm={gemm!r}; allowed: int_mm, packed")
    for mod in model.modules():
        if isinstance(mod, Int8Linear):
            if mod.gemm == "float32" or mod.codes.device.type != "cpu" or (gemm == "packed"
                                                                           and not fused_int8.available()):
                raise ValueError("set_int8_gemm needs a native CPU int8 engine (and, for packed, the extension)")
            mod.gemm = gemm
            mod.packed = fused_int8.pack_weight(mod.codes) if gemm == "packed" else mod.codes.new_zeros(0)


@register_engine_linear("int8", act_quant=_int8_act_quant)
def _int8(lin, scheme, native, act_quant, device):
    return _own(Int8Linear(lin.in_features, lin.out_features, native, act_quant, device))


def _fp8_act_quant(scheme: QuantScheme, native: bool) -> Callable:
    if native:
        return lambda x: quantize_fp8(x.float(), "per_channel")  # -> (fp8 codes [M, K], scales [M, 1])
    return lambda x: fake_quant(x.float(), _FP8_PER_TOKEN)  # -> dequantized [M, K]


# No row-wise-scaled kernel takes 128x128 blocks: a "block" fp8 engine dequantizes.
@register_engine_linear("fp8", act_quant=_fp8_act_quant, native_ok=lambda scheme: scheme.fp8_granularity != "block")
def _fp8(lin, scheme, native, act_quant, device):
    return _own(Fp8Linear(lin.in_features, lin.out_features, scheme, native, act_quant, device))


@register_engine_linear("w4a16")
def _w4a16(lin, scheme, native, act_quant, device):
    target = lin if native else Bf16EmulatedLinear(lin.in_features, lin.out_features, device)
    return target, _w4_loader(target, scheme)


@register_engine_linear("wa16")
def _wa16(lin, scheme, native, act_quant, device):
    return _w4a16(lin, scheme, native, act_quant, device)  # the loader's fake_quant reads scheme.bits
