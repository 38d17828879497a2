"""What this machine computes natively, and the concrete numerics a run's ``auto`` choices become.

Machines differ in CPU flags (AVX2-only, AVX-512 VNNI + BF16, AMX), and a SLURM cluster mixes
node types. A choice that depends on the machine (``quant.kernels``, ``quant.bf16_kernels``,
``train.autocast``) is resolved *once*, when the config is composed, into a concrete value that
is part of the resolved config and hence of the run id: different numerics never share an id.
Where the run later executes, :func:`check_executable` either runs the recorded choice exactly
or refuses with a message naming the key (docs/architecture.md, "Hardware choices").

The feature flags honour the ISA caps that PyTorch's kernels honour themselves, so an AVX2
machine's choices can be reproduced on an AVX-512 one: ``ATEN_CPU_CAPABILITY=avx2`` (aten's
vectorised kernels) and ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's GEMMs, which run the int8 and
bf16 matmuls). See https://github.com/pytorch/pytorch/blob/v2.5.0/aten/src/ATen/native/DispatchStub.cpp
and https://oneapi-src.github.io/oneDNN/dev_guide_cpu_dispatcher_control.html.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CHOICES = ("auto", "native", "emulated")  # quant.kernels / quant.bf16_kernels as a user writes them
RESOLVED = ("native", "emulated")  # what they resolve to
# oneDNN ISA names at or below AVX2 (anything else, e.g. AVX512_CORE_AMX, leaves the flags as detected)
_ONEDNN_AVX2_OR_LESS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2")
_ONEDNN_AVX2_VNNI = ("AVX2_VNNI", "AVX2_VNNI_2")  # caps that still allow oneDNN's 256-bit VNNI kernels


def proc_cpu_flags() -> frozenset[str]:
    """The first CPU's flags in /proc/cpuinfo (Linux); empty where there is none. For the flags
    torch has no predicate for (``avx_vnni``)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU features that decide which low-precision kernels are fast."""

    avx512_vnni: bool  # int8 dot products (oneDNN u8s8 VNNI kernels behind torch._int_mm)
    avx512_bf16: bool  # bf16 dot products (vdpbf16ps: native bf16 GEMMs)
    amx: bool  # AMX tiles (int8 and bf16)
    capped: str = ""  # the ISA cap in force (ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA), "" if none
    avx_vnni: bool = False  # 256-bit VNNI (AVX-VNNI: Alder Lake, Sapphire Rapids, Zen 5); not in label()
    avx2: bool = False  # the suite's exact int8 GEMM (vpmaddwd) runs its AVX2 loops; not in label()

    @property
    def int8_native(self) -> bool:
        return self.avx512_vnni or self.amx

    @property
    def int8_fast(self) -> bool:
        """Whether int8 GEMMs beat float32 ones here: oneDNN's VNNI / AMX kernels, or without them
        the suite's exact AVX2 kernel (suite.embedded.qlinear.INT8_GEMMS; docs/bench.md)."""
        return self.int8_native or self.avx2

    @property
    def int8_dot_exact(self) -> bool:
        """Whether oneDNN's int8 GEMMs sum exactly here: with a VNNI dot product (AVX512-VNNI,
        AVX-VNNI) or AMX tiles they accumulate u8 x s8 products in int32; without, oneDNN's
        AVX2 / AVX-512 kernels add product pairs in saturating int16 (``vpmaddubsw``), which is not
        W8A8 arithmetic on full-range codes. oneDNN, "Nuances of int8 computations":
        https://oneapi-src.github.io/oneDNN/dev_guide_int8_computations.html"""
        return self.avx512_vnni or self.avx_vnni or self.amx

    @property
    def bf16_native(self) -> bool:
        return self.avx512_bf16 or self.amx

    def label(self) -> str:
        """Flags as a short tag value, e.g. 'avx512_vnni+avx512_bf16' or 'avx2'."""
        names = [n for n in ("avx512_vnni", "avx512_bf16", "amx") if getattr(self, n)]
        base = "+".join(names) or "avx2"
        return f"{base} (capped: {self.capped})" if self.capped else base


def cpu_features() -> CpuFeatures:
    """The detected features, lowered by an AVX2-or-less ISA cap in the environment."""
    import torch

    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    caps = []
    if aten in ("default", "avx2"):
        caps.append(f"ATEN_CPU_CAPABILITY={aten}")
    if onednn in _ONEDNN_AVX2_OR_LESS:
        caps.append(f"ONEDNN_MAX_CPU_ISA={onednn}")
    avx_vnni = "avx_vnni" in proc_cpu_flags()
    # aten's own capability, which honours ATEN_CPU_CAPABILITY (AVX512 implies AVX2)
    avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    if caps:
        # an AVX2_VNNI cap still lets oneDNN use 256-bit VNNI (only oneDNN runs int8 dot products)
        return CpuFeatures(False, False, False, capped=", ".join(caps),
                           avx_vnni=avx_vnni and onednn in _ONEDNN_AVX2_VNNI, avx2=avx2)
    return CpuFeatures(
        avx512_vnni=bool(torch.cpu._is_vnni_supported()),
        avx512_bf16=bool(torch.cpu._is_avx512_bf16_supported()),
        amx=bool(torch.cpu._is_amx_tile_supported()),
        avx_vnni=avx_vnni,
        avx2=avx2,
    )


# Linux x86-64: a process must be granted the AMX tile state (XTILEDATA) before its first AMX
# instruction, or that instruction raises SIGILL (arch_prctl(2); Documentation/arch/x86/xstate.rst).
_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1022, 18


def amx_tiles_permitted() -> bool | None:
    """Whether this process may execute AMX tile instructions (``ARCH_GET_XCOMP_PERM``); None
    where that cannot be asked (not Linux on x86-64, or a kernel without the call)."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_uint64(0)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
        return None
    return bool(mask.value >> _XFEATURE_XTILEDATA & 1)


def request_amx_tiles() -> bool:
    """Ask for this process's AMX tile permission (torch's own request, the one oneDNN makes
    before its AMX kernels); whether it is granted: False on a CPU without AMX. Kernels that
    use AMX without asking, as vLLM 0.31.0's CPU INT8 GEMM does (docs/verl.md, "AMX tile
    permission"), work only in a process where something asked first."""
    import torch

    init = getattr(torch._C._cpu, "_init_amx", None)
    return bool(init()) if init is not None else False


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _quantizer(precision: str):
    from suite.core.quant import QUANTIZERS  # lazily, as torch: composing a config stays light

    return QUANTIZERS[precision]


def gemm_fast(precision: str, fp8_granularity: str = "per_channel", device=None) -> bool:
    """Whether ``precision``'s GEMMs have a fast native kernel on ``device`` (a torch.device;
    None = CUDA if present, else the CPU): the rule behind every ``auto`` kernel choice. The
    kernel is the one of the precision's GEMM operand dtype (suite.core.quant ``Quantizer.gemm_dtype``)."""
    import torch

    dt = _quantizer(precision).gemm_dtype
    cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
    if dt == torch.float32:
        return True
    if dt == torch.float8_e4m3fn:
        # torch._scaled_mm with row-wise scales; no CPU kernel is fast, no kernel takes 128x128 blocks
        if not cuda or fp8_granularity == "block":
            return False
        return torch.cuda.get_device_capability(device) >= (8, 9)
    if cuda:
        return True
    feats = cpu_features()
    if dt == torch.int8:  # oneDNN's u8s8 VNNI / AMX kernels, else the suite's exact AVX2 kernel
        return feats.int8_fast
    return feats.bf16_native  # bf16 GEMMs (also on a weight-only precision's dequantized weights)


def resolve_kernels(choice: str, precision: str, fp8_granularity: str) -> str:
    """``quant.kernels``: the rollout's quantized-GEMM path, native | emulated."""
    if choice != "auto":
        return choice
    if _quantizer(precision).lossless:
        return "native"  # plain float32 GEMMs: there is nothing to emulate
    return "native" if gemm_fast(precision, fp8_granularity) else "emulated"


def resolve_bf16_kernels(choice: str, precision: str) -> str:
    """``quant.bf16_kernels``: the bf16 matmuls outside the quantized GEMMs (attention, lm_head)."""
    if choice != "auto":
        return choice
    if _quantizer(precision).lossless:
        return "native"  # an fp32 engine has no bf16 matmuls
    return "native" if gemm_fast("bf16") else "emulated"


def resolve_autocast(choice: str) -> str:
    """``train.autocast``: the trainer's forward/backward precision, bf16 | fp32."""
    if choice != "auto":
        return choice
    return "bf16" if gemm_fast("bf16") else "fp32"


def int_mm_exact() -> bool:
    """Whether ``torch._int_mm`` computes exact int32 sums here.

    False where an ISA cap forces oneDNN below the VNNI kernel of a VNNI CPU: oneDNN's AVX2
    u8s8 kernel multiplies into saturating int16 pairs (measured: large errors on a full-range
    product; docs/bench.md, "Measurements behind the code"). On VNNI / AMX it is exact, and so it
    was on the AVX2-only EPYC this project measured before (torch's slow reference path)."""
    import torch

    return not (cpu_features().capped and bool(torch.cpu._is_vnni_supported()) and not _cuda())


def executed_kernels(kernels: str, precision: str) -> str:
    """The GEMM path that really runs for a resolved ``quant.kernels`` on this machine.

    ``native`` int8 without VNNI / AMX runs the suite's exact AVX2 int8 kernel (the same integer
    sums as torch._int_mm on a VNNI machine; suite.embedded.qlinear.INT8_GEMMS), not torch's
    int8 kernel, which is there either far slower than float32 (docs/bench.md, "Measurements
    behind the code") or, under an ISA cap, inexact (:func:`int_mm_exact`). Without AVX2 it runs
    the emulated path (the same sums while K <= 1040)."""
    import torch

    int8_gemm = _quantizer(precision).gemm_dtype == torch.int8
    if kernels == "native" and int8_gemm and not _cuda() and not cpu_features().int8_fast:
        return "emulated"
    return kernels


class HardwareError(RuntimeError):
    """A run's resolved numerics cannot be reproduced on this machine."""


def check_executable(precision: str, kernels: str, bf16_kernels: str) -> None:
    """Refuse, naming the key, a resolved choice this machine cannot run with the same numerics.

    - ``quant.bf16_kernels=native`` (and ``quant.kernels=native`` for bf16 / w4a16) without
      AVX512-BF16 or AMX: torch would run a reference bf16 kernel whose summation order differs
      from the native one, so the numbers would not be those of the run id.
    - ``quant.kernels=native`` int8 runs everywhere: see :func:`executed_kernels`.
    - ``train.autocast=bf16`` runs everywhere: autocast's bf16 operands and float32 accumulation
      are the same arithmetic on every CPU up to summation order, as float32 GEMMs are.
    """
    import torch

    if _cuda() or _quantizer(precision).lossless:
        return
    feats = cpu_features()
    uses_bf16_gemm = _quantizer(precision).gemm_dtype == torch.bfloat16 and kernels == "native"
    for key, value, needed in (("quant.bf16_kernels", bf16_kernels, bf16_kernels == "native"),
                               ("quant.kernels", kernels, uses_bf16_gemm)):
        if needed and not feats.bf16_native:
            raise HardwareError(
                f"{key}={value}: this run's numerics were resolved for native bf16 GEMMs, but this CPU "
                f"({feats.label()}) has neither AVX512-BF16 nor AMX. Run it on such a node, or set "
                f"{key}=emulated (a different run id)")
