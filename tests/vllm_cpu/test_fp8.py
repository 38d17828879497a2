"""QuRL's FP8 on verl (``quant=fp8 quant.fp8_granularity=per_channel``) against a live vLLM CPU engine.

vLLM builds the model with its compressed-tensors FP8 scheme (per-channel E4M3 weights, dynamic
per-token E4M3 activations; suite.verl.rollout_quant ``FP8_CHANNEL_QUANT_CONFIG``). On a CPU
without AMX-FP8 its linear is ``ChannelWiseTorchFP8ScaledMMLinearKernel``: ``torch._scaled_mm`` on
the E4M3 codes into float32, then the per-token and per-channel scales. Products of two E4M3
codes are exact in float32, so against an independent float32 W8A8-FP8 (the suite's quantizers,
vllm_tiny.w8a8_reference) only the order of the sums and of the rescale differs, ~1e-7
relative; that flips an activation code only within ~1e-7 of a rounding boundary. The bounds
are the INT8 parity test's (test_parity.py): far below the quantization effect itself.

The weight sync is the INT8 one (suite.verl.int8_hook) with the FP8 scheme and quantizer: after
each sync the engine computes exactly what a fresh engine loaded from the FP8 checkpoint of the
synced weights computes (suite.verl.w8a8_checkpoint, ``rollout="fp8_per_channel"``).
"""

from __future__ import annotations

import pytest
import torch
from test_weight_sync import syncs_equal_fresh_loads, verl_env  # noqa: F401  (verl_env: a fixture)
from vllm_tiny import NUMBERS, checkpoints, engine, prompt_logprobs, sequences, tiny_model, torch_logprobs, \
    w8a8_reference

from suite.core.quant import QuantScheme

FP8 = QuantScheme(precision="fp8", fp8_granularity="per_channel")


def _kernel(model) -> str:
    """The FP8 linear kernel vLLM chose for block 0's qkv projection."""
    qkv = model.model.layers[0].self_attn.qkv_proj
    return type(qkv.scheme).__name__ + "/" + type(qkv.scheme.fp8_linear).__name__


def test_fp8_logprobs_equal_an_independent_w8a8_fp8_in_float32(tmp_path):
    ck = checkpoints(tmp_path, 0, fp8=True)
    seqs = sequences()
    llm = engine(ck["fp8"], "float32")
    kernel = llm.apply_model(_kernel)[0]
    got = prompt_logprobs(llm, seqs)
    del llm
    model = tiny_model(0)
    ref = torch_logprobs(w8a8_reference(model, FP8), seqs)
    fp32 = torch_logprobs(model, seqs)
    diff, quant = (got - ref).abs(), (ref - fp32).abs()
    NUMBERS.append(f"fp8 per-channel parity float32 ({kernel}): |vLLM fp8 - suite W8A8-FP8| mean {diff.mean():.3e} "
                   f"max {diff.max():.3e}; |suite W8A8-FP8 - fp32| mean {quant.mean():.3e} max {quant.max():.3e}")
    assert kernel.startswith("CompressedTensorsW8A8Fp8/"), kernel  # W8A8, not the weight-only W8A16 fallback
    assert quant.mean() > 5e-3  # the quantization effect is resolved (the test could tell a float copy)
    assert diff.mean() <= 1e-3 and diff.mean() <= 0.05 * quant.mean(), (diff.mean(), quant.mean())
    assert diff.max() <= 0.5 * quant.max(), (diff.max(), quant.max())


def test_fp8_syncs_equal_a_fresh_load_of_the_fp8_checkpoint(verl_env, tmp_path):  # noqa: F811
    verl_env.setenv("SUITE_ROLLOUT_QUANT", "fp8_per_channel")
    ck = {seed: checkpoints(tmp_path / str(seed), seed, fp8=True) for seed in (0, 1, 2)}
    seconds = syncs_equal_fresh_loads(ck, "fp8", "bfloat16")
    NUMBERS.append("fp8 per-channel weight sync (bf16): " + ", ".join(f"{s:.3f} s" for s in seconds)
                   + "; log-probs identical to a fresh FP8 load")


def test_an_fp8_checkpoint_is_not_the_int8_one(tmp_path):
    """The writer's two rollouts: float8 codes with the float-quantized config, int8 codes with the
    int-quantized one, the same per-channel scale shape."""
    import json

    from safetensors.torch import load_file

    ck = checkpoints(tmp_path, 0, fp8=True)
    name = "model.layers.0.mlp.down_proj"
    for kind, dtype, fmt in (("fp8", torch.float8_e4m3fn, "float-quantized"), ("int8", torch.int8, "int-quantized")):
        t = load_file(str(ck[kind] / "model.safetensors"))
        assert t[f"{name}.weight"].dtype == dtype and t[f"{name}.weight_scale"].shape[1] == 1, kind
        assert json.loads((ck[kind] / "config.json").read_text())["quantization_config"]["format"] == fmt
    with pytest.raises(ValueError, match="rollout='w4a16_emulated' has no compressed-tensors checkpoint; allowed: "
                                         "int8, w4a16, fp8_per_channel"):
        from suite.verl.w8a8_checkpoint import write_w8a8_checkpoint

        write_w8a8_checkpoint(ck["fp"], tmp_path / "w4", rollout="w4a16_emulated")
