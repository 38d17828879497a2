"""The fused W8A8 path (suite.embedded.fused) against the unfused one, bit for bit.

Its float32 operations are those of ``quantize_int8_per_token`` and ``Int8Linear``'s unfused
rescale in the same order, and the GEMM is the same exact ``torch._int_mm``: codes, scales and
outputs must be identical, not close (equality of bit patterns, so -0.0 vs 0.0 or a different
NaN would fail too)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest
import torch
import torch.nn.functional as F

from _prompts import rand_prompts
from suite.core.quant import QuantScheme, quantize_int8_per_channel, quantize_int8_per_token
from suite.embedded import fused
from suite.embedded.engine import RolloutEngine
from suite.embedded.model import PRESETS, ModelConfig, Transformer
from suite.embedded.qlinear import Int8Linear, set_int8_fused
from suite.hardware import int_mm_exact

if shutil.which("g++") is None:
    pytest.skip("no C++ compiler: the fused extension cannot be built here (the engine runs unfused)",
                allow_module_level=True)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a float tensor, as integers."""
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


def test_the_extension_builds_where_a_compiler_exists():
    assert fused.available()


def test_prebuild_builds_every_extension_and_says_so():
    """`python -m suite.embedded.prebuild` (what the test session starts in the background, and
    what a cluster runs before a sweep) builds or loads both extensions and names each."""
    out = subprocess.run([sys.executable, "-m", "suite.embedded.prebuild"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["suite_int8_linear: built", "suite_decode_layers: built"], out.stdout


def test_a_changed_source_is_built_under_another_name(tmp_path):
    """Builds are cached per source version (cext.build_name), so two checkouts of different
    versions on one machine never load each other's library."""
    from suite.embedded import cext

    a, b = tmp_path / "a.cpp", tmp_path / "b.cpp"
    a.write_text("int f() { return 1; }\n")
    b.write_text("int f() { return 2; }\n")
    assert cext.build_name("x", str(a)) == cext.build_name("x", str(a)) != cext.build_name("x", str(b))
    assert cext.build_name("x", str(a)).startswith("x_")


def test_two_environments_or_checkouts_do_not_share_a_build(tmp_path):
    """Two venvs on one machine (two CI clones, the project's venv and .ci/vllm-cpu's) share
    torch's extension cache; under one name each recompiled the other's build at every process
    start, because ninja's command line names the venv's torch headers (and the checkout's source
    file). The name covers every path that torch's build puts on that command line."""
    from torch.utils import cpp_extension

    from suite.embedded import cext

    a = tmp_path / "a.cpp"
    a.write_text("int f() { return 1; }\n")
    here = cext.environment_key()
    assert cext.build_name("x", str(a)) == cext.build_name("x", str(a), here)
    assert cext.build_name("x", str(a), here) != cext.build_name("x", str(a), here.replace("/", "/other/", 1))
    (tmp_path / "clone").mkdir()
    shutil.copy(a, tmp_path / "clone" / "a.cpp")  # the same source in another checkout
    assert cext.build_name("x", str(a)) != cext.build_name("x", str(tmp_path / "clone" / "a.cpp"))
    parts = here.split("\n")
    dirs = cpp_extension.include_paths() + cpp_extension.library_paths()
    assert dirs and all(os.path.abspath(d).startswith(parts[0] + os.sep) for d in dirs), (dirs, parts)
    assert sysconfig.get_paths()["include"] in parts and torch.__version__ in parts
    # the session's own build, where there is one: every -isystem / -L directory of its build.ninja
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    src = os.path.join(cext.CSRC, "int8_linear.cpp")
    disk = cext.build_name("suite_int8_linear", src)
    for ninja in [n for d in cext.build_dirs(root, disk) if os.path.exists(n := os.path.join(d, "build.ninja"))]:
        text = open(ninja).read()
        named = re.findall(r"-(?:isystem |L)(\S+)", text)
        assert named, text
        assert all(any(os.path.abspath(d).startswith(p) for p in parts) for d in named), (named, parts)
        assert re.findall(r"^build \S+\.o: compile (\S+)$", text, re.M) == [os.path.abspath(src)], text


def _rows(dtype: torch.dtype) -> torch.Tensor:
    """Rows that exercise every branch: round-half ties, an all-zero row, subnormal scales,
    values near the float32 maximum, a row whose amax is negative, and K not a multiple of any
    vector width."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 37, generator=g) * torch.logspace(-3, 3, 9)[:, None]  # [9, 37]
    x[0, :6] = torch.tensor([127.0, 2.5, 3.5, -0.5, -1.5, 126.5])  # scale 1: ties go to even
    x[1] = 0.0
    x[2] = torch.tensor(1e-44) * torch.arange(37)  # subnormals: scale rounds to 0 or one ulp
    x[3, :3] = torch.tensor([3e38, -3.3e38, 1.0])
    x[4] = -x[4].abs()  # amax from the negative side
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_rows_equals_quantize_int8_per_token(dtype):
    x = _rows(dtype)
    want_codes, want_scales = quantize_int8_per_token(x.float())
    codes, scales = fused.quant_rows(x)
    assert codes.dtype == torch.int8 and scales.shape == (9, 1)
    assert torch.equal(codes, want_codes)
    assert torch.equal(bits(scales), bits(want_scales))
    assert codes[0, :6].tolist() == [127, 2, 4, 0, -2, 126]  # by hand: half to even


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_quant_rows_rejects_non_finite_rows_as_the_unfused_path_does(bad):
    x = _rows(torch.float32)
    x[5, 7] = bad
    with pytest.raises(ValueError, match="cannot quantize tensor") as got:
        fused.quant_rows(x)
    with pytest.raises(ValueError) as want:
        quantize_int8_per_token(x.float())
    assert str(got.value) == str(want.value)


def _unfused_mm(codes: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Int8Linear's unfused GEMM: torch._int_mm on int8 weight codes [N, K], F.linear on float ones."""
    return torch._int_mm(codes, w.t()).float() if w.dtype == torch.int8 else F.linear(codes.float(), w)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("w_dtype", [torch.int8, torch.float32])
@pytest.mark.parametrize("m,k,n", [(1, 16, 8), (13, 37, 29), (64, 2048, 96)])
def test_mm_rescale_equals_the_unfused_rescale(out_dtype, w_dtype, m, k, n):
    """Both GEMMs (native int8 codes, emulated float32 codes). K = 2048 with full-range codes:
    sums beyond 2**24, so int -> float (or the float32 sum) rounds too."""
    if w_dtype == torch.int8 and not int_mm_exact():
        pytest.skip("torch._int_mm saturates under this ISA cap (suite.hardware.int_mm_exact)")
    g = torch.Generator().manual_seed(m)
    codes = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = quantize_int8_per_channel(torch.randn(n, k, generator=g))[0].to(w_dtype)  # [N, K]
    xs, ws = torch.rand(m, 1, generator=g) + 1e-3, torch.rand(1, n, generator=g) + 1e-3
    want = _unfused_mm(codes, w).mul_(xs).mul_(ws).to(out_dtype)
    got = fused.mm_rescale(codes, w.t(), xs, ws, out_dtype)
    assert got.dtype == out_dtype and torch.equal(bits(got), bits(want))
    # unit scales: the outputs are the integer sums, so bf16's ties (e.g. 257 -> 256) are hit
    ones_m, ones_n = torch.ones(m, 1), torch.ones(1, n)
    want = _unfused_mm(codes, w).to(out_dtype)
    assert torch.equal(bits(fused.mm_rescale(codes, w.t(), ones_m, ones_n, out_dtype)), bits(want))


def _model(seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=80, **{**PRESETS["tiny"], "d_model": 128}))


# native: torch._int_mm with VNNI / AMX, else the suite's packed kernel (both exact here)
KERNELS = ["emulated", "native"]


@pytest.mark.parametrize("kernels", KERNELS)
def test_the_int8_engine_runs_fused_and_samples_the_unfused_bits_across_a_sync(kernels):
    """Same tokens and log-probs as the unfused engine, and after a weight sync with new
    values (same shapes) too: the fused path reads the weight buffers each call."""
    m = _model(0)
    a = RolloutEngine(m, QuantScheme("int8"), kernels=kernels)
    b = RolloutEngine(m, QuantScheme("int8"), kernels=kernels)
    set_int8_fused(b.model, False)
    lin = [x for x in a.model.modules() if isinstance(x, Int8Linear)]
    assert len(lin) == 7 * m.cfg.n_layers and all(x.fused for x in lin)
    assert not any(x.fused for x in b.model.modules() if isinstance(x, Int8Linear))
    assert b.decoder.native is None or not b.decoder.native.applies()  # nor b's C++ decode loop (fused calls)
    prompts = rand_prompts([5, 3, 7, 4])

    def gen(e):
        return e.generate(prompts, max_new_tokens=6, temperature=1.0, top_p=1.0, stop_id=-1, pad_id=0,
                          generator=torch.Generator().manual_seed(1))

    for step in range(2):
        ra, rb = gen(a), gen(b)
        assert torch.equal(ra.tokens, rb.tokens)
        assert torch.equal(bits(ra.behav_logp), bits(rb.behav_logp))
        m2 = _model(step + 1)  # new weight values, same shapes
        a.sync(m2), b.sync(m2)


def test_set_int8_fused_switches_both_ways():
    e = RolloutEngine(_model(0), QuantScheme("int8"), kernels="emulated")
    set_int8_fused(e.model, False)
    assert not any(x.fused or x.act_quant.fn.fused for x in e.model.modules() if isinstance(x, Int8Linear))
    set_int8_fused(e.model, True)
    assert all(x.fused and x.act_quant.fn.fused for x in e.model.modules() if isinstance(x, Int8Linear))
