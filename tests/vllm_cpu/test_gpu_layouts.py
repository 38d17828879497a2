"""The GPU fold's layout assumption, checked on CPU tensors with vLLM's own CUDA kernel classes.

On a GPU the weight sync copies each layer's freshly processed tensors into the live ones the engine
started with (suite.verl.int8_hook ``copy_into_live``, behind ``fold_into_live``'s GPU guard), which
holds only if vLLM's ``process_weights_after_loading`` gives the same layout at every sync. Here the
processing of vLLM's CUTLASS kernels (INT8: a transpose; FP8: a transpose and, where a width is not
a multiple of 16, a padding) runs on CPU tensors twice, as at load and at a sync, and the second
result is folded into the first. The kernel objects are made without their constructor, whose CUDA
check would refuse this machine (a test double of the constructor only: the processing and the
layouts are vLLM's). Marlin / Machete (W4A16 on a GPU) repack with CUDA ops and are left to
slurm/gpu_check.sh.
"""

from __future__ import annotations

import pytest
import torch

from suite.verl.int8_hook import copy_into_live


def _kernel(cls, **attrs):
    k = cls.__new__(cls)  # vLLM's __init__ asserts a CUDA platform; its processing does not need one
    for name, value in attrs.items():
        setattr(k, name, value)
    return k


def _load(layer, tensors: dict[str, torch.Tensor]) -> None:
    """Fresh loading-layout parameters, as the sync stages them."""
    for name, t in tensors.items():
        if name in layer._parameters:
            delattr(layer, name)
        layer.register_parameter(name, torch.nn.Parameter(t.clone(), requires_grad=False))


def _two_syncs(kernel, make, check) -> None:
    layer = torch.nn.Module()
    layer.logical_widths = [48, 8, 8]  # a fused q / k / v layer
    _load(layer, make(0))
    kernel.process_weights_after_loading(layer)
    live = {n: p for n, p in layer.named_parameters(recurse=False)}
    pointers = {n: p.data_ptr() for n, p in live.items()}
    _load(layer, make(1))  # the next sync: loading layout again, processed again
    kernel.process_weights_after_loading(layer)
    copy_into_live(layer, live)
    for n, p in layer.named_parameters(recurse=False):
        assert p is live[n] and p.data_ptr() == pointers[n], n  # the tensors CUDA graphs captured
    check(layer, make(1))


def test_cutlass_int8_layout_is_the_same_at_every_sync():
    from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassInt8ScaledMMLinearKernel
    from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import Int8ScaledMMLinearLayerConfig

    config = Int8ScaledMMLinearLayerConfig(is_static_input_scheme=False, is_channelwise=True, input_symmetric=True)
    kernel = _kernel(CutlassInt8ScaledMMLinearKernel, config=config,
                     layer_param_names=("weight", "weight_scale", "input_scale", "input_zero_point", "azp_adj"))

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return {"weight": torch.randint(-127, 128, (64, 32), generator=g, dtype=torch.int8),  # [out, in]
                "weight_scale": torch.rand(64, 1, generator=g)}

    def check(layer, want):
        assert layer.weight.shape == (32, 64) and torch.equal(layer.weight, want["weight"].t())  # CUTLASS: [in, out]
        assert torch.equal(layer.weight_scale, want["weight_scale"])

    _two_syncs(kernel, make, check)


# k = 40: CUTLASS FP8 pads the input width to a multiple of 16. (An output width that is not one is not
# tried: vllm 0.31's padding of the per-channel scales then sets the weight's loader twice and fails at
# load already, before any sync; Qwen2.5's widths are multiples of 16.)
@pytest.mark.parametrize("k", [32, 40])
def test_cutlass_fp8_layout_is_the_same_at_every_sync(k):
    from vllm.model_executor.kernels.linear.scaled_mm.cutlass import CutlassFP8ScaledMMLinearKernel

    kernel = _kernel(CutlassFP8ScaledMMLinearKernel, logical_output_size=None,
                     layer_param_names=("weight", "weight_scale", "input_scale", "input_scale_ub"))

    n = 64

    def make(seed):  # what the compressed-tensors FP8 scheme hands its kernel: weight [in, out], scales [out, 1]
        g = torch.Generator().manual_seed(seed)
        w = (torch.rand(n, k, generator=g) * 8 - 4).to(torch.float8_e4m3fn)
        return {"weight": w.t(), "weight_scale": torch.rand(n, 1, generator=g) + 0.5}

    def check(layer, want):
        padded = -(-k // 16) * 16
        assert layer.weight.shape == (padded, n) and kernel.logical_output_size == n
        got = layer.weight.view(torch.uint8)[:k]
        assert torch.equal(got, want["weight"].view(torch.uint8))
        assert not layer.weight.view(torch.uint8)[k:].any()  # the padding is zeros
        assert torch.equal(layer.weight_scale, want["weight_scale"])

    _two_syncs(kernel, make, check)
