"""Tests of the rollout engine: quantized linears, weight sync, and batched sampling."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from suite import hardware
from suite.core.quant import (
    QuantScheme,
    fake_quant,
    fake_quant_act,
    quantize_int8_per_channel,
    quantize_int8_per_token,
)
from suite.embedded.engine import Rollout, RolloutEngine
from suite.embedded.qlinear import Int8Linear, SharedActQuant
from _prompts import left_padded, rand_prompts
from suite.embedded.model import PRESETS, ModelConfig, Transformer, response_logprobs

PRECISIONS = ("fp32", "bf16", "int8", "fp8", "w4a16")
VOCAB, PAD = 80, 0  # the character tokenizer's size and pad id


def make_model(seed: int = 0, gain: float = 4.0) -> Transformer:
    """The tiny preset with weights scaled up by ``gain`` (as in test_model.py): with the
    0.02-std init, logits are nearly uniform and every precision would look alike."""
    torch.manual_seed(seed)
    m = Transformer(ModelConfig(vocab_size=VOCAB, **PRESETS["tiny"]))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(gain)
    return m.eval()


@pytest.fixture(scope="module")
def model():
    return make_model()


def gen(engine, prompts, seed=0, **kw) -> Rollout:
    args = dict(max_new_tokens=8, temperature=1.0, top_p=1.0, stop_id=-1, pad_id=PAD)
    args.update(kw)
    return engine.generate(prompts, generator=torch.Generator().manual_seed(seed), **args)


def rel_err(a, b, mask):
    return ((a - b)[mask].norm() / b[mask].norm()).item()


# ----------------------------------------------------------------------------- quantized linears


def test_int8_linear_is_w8a8_with_per_token_scales():
    torch.manual_seed(0)
    w = torch.randn(24, 40)
    x = torch.randn(2, 5, 40) * torch.logspace(-2, 2, 5)[:, None]  # tokens of very different scales
    wc, ws = quantize_int8_per_channel(w)
    xc, xs = quantize_int8_per_token(x.reshape(10, 40))
    want = (xc.double() @ wc.double().t()) * xs.double() * ws.double().t()  # [10, 24], exact integer GEMM
    # the float32 emulation and the int8 kernel (where torch's is exact: not under an AVX2 ISA cap
    # on a VNNI CPU, where runs execute the emulation instead; tests/test_hardware.py)
    for use_int_mm in (False, True) if hardware.int_mm_exact() else (False,):
        lin = Int8Linear(40, 24, use_int_mm, SharedActQuant(quantize_int8_per_token))
        lin.load(w)
        assert_close(lin(x).double().view(10, 24), want)


@pytest.mark.parametrize("precision", ["int8", "fp8", "bf16", "w4a16"])
def test_native_and_emulated_kernels_agree(model, precision):
    """The float32 emulation of a low-precision GEMM has the native kernel's numerics: their
    difference is float32 summation order, far below the quantization error itself."""
    tokens, mask = left_padded(rand_prompts([4, 9, 6]))
    with torch.no_grad():
        ref = model(tokens, attention_mask=mask)
    # what a native-resolved run executes here: native (torch._int_mm, or the packed AVX2 kernel where
    # torch's int8 GEMM is slow or, under an ISA cap, inexact), emulated only without AVX2
    kernels = hardware.executed_kernels("native", precision)
    native = RolloutEngine(model, QuantScheme(precision), kernels=kernels)
    emulated = RolloutEngine(model, QuantScheme(precision), kernels="emulated")
    assert native.native == (kernels == "native") and not emulated.native
    a, b = native.logits(tokens, mask), emulated.logits(tokens, mask)
    if precision in ("int8", "fp8"):  # integer / fp8-code GEMMs with float32 outputs
        assert_close(a, b)
    else:
        # bf16 outputs: bit-identical on an AVX2 CPU (whose bf16 GEMM upcasts too); a kernel
        # that sums in another order may flip a rounding now and then.
        assert rel_err(a, b, mask) < 0.1 * rel_err(b, ref, mask)


def test_fp8_activations_are_quantized_per_token(model):
    e = RolloutEngine(model, QuantScheme("fp8"))
    lin = e.model.layers[0].attn.wq
    x = torch.randn(6, model.cfg.d_model) * torch.logspace(-3, 3, 6)[:, None]
    per_token = QuantScheme("fp8", fp8_granularity="per_channel")  # rows of [M, K] = tokens
    w = fake_quant(model.layers[0].attn.wq.weight.detach(), QuantScheme("fp8"))
    assert_close(lin(x), F.linear(fake_quant(x, per_token), w))
    lin.act_quant.clear()


@pytest.mark.parametrize("precision", ["int8", "fp8"])
@pytest.mark.parametrize("kernels", ["native", "emulated"])
def test_aligned_act_fake_quant_equals_the_engines_activations(model, precision, kernels):
    """suite.core.quant.fake_quant_act (the trainer's aligned forward) gives, bit for bit, the
    activation values the engine's W8A8 linears multiply: dequantized codes * per-token scales."""
    e = RolloutEngine(model, QuantScheme(precision), kernels=kernels)
    aq = e.model.layers[0].attn.wq.act_quant
    x = torch.randn(3, 5, model.cfg.d_model) * torch.logspace(-3, 3, 5)[:, None]  # [3, 5, D]
    for xin in (x, x.to(torch.bfloat16)):  # the engine's own activations are bf16
        got = aq(xin)
        aq.clear()
        if isinstance(got, tuple):  # int8 codes / native fp8 codes, and their per-token scales
            codes, scales = got
            assert scales.shape == (15, 1)
            got = codes.float() * scales  # [15, D]
        want = fake_quant_act(xin, QuantScheme(precision))  # [3, 5, D], in xin's dtype
        # float32 in: the engine's float32 values themselves; bf16 in: those values rounded to bf16
        assert want.dtype == xin.dtype and torch.equal(want, got.view(3, 5, -1).to(xin.dtype))


# ----------------------------------------------------------------------------- numerics vs fp32


def test_fp32_engine_reproduces_response_logprobs(model):
    e = RolloutEngine(model, QuantScheme("fp32"))
    ro = gen(e, rand_prompts([3, 8, 5, 1]), temperature=0.8, max_new_tokens=10)
    logp, _ = response_logprobs(model, ro.tokens, ro.attention_mask, ro.response_start, 0.8)
    assert_close(ro.behav_logp, logp * ro.response_mask)


def test_quantized_logits_close_but_not_equal_with_sane_error_order(model):
    tokens, mask = left_padded(rand_prompts([5, 9, 12, 7, 3, 11]))
    with torch.no_grad():
        ref = model(tokens, attention_mask=mask)
    err = {}
    for p in PRECISIONS:
        out = RolloutEngine(model, QuantScheme(p)).logits(tokens, mask)
        assert out.dtype == torch.float32
        err[p] = rel_err(out, ref, mask)
    assert err["fp32"] == 0.0
    # Measured on this model: bf16 0.014, int8 0.039, fp8 0.13, w4a16 0.41.
    assert 0 < err["bf16"] < err["int8"] < 0.1
    assert 0 < err["fp8"] < 0.3
    assert err["int8"] < err["w4a16"] / 4 and err["fp8"] < err["w4a16"] / 2
    assert err["w4a16"] < 1.0


@pytest.mark.parametrize("gran", ["per_tensor", "block"])
def test_fp8_granularities_run(model, gran):
    tokens, mask = left_padded(rand_prompts([5, 9]))
    with torch.no_grad():
        ref = model(tokens, attention_mask=mask)
    out = RolloutEngine(model, QuantScheme("fp8", fp8_granularity=gran, block_size=32)).logits(tokens, mask)
    assert 0 < rel_err(out, ref, mask) < 0.3


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_engine_left_padding_and_batch_invariance(model, precision):
    """Per-token activation scales: a sequence's numbers never depend on its batch-mates."""
    e = RolloutEngine(model, QuantScheme(precision))
    a, mate = rand_prompts([5, 12], seed=3)
    alone = e.logits(torch.tensor([a]))[0]  # [5, V]
    tokens, mask = left_padded([a, mate])
    assert_close(e.logits(tokens, mask)[0, -5:], alone)
    # The same through generate: greedy tokens and behaviour log-probs of `a` are unchanged.
    ro1 = gen(e, [a], temperature=0.0)
    ro2 = gen(e, [mate, a, mate], temperature=0.0)
    assert torch.equal(ro2.tokens[1, ro2.response_start :], ro1.tokens[0, ro1.response_start :])
    assert_close(ro2.behav_logp[1], ro1.behav_logp[0])


# ----------------------------------------------------------------------------- weight sync


@pytest.mark.parametrize("kernels", ["auto", "native"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_sync_follows_weight_changes_in_place(precision, kernels):
    m = make_model(seed=1)
    scheme = QuantScheme(precision)
    e = RolloutEngine(m, scheme, kernels=kernels)
    tokens, mask = left_padded(rand_prompts([4, 7]))
    before = e.logits(tokens, mask)
    ptrs = {k: t.data_ptr() for k, t in list(e.model.state_dict().items())}
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    seconds = e.sync(m)
    assert isinstance(seconds, float) and seconds > 0
    after = e.logits(tokens, mask)
    assert not torch.allclose(after, before)
    assert torch.equal(after, RolloutEngine(m, scheme, kernels=kernels).logits(tokens, mask))  # = a fresh engine
    assert ptrs == {k: t.data_ptr() for k, t in e.model.state_dict().items()}  # nothing re-allocated


def test_engine_keeps_its_own_copy_and_the_callers_rng(model):
    state = torch.get_rng_state()
    e = RolloutEngine(model, QuantScheme("int8"))
    assert torch.equal(torch.get_rng_state(), state)  # building an engine consumes no randomness
    assert all(not p.requires_grad for p in e.model.parameters())
    names = {n for n, mod in e.model.named_modules() if isinstance(mod, Int8Linear)}
    assert len(names) == 7 * model.cfg.n_layers and "layers.0.attn.wq" in names and "lm_head" not in names
    assert e.model.lm_head.weight.data_ptr() != model.lm_head.weight.data_ptr()


# ----------------------------------------------------------------------------- sampling


def test_rollout_layout(model):
    prompts = rand_prompts([3, 8, 5])
    ro = gen(RolloutEngine(model, QuantScheme("int8")), prompts, max_new_tokens=6)
    B, P = 3, 8
    assert ro.response_start == P and ro.tokens.shape == (B, P + 6) and ro.tokens.dtype == torch.long
    assert ro.attention_mask.dtype == torch.bool and ro.response_mask.dtype == torch.bool
    assert ro.behav_logp.dtype == torch.float32 and ro.behav_logp.shape == (B, 6)
    assert ro.response_len.tolist() == [6, 6, 6]
    for i, p in enumerate(prompts):  # left-padded prompts
        assert ro.tokens[i, P - len(p) : P].tolist() == p
        assert ro.attention_mask[i, : P - len(p)].sum() == 0 and ro.attention_mask[i, P - len(p) :].all()
    assert (ro.behav_logp < 0).all()


def test_stop_token_handling(model):
    """With a stop id, each row equals the stop-free run up to and including its first stop,
    then only (masked) pads follow; the loop ends early once every row has stopped."""
    e = RolloutEngine(model, QuantScheme("fp32"))
    prompts = rand_prompts([3, 6, 4, 5, 2, 7], seed=5)
    free = gen(e, prompts, seed=7, max_new_tokens=12)
    resp = free.tokens[:, free.response_start :]  # [B, 12]
    stop = int(resp[:, :6].flatten().mode().values)  # a token most rows emit early
    ro = gen(e, prompts, seed=7, max_new_tokens=12, stop_id=stop)
    out = ro.tokens[:, ro.response_start :]  # [B, R]
    assert ro.response_mask.shape[1] <= 12
    stopped = 0
    for i in range(len(prompts)):
        hits = (resp[i] == stop).nonzero()
        n = int(hits[0]) + 1 if len(hits) else 12  # length incl. the stop token
        stopped += bool(len(hits))
        assert ro.response_len[i] == n
        assert ro.response_mask[i, :n].all() and not ro.response_mask[i, n:].any()
        assert torch.equal(out[i, :n], resp[i, :n])
        assert (out[i, n:] == PAD).all() and (ro.behav_logp[i, n:] == 0).all()
        assert_close(ro.behav_logp[i, :n], free.behav_logp[i, :n])
        assert torch.equal(ro.attention_mask[i, ro.response_start :], ro.response_mask[i])
    assert stopped >= 2
    # Early exit: if every row stops, R is the longest response.
    if stopped == len(prompts):
        assert ro.response_mask.shape[1] == int(ro.response_len.max())


def test_early_exit_when_all_rows_stop(model):
    e = RolloutEngine(model, QuantScheme("fp32"))
    greedy = gen(e, [[5, 6, 7]] * 2, temperature=0.0, max_new_tokens=10)
    first = int(greedy.tokens[0, greedy.response_start])
    ro = gen(e, [[5, 6, 7]] * 2, temperature=0.0, max_new_tokens=10, stop_id=first)
    assert ro.tokens.shape == (2, 4) and ro.response_len.tolist() == [1, 1]


def test_seeded_sampling_is_reproducible(model):
    e = RolloutEngine(model, QuantScheme("int8"))
    prompts = rand_prompts([4, 6, 3])
    a, b, c = gen(e, prompts, seed=11), gen(e, prompts, seed=11), gen(e, prompts, seed=12)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.behav_logp, b.behav_logp)
    assert not torch.equal(a.tokens, c.tokens)
    g = torch.Generator().manual_seed(3)
    e.generate(prompts, max_new_tokens=4, temperature=1.0, top_p=1.0, stop_id=-1, pad_id=PAD, generator=g)
    assert not torch.equal(g.get_state(), torch.Generator().manual_seed(3).get_state())  # the stream advanced


def test_greedy_decoding(model):
    e = RolloutEngine(model, QuantScheme("fp32"))
    prompts = rand_prompts([4, 6])
    ro = gen(e, prompts, seed=1, temperature=0.0)
    assert torch.equal(ro.tokens, gen(e, prompts, seed=2, temperature=0.0).tokens)  # the seed is irrelevant
    with torch.no_grad():
        logits = model(ro.tokens, attention_mask=ro.attention_mask)[:, ro.response_start - 1 : -1]  # [B, R, V]
    assert torch.equal(ro.tokens[:, ro.response_start :], logits.argmax(-1))
    want = torch.log_softmax(logits, -1).max(-1).values  # the un-tempered log-prob of the argmax
    assert_close(ro.behav_logp, want)


def test_top_p(model):
    e = RolloutEngine(model, QuantScheme("fp32"))
    prompts = rand_prompts([4, 6, 5])
    greedy = gen(e, prompts, temperature=0.0)
    tiny_nucleus = gen(e, prompts, temperature=0.7, top_p=1e-6)  # the nucleus is the top token
    assert torch.equal(tiny_nucleus.tokens, greedy.tokens)
    # behav_logp is of the full tempered distribution, not of the truncated one.
    ro = tiny_nucleus
    logp, _ = response_logprobs(model, ro.tokens, ro.attention_mask, ro.response_start, 0.7)
    assert_close(tiny_nucleus.behav_logp, logp)
    assert (logp < -1e-3).any()
    # A wide nucleus samples more than one distinct continuation.
    wide = gen(e, [[5, 6, 7]] * 16, temperature=1.0, top_p=0.9)
    assert len({tuple(r) for r in wide.tokens.tolist()}) > 1


def test_repeated_prompts_share_one_prefill(model):
    """GRPO groups: a prompt repeated in the batch is prefilled once; every copy still gets the
    numbers of its own prefill. The copies in one batch are bit-identical. Against a batch of the
    distinct prompts alone the greedy tokens are equal and the log-probs equal up to summation
    order, which depends on the batch's row count where the bf16 GEMMs run as AMX tiles or as the
    AVX2 emulation: over 40 prompt pairs, max relative difference 6.4e-3 (0.0165 absolute) on the
    AMX Xeon and 2.9e-5 under the AVX2 caps, tokens always equal. A copy decoding from another
    prompt's prefill would differ in its tokens and by far more than 2 % in its log-probs."""
    e = RolloutEngine(model, QuantScheme("int8"))
    a, b = rand_prompts([5, 8], seed=9)
    grouped = gen(e, [a, a, b, a, b], temperature=0.0)
    distinct = gen(e, [a, b], temperature=0.0)
    for rows in ([0, 1, 3], [2, 4]):
        for r in rows[1:]:
            assert torch.equal(grouped.tokens[r], grouped.tokens[rows[0]])
            assert torch.equal(grouped.behav_logp[r], grouped.behav_logp[rows[0]])
    for row, ref in [(0, 0), (1, 0), (2, 1), (3, 0), (4, 1)]:
        assert torch.equal(grouped.tokens[row], distinct.tokens[ref])
        assert_close(grouped.behav_logp[row], distinct.behav_logp[ref], rtol=0.02, atol=1e-3)
    sampled = gen(e, [a] * 8, temperature=1.0)  # copies still draw their own samples
    assert len({tuple(r) for r in sampled.tokens.tolist()}) > 1


def test_generate_rejects_bad_arguments(model):
    e = RolloutEngine(model, QuantScheme("fp32"))
    with pytest.raises(ValueError, match="max_seq_len"):
        gen(e, [[5] * 250], max_new_tokens=10)
    with pytest.raises(ValueError, match="at least one token"):
        gen(e, [[5], []])
    with pytest.raises(ValueError, match="top_p"):
        gen(e, [[5]], top_p=0.0)
    with pytest.raises(ValueError, match="kernels"):
        RolloutEngine(model, QuantScheme("int8"), kernels="fast")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_generates(model, precision):
    e = RolloutEngine(model, QuantScheme(precision))
    ro = gen(e, rand_prompts([3, 6]), temperature=1.0, max_new_tokens=5)
    assert ro.tokens.shape == (2, 11) and torch.isfinite(ro.behav_logp).all()
    # behav_logp is the engine's own (quantized) log-prob: close to, not equal to, fp32's.
    logp, _ = response_logprobs(model, ro.tokens, ro.attention_mask, ro.response_start, 1.0)
    diff = (logp - ro.behav_logp).abs().max().item()
    assert (diff < 1e-5) == (precision == "fp32") and diff < 1.0


def test_every_registered_precision_has_an_engine_linear():
    """The quantizer registry and the engine's factories name the same precisions, so adding a
    precision to suite.core.quant without its engine linear fails here, not in a run."""
    from suite.core.quant import QUANTIZERS
    from suite.embedded.qlinear import ENGINE_LINEARS

    assert list(ENGINE_LINEARS) == list(QUANTIZERS)


# ---------------------------------------------------------------------------- dose axes: wa16 widths, lm_head, outliers


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("lm_head", [False, True])
def test_every_weight_only_dose_composes(model, bits: int, lm_head: bool):
    """Each W{b}A16 level builds and syncs (the lm_head quantized too when asked), and its mismatch
    against the fp32 engine shrinks with the width; at 4 bits it is the w4a16 engine bit for bit."""
    tokens = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    scheme = QuantScheme("wa16", bits=bits, group_size=32)
    e = RolloutEngine(model, scheme, kernels="emulated", lm_head=lm_head)
    expect = fake_quant(model.lm_head.weight.detach(), scheme).to(torch.bfloat16).float() if lm_head \
        else model.lm_head.weight.detach().to(torch.bfloat16).float()
    assert torch.equal(e.model.lm_head.weight.float(), expect)
    out = e.logits(tokens)
    assert torch.isfinite(out).all()
    if bits == 4:
        w4 = RolloutEngine(model, QuantScheme("w4a16", group_size=32), kernels="emulated", lm_head=lm_head)
        assert torch.equal(out, w4.logits(tokens))


def test_weight_only_mismatch_falls_with_width(model):
    tokens = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    ref = RolloutEngine(model, QuantScheme("fp32")).logits(tokens)
    gaps = [float((RolloutEngine(model, QuantScheme("wa16", bits=b, group_size=32), kernels="emulated")
                   .logits(tokens) - ref).abs().mean()) for b in (2, 3, 4, 6, 8)]
    assert gaps == sorted(gaps, reverse=True), gaps


def test_outlier_transform_keeps_fp32_and_coarsens_int8(model):
    """The outlier transform at sync: the fp32 engine's logits are unchanged (alpha a power of two:
    bit for bit), the int8 engine's distance from them grows with alpha."""
    tokens = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    ref = RolloutEngine(model, QuantScheme("fp32")).logits(tokens)
    out = RolloutEngine(model, QuantScheme("fp32"), outlier_alpha=16.0, outlier_channels=4).logits(tokens)
    assert_close(out, ref)
    gaps = [float((RolloutEngine(model, QuantScheme("int8"), kernels="emulated", outlier_alpha=a,
                                 outlier_channels=4).logits(tokens) - ref).abs().mean()) for a in (1.0, 8.0, 64.0)]
    assert gaps[0] < gaps[1] < gaps[2], gaps
    # the source model is untouched by a sync
    assert torch.equal(model.layers[0].attn_norm.weight, make_model().layers[0].attn_norm.weight)
