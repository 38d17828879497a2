"""suite.core.quant: hand-computed codes, error bounds, edge cases, STE."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from suite.core.quant import (
    FP8_E4M3_MAX,
    QuantScheme,
    dequantize,
    fake_quant,
    fake_quant_act,
    quant_step,
    quantize,
    quantize_fp8,
    quantize_int8_per_channel,
    quantize_int8_per_token,
    quantize_w4,
)

SCHEMES = [
    QuantScheme("fp32"),
    QuantScheme("bf16"),
    QuantScheme("int8"),
    QuantScheme("fp8", "per_tensor"),
    QuantScheme("fp8", "per_channel"),
    QuantScheme("fp8", "block", block_size=4),
    QuantScheme("w4a16", group_size=8),
    QuantScheme("w4a16", group_size=8, symmetric=False),
    QuantScheme("w4a16", group_size=128),  # group longer than the row: one group per row
]
IDS = [f"{s.precision}-{s.fp8_granularity}-{s.group_size}-{s.symmetric}" for s in SCHEMES]


def _weight(seed: int, out_f: int, in_f: int, magnitude: float, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g, dtype=torch.float64) * magnitude
    # heavy-tailed outliers and an all-zero row: the cases that break naive quantizers
    w[0, 0] *= 30.0
    if out_f > 2:
        w[2] = 0.0
    return w.to(dtype)


# ----------------------------------------------------------------------------- scheme


def test_scheme_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="int8"):
        QuantScheme("int4")
    with pytest.raises(ValueError, match="per_channel"):
        QuantScheme("fp8", fp8_granularity="per_row")
    with pytest.raises(ValueError):
        QuantScheme("w4a16", group_size=0)


# ----------------------------------------------------------------------------- hand cases


def test_int8_per_channel_hand() -> None:
    w = torch.tensor([[63.5, -31.75, 0.25], [0.0, 0.0, 0.0], [-2.0, 1.0, 0.5]])
    codes, scales = quantize_int8_per_channel(w)
    # row 0: scale 63.5/127 = 0.5; -31.75/0.5 = -63.5 and 0.25/0.5 = 0.5 round half to even.
    assert codes.dtype == torch.int8 and scales.shape == (3, 1)
    torch.testing.assert_close(scales, torch.tensor([[0.5], [0.0], [2.0 / 127]]))
    assert codes[0].tolist() == [127, -64, 0]
    assert codes[1].tolist() == [0, 0, 0]  # all-zero row: zeros, no NaN
    assert codes[2].tolist() == [-127, 64, 32]  # 1/(2/127) = 63.5 -> 64; 0.5/(2/127) = 31.75 -> 32
    deq = dequantize(quantize(w, QuantScheme("int8")))
    torch.testing.assert_close(deq[0], torch.tensor([63.5, -32.0, 0.0]))
    assert torch.equal(deq[1], torch.zeros(3))
    torch.testing.assert_close(quant_step(w, QuantScheme("int8")), scales.expand(3, 3))


def test_int8_per_token_any_leading_shape() -> None:
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) - 11.0
    codes, scales = quantize_int8_per_token(x)
    assert codes.shape == (2, 3, 4) and scales.shape == (2, 3, 1)
    torch.testing.assert_close(scales, x.abs().amax(-1, keepdim=True) / 127)
    torch.testing.assert_close(codes.float() * scales, x, atol=0.5 * scales.max().item(), rtol=0)
    assert codes.abs().amax(-1).tolist() == [[127] * 3] * 2


def test_fp8_hand_and_step() -> None:
    # per-channel scale = 448 / 448 = 1: codes are plain E4M3 roundings.
    w = torch.tensor([[448.0, 1.0, 0.3, -300.0, 0.001]])
    codes, scales = quantize_fp8(w, "per_channel")
    assert codes.dtype == torch.float8_e4m3fn
    torch.testing.assert_close(scales, torch.tensor([[1.0]]))
    # 0.3 lies in [0.25, 0.5) where E4M3 spacing is 2**-5: 9.6 steps -> 10 * 2**-5 = 0.3125;
    # -300 in [256, 448] (spacing 32) -> -288; 0.001 is subnormal (spacing 2**-9):
    # 0.512 steps -> 1 step = 2**-9
    expect = torch.tensor([[448.0, 1.0, 0.3125, -288.0, 2.0**-9]])
    torch.testing.assert_close(codes.float() * scales, expect)
    step = quant_step(w, QuantScheme("fp8"))
    torch.testing.assert_close(step, torch.tensor([[32.0, 2.0**-3, 2.0**-5, 32.0, 2.0**-9]]))


def test_fp8_saturates_never_nan() -> None:
    # per-tensor scale is set by the big row; values can't exceed 448 after scaling, but a
    # direct cast of a value just above the range would be NaN without the clamp.
    w = torch.tensor([[1e30, -1e30, 3.0], [1e-30, 0.0, -5e29]])
    for gran in ("per_tensor", "per_channel", "block"):
        out = fake_quant(w, QuantScheme("fp8", gran, block_size=2))
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out[0, :2], w[0, :2])
    # Whether a plain cast of an out-of-range value saturates or gives NaN depends on the
    # torch version and device; quantize_fp8 clamps first so it never depends on it.
    codes, _ = quantize_fp8(w, "per_tensor")
    assert codes.float()[0, :2].tolist() == [448.0, -448.0]


def test_fp8_step_matches_grid_gaps() -> None:
    # Independent reference: enumerate every finite E4M3 value and take the gap around y.
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = torch.unique(grid[torch.isfinite(grid)])  # sorted, -448 .. 448
    y = torch.rand(1, 4000, generator=torch.Generator().manual_seed(0)) * 896 - 448
    y[0, 0] = 448.0  # fixes the per-tensor scale at exactly 1
    idx = torch.searchsorted(grid, y.abs().clamp(max=447.99), right=True)
    gap = grid[idx] - grid[idx - 1]
    step = quant_step(y, QuantScheme("fp8", "per_tensor"))
    torch.testing.assert_close(step[0, 1:], gap[0, 1:])


def test_fp8_block_matches_loop_reference() -> None:
    w = _weight(1, 5, 7, 0.1)
    codes, scales = quantize_fp8(w, "block", block_size=4)
    assert scales.shape == (2, 2) and codes.shape == (5, 7)
    for i in range(2):
        for j in range(2):
            blk = w[4 * i : 4 * i + 4, 4 * j : 4 * j + 4]
            torch.testing.assert_close(scales[i, j], blk.abs().max() / FP8_E4M3_MAX)
            ref = (blk / scales[i, j]).to(torch.float8_e4m3fn).float()
            torch.testing.assert_close(codes[4 * i : 4 * i + 4, 4 * j : 4 * j + 4].float(), ref)


def test_w4_symmetric_hand() -> None:
    # one group of 4: amax 7.5 -> scale 7.5 / 7.5 = 1; 7.5 -> 8 (half to even) -> clamp 7; -7.5 -> -8
    w = torch.tensor([[7.5, -7.5, 1.0, 0.0]])
    codes, scales = quantize_w4(w, group_size=4)
    assert codes.dtype == torch.int8 and codes.tolist() == [[7, -8, 1, 0]]
    torch.testing.assert_close(scales, torch.tensor([[1.0]]))
    torch.testing.assert_close(fake_quant(w, QuantScheme("w4a16", group_size=4)), torch.tensor([[7.0, -8.0, 1.0, 0.0]]))


def test_w4_asymmetric_hand() -> None:
    # range [-5, 10] (contains 0) -> scale 15/15 = 1, zero point 5
    w = torch.tensor([[-5.0, 2.4, 10.0, 0.0]])
    codes, scales, zeros = quantize_w4(w, group_size=4, symmetric=False)
    assert codes.dtype == torch.uint8 and codes.tolist() == [[0, 7, 15, 5]]
    assert zeros.tolist() == [[5]]
    torch.testing.assert_close(scales, torch.tensor([[1.0]]))
    deq = fake_quant(w, QuantScheme("w4a16", group_size=4, symmetric=False))
    torch.testing.assert_close(deq, torch.tensor([[-5.0, 2.0, 10.0, 0.0]]))
    # all-positive group: 0 is forced into the range (lo = 0), so the zero point is 0
    _, s2, z2 = quantize_w4(torch.tensor([[3.0, 1.5, 0.75]]), group_size=4, symmetric=False)
    assert z2.tolist() == [[0]]
    torch.testing.assert_close(s2, torch.tensor([[0.2]]))


def test_w4_group_layout_with_ragged_tail() -> None:
    w = _weight(2, 3, 10, 1.0)
    codes, scales = quantize_w4(w, group_size=4)
    assert codes.shape == (3, 10) and scales.shape == (3, 3)
    torch.testing.assert_close(scales[:, 2], w[:, 8:].abs().amax(-1) / 7.5)  # short last group
    torch.testing.assert_close(scales[:, 0], w[:, :4].abs().amax(-1) / 7.5)


def test_fp32_identity_and_bf16_roundtrip() -> None:
    w = _weight(3, 4, 6, 1.0)
    assert fake_quant(w, QuantScheme("fp32")) is w
    assert torch.equal(fake_quant(w, QuantScheme("bf16")), w.bfloat16().float())
    # ulp of bf16 at 1.5 is 2**-7; of fp32 2**-23
    one = torch.tensor([[1.5]])
    assert quant_step(one, QuantScheme("bf16")).item() == 2.0**-7
    assert quant_step(one, QuantScheme("fp32")).item() == 2.0**-23


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("scheme", SCHEMES, ids=IDS)
def test_zero_rows_and_zero_tensor(scheme: QuantScheme) -> None:
    w = _weight(4, 5, 12, 1.0)
    out = fake_quant(w, scheme)
    assert torch.equal(out[2], torch.zeros(12))
    assert torch.isfinite(out).all()
    z = torch.zeros(3, 8)
    assert torch.equal(fake_quant(z, scheme), z)
    assert torch.isfinite(quant_step(z, scheme)).all()


@pytest.mark.parametrize("scheme", SCHEMES, ids=IDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_raises_naming_tensor(scheme: QuantScheme, bad: float) -> None:
    w = _weight(5, 4, 8, 1.0)
    w[1, 3] = bad
    with pytest.raises(ValueError, match="layers.3.attn.wq"):
        fake_quant(w, scheme, name="layers.3.attn.wq")
    with pytest.raises(ValueError, match="layers.3.attn.wq"):
        quantize(w, scheme, name="layers.3.attn.wq")
    with pytest.raises(ValueError, match="layers.3.attn.wq"):
        quant_step(w, scheme, name="layers.3.attn.wq")


def test_non_2d_weight_rejected() -> None:
    with pytest.raises(ValueError, match="2-D"):
        quantize_int8_per_channel(torch.ones(3))
    with pytest.raises(ValueError, match="2-D"):
        fake_quant(torch.ones(2, 3, 4), QuantScheme("w4a16"))


# ----------------------------------------------------------------------------- STE


@pytest.mark.parametrize("scheme", SCHEMES, ids=IDS)
def test_ste_forward_exact_gradient_identity(scheme: QuantScheme) -> None:
    w = _weight(6, 4, 16, 0.5).requires_grad_(True)
    y = fake_quant(w, scheme, ste=True)
    assert torch.equal(y.detach(), fake_quant(w.detach(), scheme))
    c = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    (y * c).sum().backward()
    assert torch.equal(w.grad, c)
    if scheme.precision != "fp32":
        assert not fake_quant(w, scheme, ste=False).requires_grad


# ----------------------------------------------------------------------------- activations (W8A8)


def _tokens(dtype=torch.float32) -> torch.Tensor:
    """[2, 3, 40] activations whose tokens span six orders of magnitude, with an outlier and a
    zero token: per-token scales must differ, and a per-tensor scale would show."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 40, generator=g) * torch.logspace(-3, 3, 6).reshape(2, 3, 1)
    x[0, 1, 7] *= 40.0
    x[1, 2] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_act_fake_quant_int8_is_the_per_token_quantizer(dtype) -> None:
    x = _tokens(dtype)
    out = fake_quant_act(x, QuantScheme("int8"))
    # the rollout's INT8 activations: float32 codes * scales of x.float(), one scale per token
    codes, scales = quantize_int8_per_token(x.reshape(6, 40).float())  # [6, 40], [6, 1]
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, (codes.float() * scales).reshape(2, 3, 40).to(dtype))
    # per token, not per tensor: a small token keeps its own resolution
    rel = ((out.float() - x.float()).abs().amax(-1) / x.float().abs().amax(-1).clamp_min(1e-30)).flatten()
    assert rel[:5].max() <= 0.5 / 127 + 2.0**-8  # half a step (+ bf16 rounding of the output)
    assert torch.equal(out[1, 2], torch.zeros(40, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_act_fake_quant_fp8_is_the_per_token_quantizer(dtype) -> None:
    x = _tokens(dtype)
    out = fake_quant_act(x, QuantScheme("fp8", "block", block_size=16))  # the weights' layout is irrelevant
    codes, scales = quantize_fp8(x.reshape(6, 40).float(), "per_channel")  # rows of [M, K] = tokens
    assert out.dtype == dtype
    assert torch.equal(out, (codes.float() * scales).reshape(2, 3, 40).to(dtype))
    assert torch.equal(out[1, 2], torch.zeros(40, dtype=dtype))


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_act_fake_quant_groups_along_features(precision) -> None:
    """group_size g: one scale per token and per g features (vLLM's 1 x 128 block-FP8
    activations), the last group short -- as quantizing each slice on its own."""
    x = _tokens()
    scheme = QuantScheme(precision)
    out = fake_quant_act(x, scheme, group_size=16)
    for lo in (0, 16, 32):  # 40 features: groups of 16, 16 and 8
        part = x[..., lo : lo + 16]
        assert torch.equal(out[..., lo : lo + 16], fake_quant_act(part, scheme)), lo
    assert not torch.equal(out, fake_quant_act(x, scheme))
    assert torch.equal(fake_quant_act(x, scheme, group_size=64), fake_quant_act(x, scheme))  # one group


@pytest.mark.parametrize("precision", ["fp32", "bf16", "w4a16"])
def test_act_fake_quant_keeps_16_bit_activations(precision) -> None:
    x = _tokens().requires_grad_(True)
    assert fake_quant_act(x, QuantScheme(precision), ste=True) is x


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_act_fake_quant_ste_gradient_identity(precision) -> None:
    x = _tokens().requires_grad_(True)
    y = fake_quant_act(x, QuantScheme(precision), ste=True, group_size=16)
    assert torch.equal(y.detach(), fake_quant_act(x.detach(), QuantScheme(precision), group_size=16))
    c = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(2))
    (y * c).sum().backward()
    assert torch.equal(x.grad, c)
    assert not fake_quant_act(x, QuantScheme(precision)).requires_grad  # without STE: detached


def test_act_fake_quant_non_finite_raises() -> None:
    x = _tokens()
    x[1, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="q_proj input"):
        fake_quant_act(x, QuantScheme("int8"), name="q_proj input")


# ----------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(
    scheme=st.sampled_from(SCHEMES),
    seed=st.integers(0, 2**31 - 1),
    out_f=st.integers(1, 9),
    in_f=st.integers(1, 40),
    log_mag=st.floats(-8, 4),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_error_at_most_half_step(scheme, seed, out_f, in_f, log_mag, dtype) -> None:
    w = _weight(seed, out_f, in_f, 10.0**log_mag, dtype)
    w_copy = w.clone()
    fq = fake_quant(w, scheme)
    step = quant_step(w, scheme).double()
    assert torch.equal(w, w_copy)  # inputs are never modified in place
    assert fq.dtype == dtype and fq.shape == w.shape
    assert torch.equal(fq, dequantize(quantize(w, scheme)))  # one quantizer, two entry points
    if dtype == torch.bfloat16 and scheme.precision not in ("fp32", "bf16"):
        # the result is rounded back to bf16, which adds its own half-ulp: check in f32
        fq = dequantize(quantize(w, scheme), torch.float32)
    wd, fd = w.double(), fq.double()
    err = (fd - wd).abs()
    # slack: a few roundings of the working dtype relative to the entry's magnitude
    eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    assert (err <= 0.5 * step + 4 * eps * (wd.abs() + fd.abs())).all(), (err / step).max()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), s=st.floats(1.05, 4.0), out_f=st.integers(1, 8), in_f=st.integers(2, 64))
def test_int8_error_of_w_over_s_is_s_times_smaller(seed, s, out_f, in_f) -> None:
    """UAQ's premise (QuRL Sec. 3.3): per-channel INT8 error of W/s is that of W divided by s."""
    w = _weight(seed, out_f, in_f, 0.05, torch.float64)
    scheme = QuantScheme("int8")
    err_w = fake_quant(w, scheme) - w
    err_ws = fake_quant(w / s, scheme) - w / s
    torch.testing.assert_close(err_ws, err_w / s)
    torch.testing.assert_close(quant_step(w / s, scheme), quant_step(w, scheme) / s)


# ----------------------------------------------------------------------------- wa16: W{b}A16, the weight-only dose axis
# Hand-computed codes; the inputs are chosen so every scale is exact (symmetric: amax / (2**(b-1) - 0.5),
# asymmetric: (hi - lo) / (2**b - 1)) and the ties show round-half-to-even and the clamp.
WINT_HAND = [
    # bits, w [1, 8] (two groups of 4), codes, scales
    (4, [15.0, -5.0, 1.0, 2.6, -15.0, 3.0, -0.9, 0.2], [7, -2, 0, 1, -8, 2, 0, 0], [2.0, 2.0]),  # 15 / 7.5
    (3, [7.0, -5.0, 1.0, 2.6, -7.0, 3.0, -0.9, 0.2], [3, -2, 0, 1, -4, 2, 0, 0], [2.0, 2.0]),  # 7 / 3.5
    (2, [3.0, -1.0, 1.2, -3.0, 0.75, 0.0, -0.5, 0.25], [1, 0, 1, -2, 1, 0, -1, 0], [2.0, 0.5]),  # 3 / 1.5, 0.75 / 1.5
    (8, [255.0, -255.0, 3.0, -101.0, 1.0, 0.0, 0.0, 0.0], [127, -128, 2, -50, 127, 0, 0, 0], [2.0, 1 / 127.5]),
]


@pytest.mark.parametrize("bits, w, codes, scales", WINT_HAND, ids=[f"w{b}" for b, *_ in WINT_HAND])
def test_wint_symmetric_codes_by_hand(bits, w, codes, scales) -> None:
    from suite.core.quant import quantize_wint

    q = quantize(torch.tensor([w]), QuantScheme("wa16", bits=bits, group_size=4))
    assert q.codes.dtype == torch.int8 and q.zeros is None
    assert q.codes.tolist() == [codes]
    assert_close(q.scales, torch.tensor([scales]))
    assert_close(dequantize(q), torch.tensor([codes], dtype=torch.float32).view(1, 2, 4).mul(
        torch.tensor(scales).view(1, 2, 1)).view(1, 8))
    c2, s2 = quantize_wint(torch.tensor([w]), bits, 4)
    assert torch.equal(c2, q.codes) and torch.equal(s2, q.scales)


def test_wint_3bit_asymmetric_by_hand() -> None:
    # lo = -8, hi = 6: scale = 14 / 7 = 2, zero = round(8 / 2) = 4, codes = round(w / 2) + 4 (0.5 -> 0)
    w = torch.tensor([[6.0, -8.0, 1.0, 0.0]])
    q = quantize(w, QuantScheme("wa16", bits=3, group_size=4, symmetric=False))
    assert q.codes.dtype == torch.uint8
    assert q.codes.tolist() == [[7, 0, 4, 4]] and q.zeros.tolist() == [[4]]
    assert_close(q.scales, torch.tensor([[2.0]]))
    assert_close(dequantize(q), torch.tensor([[6.0, -8.0, 0.0, 0.0]]))
    assert_close(quant_step(w, q.scheme), torch.full((1, 4), 2.0))


@pytest.mark.parametrize("symmetric", [True, False])
def test_wa16_at_4_bits_is_w4a16_bit_for_bit(symmetric: bool) -> None:
    w = torch.randn(16, 40, generator=torch.Generator().manual_seed(3))
    a = QuantScheme("w4a16", group_size=16, symmetric=symmetric)
    b = QuantScheme("wa16", bits=4, group_size=16, symmetric=symmetric)
    assert torch.equal(fake_quant(w, a), fake_quant(w, b))
    assert torch.equal(quant_step(w, a), quant_step(w, b))
    qa, qb = quantize(w, a), quantize(w, b)
    assert torch.equal(qa.codes, qb.codes) and torch.equal(qa.scales, qb.scales)


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
def test_wint_error_within_half_a_step_and_shrinks_with_bits(bits: int) -> None:
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(bits))
    s = QuantScheme("wa16", bits=bits, group_size=16)
    err = (fake_quant(w, s) - w).abs()
    # symmetric: the clamp at the top code can add up to half a step more at the group's amax
    assert bool((err <= quant_step(w, s) * (0.5 + 1e-6) + (quant_step(w, s) * 0.5)).all())
    if bits > 2:
        coarser = QuantScheme("wa16", bits={3: 2, 4: 3, 6: 4, 8: 6}[bits], group_size=16)
        assert err.mean() < (fake_quant(w, coarser) - w).abs().mean()


def test_wint_bits_outside_the_served_set_are_refused() -> None:
    with pytest.raises(ValueError, match=r"bits=5.*\(2, 3, 4, 6, 8\)"):
        QuantScheme("wa16", bits=5)
    from suite.core.quant import quantize_wint

    with pytest.raises(ValueError, match=r"bits=1"):
        quantize_wint(torch.ones(2, 4), 1, 4)
