"""QaRL's rollout-aligned forward in verl's FSDP actor (suite.verl.aligned), on CPU.

The aligned forward is checked on the tiny Qwen2 checkpoint against an independent path (a copy
of the model whose weights were replaced by their fake-quantized values and, for the W8A8 int8 /
fp8 rollouts, whose block-linear inputs are quantized per token by hooks), FP8 against verl's
own blockwise FP8 quantizer, and the engine swap against verl's real ``EngineRegistry``,
``FSDPEngine._build_module`` and ``apply_fsdp2`` (FSDP2 on a one-process CPU gloo mesh). A full
verl step (Ray workers, vLLM) needs GPUs and is not run here.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys

import pytest
import torch
from torch import nn

pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")
pytestmark = pytest.mark.verl

from suite.core.quant import QuantScheme, fake_quant, quantize_fp8, quantize_int8_per_token  # noqa: E402
from suite.verl.aligned import (  # noqa: E402
    ALIGNED_ENV,
    AlignedLinear,
    apply_aligned_forward,
    install,
    parse_spec,
    scheme_spec,
)
from suite.verl.int8_hook import QUANTIZED_LINEARS  # noqa: E402

SCHEMES = ["bf16", "int8", "w4a16:16:sym", "w4a16:16:asym", "fp8:block:16", "fp8:per_channel"]


def _rollout_input_hooks(model, names, scheme):
    """The W8A8 rollout's activations on an independent path: each named linear's input quantized
    per token, as vLLM does -- INT8 one scale per token (compressed-tensors W8A8), block FP8 one
    scale per token and per ``block_size`` features (W8A8BlockFp8LinearOp) -- STE written out.
    bf16 / w4a16 rollouts keep 16-bit activations: no hooks."""
    if scheme.precision not in ("int8", "fp8"):
        return

    def hook(_mod, args):
        x = args[0]
        rows = x.detach().reshape(-1, x.shape[-1]).float()  # [M, K] tokens
        if scheme.precision == "int8":
            codes, scales = quantize_int8_per_token(rows)  # [M, K], [M, 1]
            q = codes.float() * scales
        elif scheme.fp8_granularity == "per_channel":  # compressed-tensors FP8: one scale per token
            codes, scales = quantize_fp8(rows, "per_channel")
            q = codes.float() * scales
        else:
            parts = []
            for lo in range(0, rows.shape[1], scheme.block_size):  # 1 x block groups of each token
                codes, scales = quantize_fp8(rows[:, lo : lo + scheme.block_size], "per_channel")
                parts.append(codes.float() * scales)
            q = torch.cat(parts, 1)  # [M, K]
        q = q.reshape(x.shape).to(x.dtype)
        return (q + (x - x.detach()), *args[1:])

    for name, module in model.named_modules():
        if name in names:
            module.register_forward_pre_hook(hook)


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager").eval()


def test_spec_round_trip_and_errors():
    assert parse_spec(scheme_spec("int8")) == QuantScheme(precision="int8")
    assert parse_spec(scheme_spec("bf16")) == QuantScheme(precision="bf16")
    assert parse_spec(scheme_spec("w4a16", group_size=64, symmetric=False)) == QuantScheme(
        precision="w4a16", group_size=64, symmetric=False)
    # verl's native FP8 rollout quantizes 128x128 blocks, so the aligned forward does too
    assert parse_spec(scheme_spec("fp8")) == QuantScheme(precision="fp8", fp8_granularity="block", block_size=128)
    # QuRL's FP8 (compressed-tensors): per-channel weights, per-token activations
    assert parse_spec(scheme_spec("fp8", fp8_granularity="per_channel")) == QuantScheme(
        precision="fp8", fp8_granularity="per_channel")
    for bad in ("fp32", "int4", "w4a16:64", "w4a16:x:sym", "fp8:per_channel:128", "fp8:per_tensor", "fp8",
                "w4a16:0:sym"):
        with pytest.raises(ValueError, match=ALIGNED_ENV):
            parse_spec(bad)
    with pytest.raises(ValueError, match="bf16, int8, fp8, w4a16"):
        scheme_spec("fp32")


@pytest.mark.parametrize("spec", SCHEMES)
def test_aligned_forward_equals_fake_quantized_copy(tiny_qwen2, spec):
    """Logits equal (bitwise) a copy whose block weights hold fake_quant(w) and, for int8 / fp8
    (W8A8 rollouts), whose block-linear inputs are quantized per token by hooks; the STE gradient
    w.r.t. each weight equals that copy's gradient w.r.t. its fake-quantized weight; parameters,
    names and the other layers are untouched. For int8 / fp8 the activations matter: the
    weight-only copy's logits differ."""
    scheme = parse_spec(spec)
    plain = _load(tiny_qwen2)
    aligned = copy.deepcopy(plain)
    before = {k: v.clone() for k, v in aligned.state_dict().items()}
    names = apply_aligned_forward(aligned, scheme)
    layers = plain.config.num_hidden_layers
    assert len(names) == 7 * layers and {n.rsplit(".", 1)[-1] for n in names} == set(QUANTIZED_LINEARS)
    assert not isinstance(aligned.lm_head, AlignedLinear)
    assert sum(isinstance(m, AlignedLinear) for m in aligned.modules()) == 7 * layers

    weight_only = copy.deepcopy(plain)
    with torch.no_grad():
        for name, p in weight_only.named_parameters():
            if name.removesuffix(".weight") in names:
                p.copy_(fake_quant(p, scheme))
    reference = copy.deepcopy(weight_only)
    _rollout_input_hooks(reference, names, scheme)

    tokens = torch.randint(3, plain.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    target = torch.randn(3, 11, plain.config.vocab_size, generator=torch.Generator().manual_seed(1))
    outs = {}
    for label, model in (("aligned", aligned), ("reference", reference), ("plain", plain),
                         ("weight_only", weight_only)):
        logits = model(tokens).logits
        (logits * target).sum().backward()
        outs[label] = logits.detach()
    assert torch.equal(outs["aligned"], outs["reference"])
    if spec != "bf16":  # a bf16 round trip can leave these tiny random weights' products equal
        assert not torch.equal(outs["aligned"], outs["plain"])  # the aligned forward did change the numbers
    # W8A8 for int8 / fp8, weight-only for bf16 / w4a16
    assert torch.equal(outs["aligned"], outs["weight_only"]) == (scheme.precision not in ("int8", "fp8"))
    a_params, r_params = dict(aligned.named_parameters()), dict(reference.named_parameters())
    for name, p in a_params.items():
        torch.testing.assert_close(p.grad, r_params[name].grad, rtol=1e-6, atol=1e-7, msg=name)
    after = aligned.state_dict()
    assert list(after) == list(before)  # same names: optimizer state and weight sync unchanged
    assert all(torch.equal(after[k], before[k]) for k in before)  # full-precision weights kept


def test_fp8_aligned_weights_equal_verls_fp8_rollout_quantizer():
    """FP8: our block fake-quant of a bf16 weight equals verl's own rollout quantizer
    (verl.utils.kernel.fp8_kernel, the PyTorch path; 128x128 blocks), dequantized."""
    from verl.utils.kernel.fp8_kernel import _scaled_fp8_blockwise_pytorch

    scheme = parse_spec(scheme_spec("fp8"))
    gen = torch.Generator().manual_seed(0)
    for shape in ((256, 384), (200, 130)):
        w = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        codes, descale = _scaled_fp8_blockwise_pytorch(w, [128, 128])
        d = descale.reshape(descale.shape[0], descale.shape[1])
        verl_dq = codes.float() * d.repeat_interleave(128, 0).repeat_interleave(128, 1)[: shape[0], : shape[1]]
        ours = fake_quant(w.float(), scheme)
        # verl multiplies by 448 / amax where we divide by amax / 448: the fp8 codes agree; the
        # float32 dequantized values differ by at most 2 ulp (a different code would be >= 1/16)
        rel = ((ours - verl_dq).abs() / verl_dq.abs().clamp_min(1e-30)).max().item()
        assert rel <= 2.5e-7, (shape, rel)
        # what the aligned forward uses under FSDP mixed precision: bf16 in, bf16 out -- identical
        assert torch.equal(fake_quant(w, scheme), verl_dq.to(torch.bfloat16))


def test_refuses_models_it_cannot_align():
    with pytest.raises(ValueError, match="no block linears"):
        apply_aligned_forward(nn.Sequential(nn.Linear(4, 4)), QuantScheme(precision="int8"))

    class LoraLinear(nn.Linear):
        pass

    model = nn.Module()
    model.q_proj = LoraLinear(4, 4)
    with pytest.raises(ValueError, match="q_proj is a LoraLinear"):
        apply_aligned_forward(model, QuantScheme(precision="int8"))
    with pytest.raises(ValueError, match="fp32"):
        apply_aligned_forward(nn.Sequential(), QuantScheme(precision="fp32"))


@pytest.fixture
def registry():
    """verl's engine registry, restored after the test (install() mutates it)."""
    from verl.workers.engine import EngineRegistry

    saved = {mt: {b: dict(r) for b, r in d.items()} for mt, d in EngineRegistry._engines.items()}
    yield EngineRegistry
    EngineRegistry._engines.clear()
    EngineRegistry._engines.update(saved)


@pytest.fixture
def gloo_group():
    """A one-process gloo group: verl's _build_module asks torch.distributed for the rank."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _build_module(engine_cls, model_dir, forward_only: bool):
    """verl's own FSDPEngine._build_module (HF load, verl's monkey patches) on an engine object
    made without __init__ (whose device mesh needs CUDA), with verl's real config classes."""
    from verl.workers.config import FSDPEngineConfig, HFModelConfig

    eng = engine_cls.__new__(engine_cls)
    eng.model_config = HFModelConfig(path=str(model_dir), override_config={"attn_implementation": "eager"})
    eng.engine_config = FSDPEngineConfig(forward_only=forward_only, strategy="fsdp2")
    eng.device_mesh, eng.use_remove_padding, eng.ulysses_sequence_parallel_size = None, False, 1
    return eng._build_module()


def test_install_swaps_verls_fsdp_engines(registry, gloo_group, tiny_qwen2, monkeypatch):
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cuda")  # the engine a GPU worker would get
    assert registry.get_engine_cls("language_model", "fsdp2") is FSDPEngineWithLMHead
    assert install("") == []  # no spec, nothing swapped
    assert sorted(install("w4a16:16:sym")) == ["fsdp", "fsdp2", "fsdp_turbo"]
    install("int8")  # idempotent: a second install rebuilds from verl's class
    cls = registry.get_engine_cls("language_model", "fsdp2")
    assert cls.__mro__[1] is FSDPEngineWithLMHead and cls.suite_aligned_scheme == QuantScheme(precision="int8")
    assert registry.get_engine_cls("value_model", "fsdp2") is FSDPEngineWithValueHead  # the critic is not aligned

    actor = _build_module(cls, tiny_qwen2, forward_only=False)
    block = [m for n, m in actor.named_modules() if n.rsplit(".", 1)[-1] in QUANTIZED_LINEARS]
    assert block and all(type(m) is AlignedLinear and m.suite_scheme.precision == "int8" for m in block)
    ref = _build_module(cls, tiny_qwen2, forward_only=True)  # the reference policy keeps the plain forward
    assert not any(isinstance(m, AlignedLinear) for m in ref.modules())
    plain = _build_module(FSDPEngineWithLMHead, tiny_qwen2, forward_only=False)
    tokens = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(actor(tokens).logits, plain(tokens).logits)
        assert torch.equal(ref(tokens).logits, plain(tokens).logits)


@pytest.mark.slow  # ~15 s quiet: a fresh process imports verl
def test_import_verl_installs_through_the_plugin_entry_point():
    """In a fresh process, ``import verl`` with SUITE_ALIGNED_FORWARD set (as the translator sets it
    in every Ray worker) swaps the engines; without it verl's own engines stay."""
    code = (
        "import verl\n"
        "from verl.workers.engine import EngineRegistry as R\n"
        "print(R._engines['language_model']['fsdp']['cuda'].__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ALIGNED_ENV}
    names = []
    for extra in ({ALIGNED_ENV: "w4a16:32:asym"}, {}):
        out = subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        names.append(out.stdout.split()[-1])
    assert names == ["SuiteAlignedFSDPEngineWithLMHead", "FSDPEngineWithLMHead"]
    bad = subprocess.run([sys.executable, "-c",
                          "import verl\nfrom verl.trainer.ppo.core_algos import get_policy_loss_fn\n"
                          "get_policy_loss_fn('acr')"], env={**env, ALIGNED_ENV: "int4"}, capture_output=True,
                         text=True, timeout=300)
    # a bad spec must not train silently without the aligned forward: the suite losses are missing too
    assert bad.returncode != 0 and "acr" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.parametrize("spec", ["w4a16:16:asym", "int8", "fp8:block:16"])
def test_aligned_actor_under_verls_fsdp2_wrapping(registry, gloo_group, tiny_qwen2, monkeypatch, spec):
    """The aligned actor wrapped by verl's own apply_fsdp2 with the mixed-precision policy verl's
    FSDP2 engine uses (bf16 params, fp32 reduce) -- on a one-process CPU mesh -- gives logits equal,
    bit for bit, to a model whose parameters are bf16 with fake-quantized block weights (and, for
    int8 / fp8, per-token quantized bf16 inputs): the forward sees the unsharded bf16 weight, the
    same numbers verl syncs to vLLM. The STE gradient reaches the sharded float32 master weights
    and equals the reference's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from verl.utils.fsdp_utils import apply_fsdp2

    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cuda")
    install(spec)
    cls = registry.get_engine_cls("language_model", "fsdp2")
    actor = _build_module(cls, tiny_qwen2, forward_only=False)
    scheme = parse_spec(spec)
    names = [n for n, m in actor.named_modules() if isinstance(m, AlignedLinear)]
    reference = copy.deepcopy(actor)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p.data = p.data.to(torch.bfloat16)  # parameters only: buffers (rotary inv_freq) stay float32, as under FSDP
            if name.removesuffix(".weight") in names:
                p.copy_(fake_quant(p, scheme))
    for m in reference.modules():
        if isinstance(m, AlignedLinear):
            m.__class__ = nn.Linear  # the reference holds the quantized weights itself
    _rollout_input_hooks(reference, names, scheme)

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True)
    fsdp_kwargs = {"mesh": init_device_mesh("cpu", (1,)), "mp_policy": mp, "offload_policy": None,
                   "reshard_after_forward": True}
    apply_fsdp2(actor, fsdp_kwargs, {})
    assert type(actor.model.layers[0]).__name__.startswith("FSDP")
    assert isinstance(actor.model.layers[0].self_attn.q_proj, AlignedLinear)

    tokens = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    target = torch.randn(2, 9, actor.config.vocab_size, generator=torch.Generator().manual_seed(1))
    logits, ref_logits = actor(tokens).logits, reference(tokens).logits
    assert logits.dtype == torch.bfloat16 and torch.equal(logits, ref_logits)
    (logits.float() * target).sum().backward()
    (ref_logits.float() * target).sum().backward()
    ref_params = dict(reference.named_parameters())
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        p = dict(actor.named_parameters())[name]
        assert p.dtype == torch.float32  # the sharded master weight
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        torch.testing.assert_close(grad, ref_params[name].grad.float(), rtol=0, atol=0, msg=name)
