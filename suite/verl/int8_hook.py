"""INT8 (W8A8), per-channel FP8 and W4A16 rollouts for verl's vLLM engine: re-quantize every weight sync.

verl 0.9.1 supports only FP8 rollout natively. For ``quant=int8`` the translator
(suite.verl.translate) makes vLLM build the model with its compressed-tensors W8A8 INT8 scheme
(per-channel int8 weights, dynamic per-token int8 activations: vLLM's INT8 kernels) and with
this module's worker extension, ``QuantizedWeightSyncExtension``, in place of verl's
``vLLMColocateWorkerExtension`` (``engine_kwargs.vllm.worker_extension_cls``; no fork of verl).
A verl weight sync (``update_weights_from_ipc``) is then

1. stage (:func:`stage_for_loading`): every INT8 layer gets fresh parameters in vLLM's loading
   layout (the scheme's own ``create_weights``: int8 ``weight`` [out, in], float32
   ``weight_scale`` [out, 1]); on vLLM's CPU build, every unquantized linear whose weight the
   CPU kernels pre-packed away gets a fresh loading weight too (``dispatch_cpu_unquantized_gemm``
   replaces it by an empty tensor; the packed copy lives in the layer's ``cpu_linear``), and every
   attention layer its KV-cache scale placeholders, which their post-load processing deletes
   (:func:`restage_kv_scales`);
2. verl receives the buckets and calls ``_update_weights`` per bucket, where each block linear
   weight is re-quantized with ``suite.core.quant.quantize_int8_per_channel`` (the embedded
   backend's quantizer; :func:`requantize_int8`) and loaded by vLLM's ``load_weights`` (which
   fuses q/k/v and gate/up shards, whichever bucket they arrive in);
3. verl runs vLLM's ``process_weights_after_loading`` on every module once after the last
   bucket (its non-quantized path: verl's ``is_quantized_model`` is FP8-only): that is the only
   processing of the staged layers (kernel layout: a transpose for CUTLASS, a oneDNN / packed
   handle on CPU), so nothing is processed twice;
4. finish (:func:`finish_sync`): on a GPU the processed tensors are copied into the live ones
   the engine started with, so CUDA graphs captured on them stay valid (:func:`fold_into_live`,
   the GPU-only part, guarded by :func:`require_gpu`); on the CPU build there are no CUDA
   graphs, the kernels hold the freshly processed tensors, and nothing is left to do.

``quant=fp8 quant.fp8_granularity=per_channel`` (QuRL's FP8) runs the same way on vLLM's
compressed-tensors FP8 scheme (``CompressedTensorsW8A8Fp8``: float8 E4M3 ``weight`` [out, in],
float32 ``weight_scale`` [out, 1], dynamic per-token activations), re-quantized with
``suite.core.quant.quantize_fp8`` per channel (:func:`requantize_fp8`).

For ``quant=w4a16`` vLLM runs 16-bit kernels on weights fake-quantized to the 4-bit group-wise
grid (``suite.core.quant.fake_quant``): the rollout's numerics are W4A16's, not its speed.

Tested against a live vLLM CPU engine (tests/vllm_cpu/test_weight_sync.py); the GPU fold is
exercised by ``slurm/gpu_check.sh`` on a GPU node.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator

import torch

from suite.core.quant import QuantScheme, fake_quant, quantize_fp8, quantize_int8_per_channel
from suite.hardware import request_amx_tiles
from suite.verl.rollout_quant import ROLLOUTS_BY_NAME, VerlRollout

log = logging.getLogger(__name__)

# vLLM imports this module in each of its worker processes (``worker_extension_cls``) before it
# loads the model. On an AMX CPU vLLM's INT8 GEMM (sgl-kernel) runs AMX tile instructions without
# asking Linux for them, so a fresh worker died with SIGILL at its first INT8 linear unless some
# oneDNN AMX kernel had asked first (docs/verl.md, "AMX tile permission"): ask here, for it.
request_amx_tiles()

# Block linear layers the rollout quantizes (Llama / Qwen2 names); embeddings, norms and
# lm_head stay in 16 bit (the compressed-tensors config lists lm_head under `ignore`).
QUANTIZED_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INT8_SCHEME = "CompressedTensorsW8A8Int8"  # vLLM's scheme class for W8A8 INT8 (compressed-tensors)
_LIVE_PARAMS = ("weight", "weight_scale", "input_scale", "input_zero_point", "azp_adj")
UNQUANTIZED_LINEAR = "UnquantizedLinearMethod"  # vLLM's method of a 16-bit linear (pre-packed on CPU)


class NoGPUError(RuntimeError):
    """The GPU-only part of the weight sync (the fold into CUDA-graph tensors) ran without a CUDA GPU."""


def require_gpu(what: str = "the INT8 weight sync's fold into the live CUDA tensors") -> None:
    if not torch.cuda.is_available():
        raise NoGPUError(
            f"{what} keeps CUDA graphs valid and needs a CUDA GPU, but torch.cuda.is_available() is False on this "
            "machine. On vLLM's CPU build the sync needs no fold (finish_sync skips it); on a GPU node "
            "slurm/gpu_check.sh checks this path."
        )


def is_quantized_linear(name: str) -> bool:
    """Whether a checkpoint tensor name is the weight of a block linear the rollout quantizes."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in QUANTIZED_LINEARS


def _requantized(weights: Iterable[tuple[str, torch.Tensor]],
                 quantize: Callable[[torch.Tensor, str], tuple[torch.Tensor, torch.Tensor]]
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """A block linear's ``...proj.weight`` [out, in] -> ``quantize(weight in float32, name)``'s codes as
    ``...proj.weight`` and its scales as ``...proj.weight_scale`` (float32 [out, 1]); every other
    tensor passes unchanged."""
    for name, w in weights:
        if is_quantized_linear(name):
            codes, scales = quantize(w.to(torch.float32), name)
            yield name, codes
            yield name[: -len("weight")] + "weight_scale", scales.to(torch.float32)
        else:
            yield name, w


def requantize_int8(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full-precision weight) -> vLLM compressed-tensors W8A8 tensors: a block linear's
    weight becomes int8 codes and per-channel scales (:func:`_requantized`). Runs on the tensors'
    device (CPU or GPU: the same quantizer, bit for bit; slurm/gpu_check.sh)."""
    return _requantized(weights, lambda w, name: quantize_int8_per_channel(w, name=name))


def requantize_fp8(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full-precision weight) -> vLLM compressed-tensors FP8 (per-channel) tensors: a block
    linear's weight becomes float8 E4M3 codes and per-channel scales (:func:`_requantized`)."""
    return _requantized(weights, lambda w, name: quantize_fp8(w, "per_channel", name=name))


def requantize(weights: Iterable[tuple[str, torch.Tensor]], rollout: VerlRollout) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` as ``rollout``'s compressed-tensors checkpoint stores them (int8 or per-channel fp8).
    The quantizer is looked up at each call (a test replaces ``requantize_int8`` to break the sync)."""
    precision = rollout.scheme(128, True).precision
    return requantize_int8(weights) if precision == "int8" else requantize_fp8(weights)


def fake_quant_weights(weights: Iterable[tuple[str, torch.Tensor]],
                       scheme: QuantScheme) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, weight) -> the same weights with every block linear on ``scheme``'s grid
    (dequantized, original dtype): the weight-only rollouts (W4A16)."""
    for name, w in weights:
        yield (name, fake_quant(w, scheme, name=name).to(w.dtype)) if is_quantized_linear(name) else (name, w)


def int8_layers(model: torch.nn.Module, scheme: str = INT8_SCHEME) -> list[torch.nn.Module]:
    """The vLLM model's linears of compressed-tensors ``scheme`` (W8A8 INT8 by default)."""
    return [m for m in model.modules() if type(getattr(m, "scheme", None)).__name__ == scheme]


def _prepacked_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """16-bit linears whose weight vLLM's CPU build replaced by an empty tensor after loading."""
    return [m for m in model.modules() if type(getattr(m, "quant_method", None)).__name__ == UNQUANTIZED_LINEAR
            and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.numel() == 0]


def _device(layer: torch.nn.Module) -> torch.device:
    for t in list(layer.parameters(recurse=False)) + list(layer.buffers(recurse=False)):
        return t.device
    return torch.device("cpu")


def _loader(layer: torch.nn.Module):
    return getattr(layer, "weight_loader_v2", None) or layer.weight_loader


Staged = list[tuple[torch.nn.Module, dict[str, torch.nn.Parameter]]]


def stage_for_loading(model: torch.nn.Module, scheme: str = INT8_SCHEME) -> Staged:
    """Give every quantized layer of compressed-tensors ``scheme`` (and, on vLLM CPU, every
    pre-packed 16-bit linear) fresh loading-layout parameters, created on the layer's device;
    return each quantized layer's live (kernel-layout) parameters, which :func:`finish_sync`
    needs on a GPU."""
    layers = int8_layers(model, scheme)
    if not layers:
        raise RuntimeError(f"SUITE_ROLLOUT_QUANT={os.environ.get('SUITE_ROLLOUT_QUANT', '')} but the vLLM model has no "
                           f"{scheme} layer: was it built with the compressed-tensors config of suite.verl.translate?")
    staged = []
    for layer in layers:
        live = {p: getattr(layer, p) for p in _LIVE_PARAMS if isinstance(getattr(layer, p, None), torch.nn.Parameter)}
        device = _device(layer)
        for p in _LIVE_PARAMS:
            if p in layer._parameters:
                delattr(layer, p)
        with torch.device(device):
            layer.scheme.create_weights(  # the INT8 scheme takes input / output size as **kwargs, FP8 needs them
                layer=layer, output_partition_sizes=layer.output_partition_sizes,
                input_size_per_partition=layer.input_size_per_partition, input_size=layer.input_size,
                output_size=layer.output_size, params_dtype=layer.params_dtype, weight_loader=_loader(layer),
            )
        staged.append((layer, live))
    restage_prepacked(model)
    restage_kv_scales(model)
    return staged


def restage_kv_scales(model: torch.nn.Module) -> int:
    """Give each attention layer of a quantized model its KV-cache scale placeholders back.

    vLLM's KV-cache quant method (``BaseKVCacheMethod``, which every compressed-tensors model's
    attention carries) deletes ``k_scale`` / ``v_scale`` / ``q_scale`` / ``prob_scale`` in its
    ``process_weights_after_loading``; verl runs that on every module after each sync, and the
    second run fails (``'Attention' object has no attribute 'k_scale'``). Re-creating them (the
    method's own ``create_weights``: the "no scale in the checkpoint" defaults, as at load; the
    sync never carries KV scales) makes that processing see what it saw at load. Returns how many.
    """
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

    layers = [m for m in model.modules() if isinstance(getattr(m, "quant_method", None), BaseKVCacheMethod)
              and not hasattr(m, "k_scale")]
    for layer in layers:
        with torch.device(_device(layer)):
            layer.quant_method.create_weights(layer)
    return len(layers)


def restage_prepacked(model: torch.nn.Module) -> int:
    """vLLM CPU: a fresh loading weight for each pre-packed 16-bit linear (its processing after
    the sync packs it again); returns how many. A no-op on GPU builds, which keep the weight."""
    layers = _prepacked_linears(model)
    for layer in layers:
        dtype, device = layer.weight.dtype, layer.weight.device
        delattr(layer, "weight")
        with torch.device(device):
            layer.quant_method.create_weights(
                layer, layer.input_size_per_partition, layer.output_partition_sizes, layer.input_size,
                layer.output_size, dtype, weight_loader=_loader(layer),
            )
    return len(layers)


def fold_into_live(layer: torch.nn.Module, live: dict[str, torch.nn.Parameter]) -> None:
    """GPU only: copy the processed tensors into the live ones (same shape and strides) and
    restore them, so CUDA graphs captured on the live tensors read the new weights."""
    require_gpu()
    for p, old in live.items():
        new = getattr(layer, p, None)
        if new is None or new.shape != old.shape:
            raise RuntimeError(f"INT8 weight sync: {p} changed layout ({None if new is None else tuple(new.shape)} "
                               f"vs live {tuple(old.shape)}); this vLLM version is not supported by "
                               "suite.verl.int8_hook")
        old.data.copy_(new.data)
        delattr(layer, p)
        layer.register_parameter(p, old)


def finish_sync(staged: Staged) -> None:
    """After vLLM's post-load processing: fold into the live tensors where they are CUDA tensors
    (:func:`fold_into_live`); on the CPU build the processed tensors simply stay."""
    cuda = [(layer, live) for layer, live in staged if any(t.is_cuda for t in live.values())]
    for layer, live in cuda:
        fold_into_live(layer, live)
    if cuda:
        torch.cuda.synchronize()


def _rollout():
    rollout = ROLLOUTS_BY_NAME.get(os.environ.get("SUITE_ROLLOUT_QUANT", ""))
    return rollout if rollout is not None and rollout.weight_sync is not None else None


def _make_extension():
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    class QuantizedWeightSyncExtension(vLLMColocateWorkerExtension):
        """verl's vLLM worker extension with INT8 / FP8 / W4A16 re-quantization at every weight sync."""

        def update_weights_from_ipc(self, peft_config: dict | None = None, base_sync_done=False, use_shm: bool = False):
            rollout = _rollout()
            lora = bool(peft_config and base_sync_done)
            if rollout is None or lora:
                if not lora:  # a 16-bit rollout: vLLM CPU packed its linears after loading (no-op on GPU)
                    restage_prepacked(self.model_runner.model)
                return super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
            from vllm.config import set_current_vllm_config

            start = time.perf_counter()
            model = self.model_runner.model
            # vLLM's config in scope, as at load: the FP8 scheme's create_weights builds its kernel from it
            with set_current_vllm_config(self.model_runner.vllm_config):
                staged = stage_for_loading(model, rollout.vllm_scheme) if rollout.weight_sync == "requantize" else []
                if rollout.weight_sync == "fake_quant":
                    restage_prepacked(model)
                # verl: buckets -> self._update_weights, then process_weights_after_loading once
                super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
            finish_sync(staged)
            log.info("suite %s weight sync: %.3f s", os.environ.get("SUITE_ROLLOUT_QUANT"), time.perf_counter() - start)

        def _update_weights(self, weights, peft_config, base_sync_done):
            rollout = _rollout()
            if rollout is None or (peft_config and base_sync_done):
                return super()._update_weights(weights, peft_config, base_sync_done)
            if rollout.weight_sync == "fake_quant":
                group = int(os.environ.get("SUITE_W4_GROUP_SIZE", "128"))
                sym = os.environ.get("SUITE_W4_SYMMETRIC", "1") == "1"
                weights = list(fake_quant_weights(weights, rollout.scheme(group, sym)))
            else:
                weights = list(requantize(weights, rollout))
            return super()._update_weights(weights, peft_config, base_sync_done)

    QuantizedWeightSyncExtension.__module__ = __name__
    return QuantizedWeightSyncExtension


def __getattr__(name: str):
    # Built on first access (vLLM resolves worker_extension_cls by qualified name), so importing
    # this module needs neither vLLM nor a GPU.
    if name == "QuantizedWeightSyncExtension":
        cls = _make_extension()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


__all__ = ["NoGPUError", "fake_quant_weights", "finish_sync", "fold_into_live", "int8_layers", "is_quantized_linear",
           "requantize", "requantize_fp8", "requantize_int8", "require_gpu", "restage_kv_scales", "restage_prepacked",
           "stage_for_loading"]
