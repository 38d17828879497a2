"""W4A16 on vLLM's int4 kernels (suite.verl.int8_hook, suite.verl.rollout_quant): the packed layout
against hand-computed words, and how `quant.w4a16_kernels` reaches the run id, tags, name and checks.

The engines themselves (a packed checkpoint served by vLLM's int4 kernel, its syncs, its parity with
the emulated path) are in tests/vllm_cpu/test_weight_sync.py and tests/vllm_cpu/test_sync_check.py.
"""

from __future__ import annotations

import pytest
import torch

from suite.config import ConfigError, compose_config, run_id
from suite.identity import identity_tags, run_name, semantic_config
from suite.verl.int8_hook import pack_int4, requantize_w4a16, unpack_int4

VERL = ["backend=verl", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v"]


def test_pack_int4_puts_value_j_in_bits_4j():
    """compressed-tensors' pack_to_int32 layout, by hand: 1..8 -> 0x87654321 (negative as int32),
    0..7 -> 0x76543210, and a value 15 in the top nibble sets the sign bit."""
    vals = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 0, 0, 0, 15]])
    words = pack_int4(vals)
    assert words.dtype == torch.int32 and words.shape == (3, 1)
    assert words[:, 0].tolist() == [0x87654321 - 2**32, 0x76543210, 0xF0000000 - 2**32]
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(0, 16, (5, 64), generator=g)
    assert torch.equal(unpack_int4(pack_int4(rand), 64), rand.to(torch.uint8))
    with pytest.raises(ValueError, match="eight to an int32"):
        pack_int4(torch.zeros(2, 12, dtype=torch.int64))


def test_requantize_w4a16_writes_the_pack_quantized_tensors():
    """Symmetric: codes + 8 (vLLM's uint4b8), scales [out, in/g]; asymmetric: raw codes and the zero
    points packed along the output axis [out/8, in/g]; other tensors untouched."""
    from suite.core.quant import quantize_w4

    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 64, generator=g)
    norm = torch.randn(64, generator=g)
    for sym in (True, False):
        out = dict(requantize_w4a16([("model.layers.3.mlp.down_proj.weight", w),
                                     ("model.layers.3.input_layernorm.weight", norm)], 32, sym))
        q = quantize_w4(w, 32, sym)
        base = "model.layers.3.mlp.down_proj."
        assert {k: tuple(v.shape) for k, v in out.items()} == {
            base + "weight_packed": (16, 8), base + "weight_scale": (16, 2), base + "weight_shape": (2,),
            **({} if sym else {base + "weight_zero_point": (2, 2)}),
            "model.layers.3.input_layernorm.weight": (64,)}
        codes = unpack_int4(out[base + "weight_packed"], 64).to(torch.int16) - (8 if sym else 0)
        assert torch.equal(codes, q[0].to(torch.int16)) and torch.equal(out[base + "weight_scale"], q[1])
        assert out[base + "weight_shape"].tolist() == [16, 64]
        assert out["model.layers.3.input_layernorm.weight"] is norm
        if not sym:
            assert torch.equal(unpack_int4(out[base + "weight_zero_point"].t().contiguous(), 16).t(), q[2])


def test_w4a16_kernels_in_the_run_id_only_where_it_means_something():
    """Every verl W4A16 run has the key in its id (int4 and emulated compute differently, and runs made
    before int4 kernels were emulated ones); no other run has it, so their ids are as before."""
    int4 = compose_config(VERL + ["quant=w4a16"])
    emulated = compose_config(VERL + ["quant=w4a16", "quant.w4a16_kernels=emulated"])
    assert semantic_config(int4)["quant"]["w4a16_kernels"] == "int4"
    assert run_id(int4) != run_id(emulated)
    for cfg in (compose_config([]), compose_config(["quant=w4a16"]), compose_config(VERL + ["quant=int8"])):
        assert "w4a16_kernels" not in semantic_config(cfg)["quant"]


def test_emulated_w4a16_says_so_in_its_name_and_tags():
    emulated = compose_config(VERL + ["quant=w4a16", "quant.w4a16_kernels=emulated"])
    int4 = compose_config(VERL + ["quant=w4a16"])
    assert identity_tags(emulated)["kernels"] == "W4A16 numerics on bf16 kernels"
    assert run_name(emulated).endswith("(W4A16 numerics on bf16 kernels)")
    assert identity_tags(int4)["kernels"] == "vllm" and "bf16 kernels" not in run_name(int4)


@pytest.mark.parametrize("overrides, message", [
    (["quant.w4a16_kernels=emulated"], r"quant.w4a16_kernels: chooses the kernels of backend=verl's W4A16 rollout; "
                                        r"with backend=embedded quant.precision=int8 it means nothing.*allowed: int4"),
    (VERL + ["quant=int8", "quant.w4a16_kernels=emulated"], r"quant.w4a16_kernels: .*backend=verl "
                                                              r"quant.precision=int8 it means nothing"),
    (["quant.w4a16_kernels=marlin"], r"quant.w4a16_kernels='marlin' is not allowed; choose one of: int4, emulated"),
    (VERL + ["quant=w4a16", "quant.group_size=256"], r"quant.group_size: 256 has no vLLM int4 kernel .*allowed: "
                                                     r"32, 64, 128, or quant.w4a16_kernels=emulated"),
])
def test_w4a16_kernels_refusals_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose_config(overrides)


def test_emulated_w4a16_takes_any_group_size():
    cfg = compose_config(VERL + ["quant=w4a16", "quant.group_size=256", "quant.w4a16_kernels=emulated"])
    assert cfg.quant.group_size == 256


def test_a_cpu_w4a16_rollout_starts_on_dummy_weights():
    """vLLM's CPU build: the W4A16 engine's parameters (weight_packed, ...) are not the HF checkpoint's, so
    it starts on dummy weights until verl's first sync (load_format=auto failed: 'There is no module or
    parameter named ...down_proj.weight'); the other rollouts keep loading the checkpoint."""
    from suite.verl.translate import verl_overrides

    def load_formats(*quant):
        ov = verl_overrides(compose_config(VERL + ["backend.device=cpu", *quant]))
        return [o.split("=", 1)[1] for o in ov if o.startswith("actor_rollout_ref.rollout.load_format=")]

    assert load_formats("quant=w4a16", "quant.group_size=32") == ["dummy"]
    assert load_formats("quant=w4a16", "quant.w4a16_kernels=emulated") == ["auto"]
    assert load_formats("quant=bf16") == ["auto"]
