"""The exact int8 GEMM for CPUs without VNNI (csrc/int8_linear.cpp ``pack_weight`` /
``int_mm_packed``): integer arithmetic, so its sums must equal the exact int64 product and
torch._int_mm (where that is exact) bit for bit, on full-range codes, odd shapes and the
engine's decode shapes; an engine running it samples the same tokens and log-probs as one
running torch._int_mm or the float32 emulation. AVX2 code runs on AVX-512 machines too, so
every CPU kind with AVX2 runs the AVX2 loops here; the plain integer loops run beside them."""

from __future__ import annotations

import shutil

import pytest
import torch

from _prompts import rand_prompts
from suite.core.quant import QuantScheme
from suite.embedded import fused
from suite.embedded.decode import set_native_loop
from suite.embedded.engine import RolloutEngine
from suite.embedded.model import PRESETS, ModelConfig, Transformer
from suite.embedded.qlinear import Int8Linear, set_int8_fused, set_int8_gemm
from suite.hardware import cpu_features, int_mm_exact

if shutil.which("g++") is None:
    pytest.skip("no C++ compiler: the extension cannot be built here (the engine runs the emulation)",
                allow_module_level=True)

SIMD = [True, False]  # the AVX2 loops (where the CPU has AVX2) and the plain integer loops


def test_the_avx2_loops_run_wherever_the_cpu_has_avx2():
    assert fused.packed_simd() == ("avx2" in open("/proc/cpuinfo").read())


def test_the_packed_layout_by_hand():
    """w [N=3, K=3]: block 0 holds columns 0..2 (5..7 zero), k pairs (0, 1) then (2, pad)."""
    w = torch.tensor([[1, 2, 3], [4, 5, 6], [-7, -8, -128]], dtype=torch.int8)
    p = fused.pack_weight(w)
    assert p.shape == (1, 2, 16) and p.dtype == torch.int8
    assert p[0, 0].tolist() == [1, 2, 4, 5, -7, -8] + [0] * 10
    assert p[0, 1].tolist() == [3, 0, 6, 0, -128, 0] + [0] * 10


@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 7), (4, 2, 8), (5, 17, 9), (17, 129, 33), (64, 128, 384),
                                   (64, 384, 128), (8, 256, 704), (64, 704, 256), (64, 1536, 512), (1, 512, 1536)])
def test_packed_sums_are_the_exact_integer_product(simd, m, k, n):
    """Full-range codes, -128 included (the pair sum (-128)(-128) * 2 = 32768 overflows int16,
    not vpmaddwd's int32), and K = 1536 beyond the float32 emulation's exact range (K <= 1040)."""
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    a[0, :2], w[0, :2] = -128, -128  # the extreme pair
    exact = a.long() @ w.long().t()  # [M, N], int64
    got = fused.int_mm_packed(a, fused.pack_weight(w), n, simd)
    assert got.dtype == torch.int32 and got.shape == (m, n)
    assert torch.equal(got.long(), exact)
    if int_mm_exact():  # torch's kernel, where its sums are exact: the same int32 bits
        assert torch.equal(got, torch._int_mm(a, w.t()))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n", [(1, 3, 9), (5, 17, 33), (64, 256, 704), (64, 704, 256), (1024, 256, 768)])
def test_mm_rescale_on_packed_weights_is_the_gemm_then_the_aten_rescale(out_dtype, m, k, n):
    """mm_rescale on a packed weight: aten's rescale of the exact sums, ((float(acc) * xs) *
    ws).to(out_dtype), bit for bit, at odd widths (a last block of 1 column of 8), with the columns
    split over threads, and at a prefill's 1,024 rows."""
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    xs = torch.rand(m, 1, generator=g) * 1e-2
    ws = torch.rand(1, n, generator=g) * 1e-2
    want = ((a.long() @ w.long().t()).to(torch.int32).float() * xs * ws).to(out_dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # the columns split three ways (the tests' one thread would not split them)
    try:
        got = fused.mm_rescale(a, fused.pack_weight(w), xs, ws, out_dtype)
    finally:
        torch.set_num_threads(threads)
    assert got.dtype == out_dtype and got.shape == (m, n)
    assert torch.equal(got.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32))


def test_the_profiler_counts_the_packed_gemm_inside_mm_rescale_as_a_gemm():
    """suite bench rollout --profile groups self time by operator: the packed GEMM runs inside
    mm_rescale (no dispatch), so it is recorded as its own child, suite_fused::int_mm_packed."""
    from torch.profiler import ProfilerActivity, profile

    a = torch.randint(-128, 128, (64, 512), dtype=torch.int8)
    p = fused.pack_weight(torch.randint(-128, 128, (1536, 512), dtype=torch.int8))
    xs, ws = torch.rand(64, 1), torch.rand(1, 1536)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fused.mm_rescale(a, p, xs, ws, torch.bfloat16)
    calls = {ev.key: ev.count for ev in prof.key_averages()}
    assert calls.get("suite_fused::mm_rescale") == 1 and calls.get("suite_fused::int_mm_packed") == 1


def test_extreme_codes_at_the_int32_edge():
    """All -128 x -128 over K = 4096: 4096 * 16384 = 2**26 per sum, exactly."""
    a = torch.full((4, 4096), -128, dtype=torch.int8)
    w = torch.full((9, 4096), -128, dtype=torch.int8)
    for simd in SIMD:
        assert torch.equal(fused.int_mm_packed(a, fused.pack_weight(w), 9, simd), torch.full((4, 9), 2 ** 26,
                                                                                              dtype=torch.int32))


def test_bad_packed_weights_are_refused_naming_the_layout():
    w = torch.zeros(8, 6, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="pack_weight of an"):
        fused.int_mm_packed(torch.zeros(2, 7, dtype=torch.int8), fused.pack_weight(w), 8)  # K mismatch
    with pytest.raises(RuntimeError, match="int8"):
        fused.pack_weight(w.float())


def _model(seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=80, **PRESETS["tiny"]))


def test_an_engine_on_the_packed_kernel_samples_the_same_bits_across_a_sync():
    """Packed (C++ decode loop and Python loop) against the float32 emulation (exact at the tiny
    preset's K <= 384), as an AVX2 CPU runs them (bf16 attention emulated), and torch._int_mm
    where exact: the same tokens and log-probs, and after a weight sync with new values, which
    must reach the packed weights in place."""
    m = _model(0)
    # bf16 outside the integer GEMMs emulated in all of them (an AVX2 CPU's engine), so only those differ
    engines = {"emulated": RolloutEngine(m, QuantScheme("int8"), kernels="emulated")}
    for name in ("packed", "packed/python-loop") + (("int_mm",) if int_mm_exact() else ()):
        e = engines[name] = RolloutEngine(m, QuantScheme("int8"), kernels="native", bf16_kernels="emulated")
        e.set_int8_gemm(name.split("/")[0])
        if "python-loop" in name:
            set_native_loop(e, False)
    # the C++ loop reads the packed weights (its operands are 3-d: qlinear.Int8Linear.gemm_weight)
    assert all(w.dim() == 3 for w in engines["packed"].decoder.native.weights if w.dtype == torch.int8)
    gemms = {name: {x.gemm for x in e.model.modules() if isinstance(x, Int8Linear)} for name, e in engines.items()}
    assert gemms["packed"] == {"packed"} and gemms["emulated"] == {"float32"}
    assert engines["packed"].decoder.cpp_loop and not engines["packed/python-loop"].decoder.cpp_loop
    prompts = rand_prompts([5, 3, 7, 4, 6])
    for step in range(2):
        outs = {name: e.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=1.0, stop_id=-1, pad_id=0,
                                 generator=torch.Generator().manual_seed(1)) for name, e in engines.items()}
        ref = outs["emulated"]
        for name, ro in outs.items():
            assert torch.equal(ro.tokens, ref.tokens), name
            assert torch.equal(ro.behav_logp.view(torch.int32), ref.behav_logp.view(torch.int32)), name
        m2 = _model(step + 1)
        for e in engines.values():
            e.sync(m2)


def test_native_int8_picks_the_packed_kernel_only_without_vnni():
    e = RolloutEngine(_model(0), QuantScheme("int8"), kernels="native")
    gemm = {x.gemm for x in e.model.modules() if isinstance(x, Int8Linear)}
    assert gemm == ({"int_mm"} if cpu_features().int8_native else {"packed"})


def test_set_int8_gemm_refuses_an_emulated_engine_and_unknown_names():
    e = RolloutEngine(_model(0), QuantScheme("int8"), kernels="emulated")
    with pytest.raises(ValueError, match="native CPU int8 engine"):
        set_int8_gemm(e.model, "packed")
    with pytest.raises(ValueError, match="allowed: int_mm, packed"):
        set_int8_gemm(e.model, "vnni")


def test_the_unfused_packed_path_gives_the_fused_bits():
    """set_int8_fused(False) on a packed engine: int_mm_packed, then the rescale in aten."""
    m = _model(0)
    a = RolloutEngine(m, QuantScheme("int8"), kernels="native", bf16_kernels="emulated")
    b = RolloutEngine(m, QuantScheme("int8"), kernels="native", bf16_kernels="emulated")
    for e in (a, b):
        e.set_int8_gemm("packed")
    set_int8_fused(b.model, False)
    prompts = rand_prompts([4, 6, 2])
    ra, rb = (e.generate(prompts, max_new_tokens=6, temperature=1.0, top_p=1.0, stop_id=-1, pad_id=0,
                         generator=torch.Generator().manual_seed(2)) for e in (a, b))
    assert torch.equal(ra.tokens, rb.tokens)
    assert torch.equal(ra.behav_logp.view(torch.int32), rb.behav_logp.view(torch.int32))
