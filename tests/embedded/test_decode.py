"""The engine's one-token decode path (suite.embedded.decode) against the model's general forward.

This is where the two implementations of the layers meet: the decode step must give the bits of
``Transformer.hidden`` + ``lm_head`` with a KV cache, and leave the same cache behind, for every
precision the engine runs."""

from __future__ import annotations

import shutil

import pytest
import torch

from _prompts import left_padded, rand_prompts, same_values
from suite.core.quant import PRECISIONS, QuantScheme
from suite.embedded import fused
from suite.embedded.decode import DecodeState, set_native_loop
from suite.embedded.engine import RolloutEngine
from suite.embedded.model import PRESETS, KVCache, ModelConfig, Transformer
from suite.hardware import cpu_features

VOCAB = 80  # the character tokenizer's size


def _model(d_model: int = 128) -> Transformer:
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=VOCAB, **{**PRESETS["tiny"], "d_model": d_model}))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(4.0)
    return m


@pytest.mark.parametrize("loop", ["native", "python"])
@pytest.mark.parametrize("precision,d_model,kernels", [(p, 128, "auto") for p in PRECISIONS]
                         + [("fp32", 96, "auto"), ("bf16", 128, "emulated"), ("w4a16", 128, "emulated"),
                            ("int8", 128, "emulated"), ("int8", 96, "emulated"), ("int8", 96, "auto")])
def test_decode_step_equals_the_general_forward(precision, d_model, kernels, loop):
    """The engine's one-token decode path (suite.embedded.decode.Decoder, which
    RolloutEngine.generate runs) gives the bits of ``model.hidden`` + ``lm_head`` with a KV cache, and
    leaves the same cache behind: with
    left-padded prompts, rows turning into padding mid-way, and (d_model 96: head_dim 48) a
    1 / sqrt(head_dim) that is not a power of two. The caches have spare slots beyond the last
    token (native 16-bit attention reads all of them; they must add nothing). Both layer
    loops: the C++ one (NativeLayers, where it applies) and the Python one."""
    m = _model(d_model)
    e = RolloutEngine(m, QuantScheme(precision), kernels=kernels)
    if kernels == "emulated" and e.dtype == torch.bfloat16:  # bf16 values held in a float32 cache
        assert e.cache_dtype == torch.float32
    if loop == "python":
        set_native_loop(e, False)
    elif e.decoder.native is None:
        pytest.skip(f"the C++ layer loop does not apply to {precision} / {kernels} engines here")
    _assert_decode_equals_general(e, m)


def _assert_decode_equals_general(e: RolloutEngine, m: Transformer) -> None:
    tokens, mask = left_padded(rand_prompts([3, 7, 5, 1, 6]))
    B, P, R = tokens.shape[0], tokens.shape[1], 6
    g = torch.Generator().manual_seed(3)
    new = torch.randint(3, VOCAB, (R, B), generator=g)  # [R, B]
    valid = torch.ones(R, B, dtype=torch.bool)
    valid[2:, 1] = valid[4:, 3] = False  # rows 1 and 3 stop: pads follow
    # the reference cache in the layers' dtype; the engine's may hold it in float32 (cache_dtype)
    general, fast = KVCache(m.cfg, B, P + R + 9, dtype=e.dtype), KVCache(m.cfg, B, P + R + 9, dtype=e.cache_dtype)
    fast.v.fill_(float("nan"))  # uninitialised memory at its worst
    with torch.no_grad():
        for c in (general, fast):
            e.model.hidden(tokens, attention_mask=mask, kv_cache=c)
        state = DecodeState(fast, e.dtype)
        for t in range(R):
            h = e.model.hidden(new[t, :, None], attention_mask=valid[t, :, None], kv_cache=general)  # [B, 1, D]
            want = e.model.lm_head(h[:, 0]).float()  # [B, V]
            assert torch.equal(e.decoder(new[t], valid[t], state), want)
    n = general.length
    assert fast.length == n == P + R
    same_values(fast, general)


@pytest.mark.parametrize("gemm", ["int_mm", "packed"])
def test_int8_linears_of_one_input_share_one_gemm_in_the_cpp_loop_and_a_sync_fills_it(gemm):
    """The C++ loop runs q|k|v and gate|up as one integer GEMM each (qlinear.share_operands): the
    linears' codes, scales and packed weights become views of one buffer, which a weight sync
    fills in place. The decode step still gives the general forward's bits (which runs each
    linear alone), before and after a sync to other weights; with 8-column packed blocks that
    would straddle two linears (d_ff 172) the engine keeps the Python loop."""
    if not fused.available():
        pytest.skip("no fused W8A8 extension here")
    from suite.embedded.qlinear import Int8Linear

    if gemm == "int_mm" and not cpu_features().int8_native:
        pytest.skip("torch._int_mm is not exact on this CPU (no VNNI / AMX): runs use the packed kernel")
    m = _model(96)
    e = RolloutEngine(m, QuantScheme("int8"))
    e.set_int8_gemm(gemm)
    if e.decoder.native is None:
        pytest.skip("int8 runs the Python layer loop here (no native bf16 attention)")
    block = e.model.layers[0]
    a, mlp = block.attn, block.mlp
    assert a.wq.codes.data_ptr() + a.wq.codes.numel() == a.wk.codes.data_ptr()  # rows of one buffer
    assert mlp.w_gate.scale.data_ptr() + 4 * mlp.w_gate.scale.numel() == mlp.w_up.scale.data_ptr()
    _assert_decode_equals_general(e, m)
    other = _model(96)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-0.5)
    e.sync(other)
    assert isinstance(a.wq, Int8Linear) and a.wq.codes.data_ptr() + a.wq.codes.numel() == a.wk.codes.data_ptr()
    _assert_decode_equals_general(e, other)

    torch.manual_seed(0)
    odd = Transformer(ModelConfig(vocab_size=VOCAB, **{**PRESETS["tiny"], "d_model": 96, "d_ff": 172}))
    e = RolloutEngine(odd, QuantScheme("int8"))
    e.set_int8_gemm(gemm)
    assert (e.decoder.native is None) == (gemm == "packed")
    _assert_decode_equals_general(e, odd)


def test_the_cpp_layer_loop_runs_where_it_applies():
    """fp32 (plain linears, float32 attention) everywhere; int8 where its fused linears are
    built, with native (AVX512-BF16 / AMX) or emulated bf16 attention (AVX2's path, forced
    here); never for the emulated bf16 engine, whose linears are not plain."""
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler: the engine runs its Python layer loop (same numbers)")
    m = _model()
    fp32 = RolloutEngine(m, QuantScheme("fp32"))
    assert fp32.decoder.cpp_loop
    set_native_loop(fp32, False)
    assert not fp32.decoder.cpp_loop
    set_native_loop(fp32, True)
    assert fp32.decoder.cpp_loop
    emulated = RolloutEngine(m, QuantScheme("bf16"), kernels="emulated")
    assert emulated.decoder.native is None
    with pytest.raises(ValueError, match="set_native_loop"):
        set_native_loop(emulated, True)
    for kernels in ("auto", "emulated"):
        int8 = RolloutEngine(m, QuantScheme("int8"), kernels=kernels)
        layer = int8.decoder.layers[0]
        assert layer.full_att == (kernels == "auto" and cpu_features().bf16_native)
        assert layer.emu_att == (not layer.full_att)
        assert (int8.decoder.native is not None) == fused.available()
        assert int8.decoder.native is None or int8.decoder.native.int8


def test_a_non_finite_int8_activation_raises_the_quantizers_error_in_the_cpp_loop():
    if not fused.available():
        pytest.skip("no fused W8A8 extension here")
    e = RolloutEngine(_model(), QuantScheme("int8"))
    if e.decoder.native is None:
        pytest.skip("int8 runs the Python layer loop here (no native bf16 attention: the test above)")
    cache = KVCache(e.model.cfg, 2, 8, dtype=e.dtype)
    tokens = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with torch.no_grad():
        e.model.hidden(tokens[:, :1], attention_mask=torch.ones(2, 1, dtype=torch.bool), kv_cache=cache)
        e.model.layers[1].attn_norm.weight[5] = float("inf")  # the second layer's q/k/v input (a view in the loop)
    with pytest.raises(ValueError, match="cannot quantize tensor"):
        e.decoder(tokens[:, 1], torch.ones(2, dtype=torch.bool), DecodeState(cache))
