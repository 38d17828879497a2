"""INT8 (W8A8) and W4A16 rollout for verl's vLLM engine: re-quantize every weight sync.

verl 0.9.1 supports only FP8 rollout natively. For ``quant=int8`` the translator
(suite.verl.translate) makes vLLM build the model with its compressed-tensors W8A8 INT8 scheme
(per-channel int8 weights, dynamic per-token int8 activations: vLLM's INT8 kernels) and with
this module's worker extension, ``QuantizedWeightSyncExtension``, in place of verl's
``vLLMColocateWorkerExtension`` (``engine_kwargs.vllm.worker_extension_cls``; no fork of verl).
At every weight sync verl hands the extension the actor's full-precision weights; it

1. re-quantizes each block linear weight with ``suite.core.quant.quantize_int8_per_channel``
   (the same quantizer as the embedded backend) into ``weight`` (int8 [out, in]) and
   ``weight_scale`` (float32 [out, 1]), the checkpoint layout vLLM's loaders expect;
2. gives each quantized layer fresh parameters in that loading layout (the scheme's own
   ``create_weights``), loads through vLLM's ``load_weights`` (which fuses q/k/v and gate/up
   shards), runs the scheme's ``process_weights_after_loading`` (kernel layout), and copies the
   result into the live tensors, so CUDA graphs captured on them stay valid.

For ``quant=w4a16`` vLLM runs bf16 kernels on weights fake-quantized to the 4-bit group-wise
grid (``suite.core.quant.fake_quant``): the rollout's numerics are W4A16's, not its speed.

Everything here needs a CUDA GPU and vLLM; without a GPU the hook raises
:class:`NoGPUError` naming what to do. ``slurm/gpu_check.sh`` exercises the path on a GPU node.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator

import torch

from suite.core.quant import QuantScheme, fake_quant, quantize_int8_per_channel
from suite.verl.rollout_quant import VERL_ROLLOUTS

log = logging.getLogger(__name__)

# Block linear layers the rollout quantizes (Llama / Qwen2 names); embeddings, norms and
# lm_head stay in bf16 (the compressed-tensors config lists lm_head under `ignore`).
QUANTIZED_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INT8_SCHEME = "CompressedTensorsW8A8Int8"  # vLLM's scheme class for W8A8 INT8 (compressed-tensors)
_LIVE_PARAMS = ("weight", "weight_scale", "input_scale", "input_zero_point", "azp_adj")


class NoGPUError(RuntimeError):
    """The INT8 / W4A16 rollout hook was called where no CUDA GPU is visible."""


def require_gpu(what: str = "INT8 rollout (quant=int8, backend=verl)") -> None:
    if not torch.cuda.is_available():
        raise NoGPUError(
            f"{what} re-quantizes the synced weights for vLLM's GPU kernels and needs a CUDA GPU, but "
            "torch.cuda.is_available() is False on this machine. Run it on a GPU node (slurm/gpu_check.sh "
            "checks one), or choose quant=bf16|fp8 for backend=verl; CPU runs use backend=embedded."
        )


def is_quantized_linear(name: str) -> bool:
    """Whether a checkpoint tensor name is the weight of a block linear the rollout quantizes."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in QUANTIZED_LINEARS


def requantize_int8(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full-precision weight) -> vLLM compressed-tensors W8A8 tensors.

    A block linear ``...proj.weight`` [out, in] becomes ``...proj.weight`` (int8 codes) and
    ``...proj.weight_scale`` (float32 [out, 1]); every other tensor passes unchanged.
    """
    require_gpu()
    for name, w in weights:
        if is_quantized_linear(name):
            codes, scales = quantize_int8_per_channel(w.to(torch.float32), name=name)
            yield name, codes
            yield name[: -len("weight")] + "weight_scale", scales.to(torch.float32)
        else:
            yield name, w


def fake_quant_weights(weights: Iterable[tuple[str, torch.Tensor]],
                       scheme: QuantScheme) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, weight) -> the same weights with every block linear on ``scheme``'s grid
    (dequantized, original dtype): the weight-only rollouts (W4A16)."""
    p = scheme.precision
    require_gpu(f"{p.upper()} rollout (quant={p}, backend=verl)")
    for name, w in weights:
        yield (name, fake_quant(w, scheme, name=name).to(w.dtype)) if is_quantized_linear(name) else (name, w)


def _int8_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(getattr(m, "scheme", None)).__name__ == INT8_SCHEME]


def _stage_for_loading(layer: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Give ``layer`` fresh loading-layout parameters; return its live (kernel-layout) ones."""
    live = {p: getattr(layer, p) for p in _LIVE_PARAMS if isinstance(getattr(layer, p, None), torch.nn.Parameter)}
    for p in live:
        delattr(layer, p)
    loader = getattr(layer, "weight_loader_v2", None) or layer.weight_loader
    layer.scheme.create_weights(
        layer=layer,
        output_partition_sizes=layer.output_partition_sizes,
        input_size_per_partition=layer.input_size_per_partition,
        params_dtype=layer.params_dtype,
        weight_loader=loader,
    )
    return live


def _fold_into_live(layer: torch.nn.Module, live: dict[str, torch.nn.Parameter]) -> None:
    """Copy the processed tensors into the live ones (same shape and strides) and restore them."""
    for p, old in live.items():
        new = getattr(layer, p, None)
        if new is None or new.shape != old.shape:
            raise RuntimeError(f"INT8 weight sync: {p} changed layout ({None if new is None else tuple(new.shape)} "
                               f"vs live {tuple(old.shape)}); this vLLM version is not supported by suite.verl.int8_hook")
        old.data.copy_(new.data)
        delattr(layer, p)
        layer.register_parameter(p, old)


def load_int8_weights(model: torch.nn.Module, weights: list[tuple[str, torch.Tensor]], load) -> float:
    """Re-quantize ``weights`` and load them into the vLLM ``model`` with ``load``; seconds taken."""
    require_gpu()
    start = time.perf_counter()
    layers = _int8_layers(model)
    if not layers:
        raise RuntimeError(f"SUITE_ROLLOUT_QUANT=int8 but the vLLM model has no {INT8_SCHEME} layer: "
                           "was it built with the compressed-tensors W8A8 config of suite.verl.translate?")
    staged = [(layer, _stage_for_loading(layer)) for layer in layers]
    load(list(requantize_int8(weights)))
    for layer, live in staged:
        layer.quant_method.process_weights_after_loading(layer)
        _fold_into_live(layer, live)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _make_extension():
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    class QuantizedWeightSyncExtension(vLLMColocateWorkerExtension):
        """verl's vLLM worker extension with INT8 / W4A16 re-quantization at every weight sync."""

        def _update_weights(self, weights, peft_config, base_sync_done):
            mode = os.environ.get("SUITE_ROLLOUT_QUANT", "")
            rollout = VERL_ROLLOUTS.get(mode)
            if rollout is None or rollout.weight_sync is None or (peft_config and base_sync_done):
                return super()._update_weights(weights, peft_config, base_sync_done)
            if rollout.weight_sync == "fake_quant":
                group = int(os.environ.get("SUITE_W4_GROUP_SIZE", "128"))
                sym = os.environ.get("SUITE_W4_SYMMETRIC", "1") == "1"
                scheme = rollout.scheme(group, sym)
                return super()._update_weights(list(fake_quant_weights(weights, scheme)), peft_config, base_sync_done)
            seconds = load_int8_weights(
                self.model_runner.model, list(weights),
                lambda qw: super(QuantizedWeightSyncExtension, self)._update_weights(qw, peft_config, base_sync_done),
            )
            log.info("suite int8 weight sync: %.3f s", seconds)

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


__all__ = ["NoGPUError", "fake_quant_weights", "is_quantized_linear", "load_int8_weights", "require_gpu", "requantize_int8"]
