"""INT8 (W8A8), per-channel FP8 and W4A16 rollouts for verl's vLLM engine: re-quantize every weight sync.

verl 0.9.1 supports only FP8 rollout natively. For ``quant=int8`` the translator
(suite.verl.translate) makes vLLM build the model with its compressed-tensors W8A8 INT8 scheme
(per-channel int8 weights, dynamic per-token int8 activations: vLLM's INT8 kernels) and with
this module's worker extension, ``QuantizedWeightSyncExtension``, in place of verl's
``vLLMColocateWorkerExtension`` (``engine_kwargs.vllm.worker_extension_cls``; no fork of verl).
A verl weight sync (``update_weights_from_ipc``) is then, a decoder layer at a time
(:class:`LayerwiseSync`), so that its extra memory is one layer's (or one bucket's) quantized
weights, never a second copy of the model:

1. each bucket's block linear weights are re-quantized with the embedded backend's quantizer
   (``suite.core.quant``: :func:`requantize_int8`, :func:`requantize_fp8`, :func:`requantize_w4a16`);
2. every quantized layer of a decoder layer the bucket reaches gets fresh parameters in vLLM's
   loading layout (the scheme's own ``create_weights``: e.g. int8 ``weight`` [out, in], float32
   ``weight_scale`` [out, 1]) just before vLLM's ``load_weights`` fills them (fusing q/k/v and
   gate/up shards, whichever bucket they arrive in);
3. once every shard of a layer has arrived, vLLM's ``process_weights_after_loading`` of that layer
   builds its kernel layout (a transpose for CUTLASS, a repack for Marlin, a oneDNN / packed handle
   on CPU), and on a GPU the result is copied into the live tensors the engine started with, so CUDA
   graphs captured on them stay valid (:func:`fold_into_live`, guarded by :func:`require_gpu`); the
   loading copy is dropped;
4. verl's own post-sync ``process_weights_after_loading`` over every module (its non-quantized path:
   verl's ``is_quantized_model`` is FP8-only) skips the layers already processed, so nothing is
   processed twice; the allocator's cache is released after the sync.

On vLLM's CPU build every unquantized linear whose weight the CPU kernels pre-packed away gets a
fresh loading weight too (``dispatch_cpu_unquantized_gemm`` replaces it by an empty tensor; the
packed copy lives in the layer's ``cpu_linear``), and every attention layer its KV-cache scale
placeholders, which their post-load processing deletes (:func:`restage_kv_scales`).

``quant=fp8 quant.fp8_granularity=per_channel`` (QuRL's FP8) runs the same way on vLLM's
compressed-tensors FP8 scheme (``CompressedTensorsW8A8Fp8``: float8 E4M3 ``weight`` [out, in],
float32 ``weight_scale`` [out, 1], dynamic per-token activations).

``quant=w4a16`` runs on vLLM's compressed-tensors W4A16 scheme (``CompressedTensorsWNA16``, format
"pack-quantized": int4 codes eight to an int32 ``weight_packed`` [out, in / 8], group-wise
``weight_scale`` [out, in / g], ``weight_shape`` and, asymmetric, a packed ``weight_zero_point``
[out / 8, in / g]), whose kernel is vLLM's int4 one (Marlin or Machete on a GPU,
``CPUWNA16LinearKernel`` on the CPU build). With ``quant.w4a16_kernels=emulated`` vLLM instead runs
16-bit kernels on weights fake-quantized to the 4-bit grid (``suite.core.quant.fake_quant``):
W4A16's numerics, not its speed.

Tested against a live vLLM CPU engine (tests/vllm_cpu/test_weight_sync.py,
tests/vllm_cpu/test_sync_check.py); the GPU fold is exercised by ``slurm/gpu_check.sh`` on a GPU node.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from suite.core.quant import QuantScheme, fake_quant, quantize_fp8, quantize_int8_per_channel, quantize_w4
from suite.hardware import request_amx_tiles
from suite.verl.rollout_quant import ROLLOUTS_BY_NAME, VerlRollout

log = logging.getLogger(__name__)

# vLLM imports this module in each of its worker processes (``worker_extension_cls``) before it
# loads the model. On an AMX CPU vLLM's INT8 GEMM (sgl-kernel) runs AMX tile instructions without
# asking Linux for them, so a fresh worker died with SIGILL at its first INT8 linear unless some
# oneDNN AMX kernel had asked first (docs/verl.md, "AMX tile permission"): ask here, for it.
request_amx_tiles()
# vLLM's CPU build serves a W4A16 checkpoint as W4A8 (int8 activations) on AMX CPUs unless told not
# to (VLLM_CPU_INT4_W4A8, default on: vllm/model_executor/kernels/linear/mixed_precision/cpu.py at
# v0.31.0); the rollout is W4A16, so every process that loads this module (the workers, and whoever
# writes the checkpoints a sync is compared with) keeps 16-bit activations. GPU builds ignore it.
os.environ.setdefault("VLLM_CPU_INT4_W4A8", "0")

# Block linear layers the rollout quantizes (Llama / Qwen2 names); embeddings, norms and
# lm_head stay in 16 bit (the compressed-tensors config lists lm_head under `ignore`).
QUANTIZED_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INT8_SCHEME = "CompressedTensorsW8A8Int8"  # vLLM's scheme class for W8A8 INT8 (compressed-tensors)
# every parameter a compressed-tensors scheme of ours registers (W8A8: weight ...; W4A16: weight_packed ...)
LIVE_PARAMS = ("weight", "weight_scale", "input_scale", "input_zero_point", "azp_adj", "weight_packed",
                "weight_shape", "weight_zero_point")
KERNEL_ATTRS = ("kernel", "fp8_linear")  # where a compressed-tensors scheme keeps its kernel object
UNQUANTIZED_LINEAR = "UnquantizedLinearMethod"  # vLLM's method of a 16-bit linear (pre-packed on CPU)


class NoGPUError(RuntimeError):
    """The GPU-only part of the weight sync (the fold into CUDA-graph tensors) ran without a CUDA GPU."""


def require_gpu(what: str = "the INT8 weight sync's fold into the live CUDA tensors") -> None:
    if not torch.cuda.is_available():
        raise NoGPUError(
            f"{what} keeps CUDA graphs valid and needs a CUDA GPU, but torch.cuda.is_available() is False on this "
            "machine. On vLLM's CPU build the sync needs no fold (LayerwiseSync skips it); on a GPU node "
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


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit values [rows, cols] (cols a multiple of 8) -> int32 [rows, cols / 8], value j of
    each eight in bits 4j .. 4j+3: compressed-tensors' "pack-quantized" layout, which vLLM unpacks."""
    rows, cols = values.shape
    if cols % 8:
        raise ValueError(f"pack_int4: {cols} columns; the int4 layout packs eight to an int32")
    v = values.to(torch.int64).reshape(rows, cols // 8, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=values.device)
    word = (v << shifts).sum(-1)  # < 2**32: disjoint bits, so the sum is the bitwise or
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def unpack_int4(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int32 [rows, cols / 8] -> uint8 values [rows, cols]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=packed.device)
    v = (packed.to(torch.int64)[..., None] >> shifts) & 0xF
    return v.reshape(packed.shape[0], -1)[:, :cols].to(torch.uint8)


def requantize_w4a16(weights: Iterable[tuple[str, torch.Tensor]], group_size: int,
                     symmetric: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full-precision weight) -> vLLM compressed-tensors W4A16 ("pack-quantized") tensors: a
    block linear's weight [out, in] becomes ``suite.core.quant.quantize_w4``'s codes, offset to
    unsigned (symmetric: code + 8, vLLM's uint4b8) and packed (``weight_packed`` int32 [out, in / 8]),
    its group scales (``weight_scale`` float32 [out, in / g]; vLLM keeps them in the model's dtype),
    ``weight_shape`` [out, in] and, asymmetric, the zero points packed along the output axis
    (``weight_zero_point`` int32 [out / 8, in / g]); every other tensor passes unchanged."""
    for name, w in weights:
        if not is_quantized_linear(name):
            yield name, w
            continue
        q = quantize_w4(w.to(torch.float32), group_size, symmetric, name=name)
        codes, scales = q[0], q[1]
        base = name[: -len("weight")]
        yield base + "weight_packed", pack_int4(codes.to(torch.int16) + 8 if symmetric else codes)
        yield base + "weight_scale", scales.to(torch.float32)
        yield base + "weight_shape", torch.tensor(list(w.shape), dtype=torch.int64, device=w.device)
        if not symmetric:
            yield base + "weight_zero_point", pack_int4(q[2].t()).t().contiguous()


def w4_params() -> tuple[int, bool]:
    """The W4A16 group size and symmetry the worker's environment carries (suite.verl.translate)."""
    return int(os.environ.get("SUITE_W4_GROUP_SIZE", "128")), os.environ.get("SUITE_W4_SYMMETRIC", "1") == "1"


def requantize(weights: Iterable[tuple[str, torch.Tensor]], rollout: VerlRollout) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` as ``rollout``'s compressed-tensors checkpoint stores them (int8, per-channel fp8 or
    packed int4). The quantizer is looked up at each call (a test replaces ``requantize_int8`` to break
    the sync)."""
    precision = rollout.scheme(128, True).precision
    if precision == "w4a16":
        return requantize_w4a16(weights, *w4_params())
    return requantize_int8(weights) if precision == "int8" else requantize_fp8(weights)


def fake_quant_weights(weights: Iterable[tuple[str, torch.Tensor]],
                       scheme: QuantScheme) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, weight) -> the same weights with every block linear on ``scheme``'s grid
    (dequantized, original dtype): the weight-only rollouts (W4A16)."""
    for name, w in weights:
        yield (name, fake_quant(w, scheme, name=name).to(w.dtype)) if is_quantized_linear(name) else (name, w)


def scheme_layers(model: torch.nn.Module, scheme: str = INT8_SCHEME) -> dict[str, torch.nn.Module]:
    """The vLLM model's linears of compressed-tensors ``scheme`` (W8A8 INT8 by default), by module name."""
    return {n: m for n, m in model.named_modules() if type(getattr(m, "scheme", None)).__name__ == scheme}


def int8_layers(model: torch.nn.Module, scheme: str = INT8_SCHEME) -> list[torch.nn.Module]:
    """The linears of :func:`scheme_layers`, in module order."""
    return list(scheme_layers(model, scheme).values())


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


def kernel_name(scheme) -> str:
    """The class name of a compressed-tensors scheme's kernel object (:data:`KERNEL_ATTRS`), else the scheme's."""
    return type(next((getattr(scheme, a) for a in KERNEL_ATTRS if getattr(scheme, a, None) is not None),
                     scheme)).__name__


def live_params(layer: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters a quantized layer's scheme registered (:data:`LIVE_PARAMS`), by name."""
    return {p: getattr(layer, p) for p in LIVE_PARAMS if isinstance(getattr(layer, p, None), torch.nn.Parameter)}


def _nbytes(params: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in params)


_BLOCK = re.compile(r"^(.*?\.layers\.\d+)\.")  # a decoder layer's prefix: model.layers.<i>


def _block(name: str) -> str | None:
    m = _BLOCK.match(name)
    return m.group(1) if m else None


def _process_once(layer: torch.nn.Module) -> None:
    """vLLM's post-load processing of one quantized layer, as its model loader runs it per module."""
    method = layer.quant_method
    type(method).process_weights_after_loading(method, layer)  # the class's: the instance one is shadowed
    if hasattr(layer, "update_param_tp_status"):
        layer.update_param_tp_status()


def _already_processed(layer: torch.nn.Module) -> None:
    """verl's post-sync processing of a layer this sync processed already: nothing to do."""


@dataclass
class _Pending:
    """A staged layer waiting for its shards: its live parameters and kernel objects (for the GPU fold),
    how many loads each staged parameter got, and the staged bytes."""

    layer: torch.nn.Module
    live: dict[str, torch.nn.Parameter]
    kernels: dict[str, object]
    counts: dict[int, int]
    staged_ids: list[int]
    nbytes: int

    def complete(self) -> bool:
        """Every staged parameter got one load per output shard (q / k / v, gate / up, or the one)."""
        shards = len(self.layer.output_partition_sizes)
        return all(self.counts.get(i, 0) >= shards for i in self.staged_ids)


class LayerwiseSync:
    """One weight sync of a re-quantized rollout, a decoder layer at a time (see the module doc).

    ``stage(names)`` before a bucket loads gives every quantized layer of the decoder layers the
    bucket reaches fresh loading-layout parameters, whose loaders count the shards they receive;
    ``finish_complete()`` after it processes each layer that has every shard, folds it into the live
    tensors on a GPU and drops the loading copy; ``close()`` after verl's own post-sync processing
    (which skips these layers) checks that nothing was left half-loaded (the extension then releases
    the cache, :func:`release_memory`).
    ``stats`` holds the loading-layout bytes this sync held at once beyond the engine's own weights
    (``peak_staged_bytes``: at most the decoder layers one bucket reaches), against the same for
    every layer it synced (``model_bytes``, what staging the whole model would hold) and for the
    largest decoder layer (``layer_bytes_max``).
    """

    def __init__(self, model: torch.nn.Module, scheme: str = INT8_SCHEME):
        self.layers = scheme_layers(model, scheme)
        if not self.layers:
            raise RuntimeError(f"SUITE_ROLLOUT_QUANT={os.environ.get('SUITE_ROLLOUT_QUANT', '')} but the vLLM model "
                               f"has no {scheme} layer: was it built with the compressed-tensors config of "
                               "suite.verl.translate?")
        if len({id(m.quant_method) for m in self.layers.values()}) != len(self.layers):
            raise RuntimeError("suite.verl.int8_hook: vLLM shares one quant method between layers; this vLLM "
                               "version is not supported by the layer-wise sync")
        self.pending: dict[str, _Pending] = {}
        self.done: set[str] = set()
        self.staged_bytes = 0
        self.block_bytes: dict[str | None, int] = {}  # loading-layout bytes per decoder layer, as staged
        self.stats = {"peak_staged_bytes": 0, "layer_bytes_max": 0, "model_bytes": 0, "layers": 0}
        for m in self.layers.values():  # verl's post-sync pass over every module must not process them again
            m.quant_method.process_weights_after_loading = _already_processed

    def stage(self, names: Iterable[str]) -> None:
        blocks = {_block(n) for n in names if is_quantized_linear(n)}
        for n, layer in self.layers.items():
            if n in self.done or n in self.pending:
                continue
            if _block(n) in blocks or (None in blocks):  # a linear outside any decoder layer: stage them all
                self._stage(n, layer)
        self.stats["peak_staged_bytes"] = max(self.stats["peak_staged_bytes"], self.staged_bytes)

    def _stage(self, name: str, layer: torch.nn.Module) -> None:
        live = live_params(layer)
        device = _device(layer)
        for p in live:
            delattr(layer, p)
        counts: dict[int, int] = {}
        load = _loader(layer)

        def counting_loader(param, *args, **kwargs):
            counts[id(param)] = counts.get(id(param), 0) + 1
            return load(param, *args, **kwargs)

        # the engine's kernel objects (GPU: e.g. Marlin's workspace, which captured CUDA graphs read);
        # create_weights makes new ones (W8A8 INT8 / W4A16: .kernel, compressed-tensors FP8: .fp8_linear)
        kernel = {a: getattr(layer.scheme, a) for a in KERNEL_ATTRS if getattr(layer.scheme, a, None) is not None}
        with torch.device(device):
            layer.scheme.create_weights(  # the INT8 scheme takes input / output size as **kwargs, FP8 needs them
                layer=layer, output_partition_sizes=layer.output_partition_sizes,
                input_size_per_partition=layer.input_size_per_partition, input_size=layer.input_size,
                output_size=layer.output_size, params_dtype=layer.params_dtype, weight_loader=counting_loader,
            )
        staged = live_params(layer)
        nbytes = _nbytes(staged.values())
        self.staged_bytes += nbytes
        self.block_bytes[_block(name)] = self.block_bytes.get(_block(name), 0) + nbytes
        self.pending[name] = _Pending(layer, live, kernel, counts, [id(t) for t in staged.values()], nbytes)

    def finish_complete(self) -> None:
        for name in [n for n, p in self.pending.items() if p.complete()]:
            p = self.pending.pop(name)
            _process_once(p.layer)
            if any(t.is_cuda for t in p.live.values()):
                fold_into_live(p.layer, p.live)
                for attr, kernel in p.kernels.items():  # keep the objects the CUDA graphs were captured with
                    setattr(p.layer.scheme, attr, kernel)
            self.staged_bytes -= p.nbytes
            self.done.add(name)

    def close(self) -> None:
        if self.block_bytes:
            sizes = self.block_bytes.values()
            self.stats.update(layer_bytes_max=max(sizes), model_bytes=sum(sizes), layers=len(self.block_bytes))
        for m in self.layers.values():
            m.quant_method.__dict__.pop("process_weights_after_loading", None)
        if self.pending:
            n, names = len(self.pending), ", ".join(sorted(self.pending)[:4])
            self.pending.clear()
            raise RuntimeError(f"weight sync: {n} quantized layers received only part of their shards ({names}): "
                               "the sync was incomplete")


def _on_cuda() -> bool:
    """Whether this process drives a CUDA device (its engine's tensors are CUDA ones)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def release_memory() -> None:
    """Return what a sync freed: the CUDA caching allocator's blocks (``empty_cache``) on a GPU."""
    gc.collect()
    if _on_cuda():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


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
    """GPU only: copy the processed tensors into the live ones and restore them, so CUDA graphs
    captured on the live tensors read the new weights (:func:`copy_into_live`)."""
    require_gpu()
    copy_into_live(layer, live)


def copy_into_live(layer: torch.nn.Module, live: dict[str, torch.nn.Parameter]) -> None:
    """Copy each processed parameter of ``layer`` into the live one of the same name (same shape:
    vLLM's processing is a function of the loading shapes, so every sync gives the layout the engine
    started with) and put the live one back; raises where a layout changed."""
    for p, old in live.items():
        new = getattr(layer, p, None)
        if new is None or new.shape != old.shape:
            raise RuntimeError(f"weight sync: {p} changed layout ({None if new is None else tuple(new.shape)} "
                               f"vs live {tuple(old.shape)}); this vLLM version is not supported by "
                               "suite.verl.int8_hook")
        old.data.copy_(new.data)
        delattr(layer, p)
        layer.register_parameter(p, old)


def _rollout():
    rollout = ROLLOUTS_BY_NAME.get(os.environ.get("SUITE_ROLLOUT_QUANT", ""))
    return rollout if rollout is not None and rollout.weight_sync is not None else None


def _memory_mark() -> int:
    """Bytes in use now (GPU: allocated by torch; CPU: resident), with the peak counter reset."""
    if _on_cuda():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    try:
        with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS (Linux)
            f.write("5")
        return _proc_status("VmRSS")
    except OSError:
        return 0


def _memory_peak() -> int:
    if _on_cuda():
        return torch.cuda.max_memory_allocated()
    try:
        return _proc_status("VmHWM")
    except OSError:
        return 0


def _proc_status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {key}")


def _make_extension():
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    class QuantizedWeightSyncExtension(vLLMColocateWorkerExtension):
        """verl's vLLM worker extension with INT8 / FP8 / W4A16 re-quantization at every weight sync."""

        suite_sync: LayerwiseSync | None = None
        suite_last_sync: dict | None = None  # the last sync's seconds and memory (suite_sync_stats)

        def update_weights_from_ipc(self, peft_config: dict | None = None, base_sync_done=False, use_shm: bool = False):
            rollout = _rollout()
            lora = bool(peft_config and base_sync_done)
            if rollout is None or lora:
                if not lora:  # a 16-bit rollout: vLLM CPU packed its linears after loading (no-op on GPU)
                    restage_prepacked(self.model_runner.model)
                return super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
            from vllm.config import set_current_vllm_config

            start = time.perf_counter()
            before = _memory_mark()
            model = self.model_runner.model
            # vLLM's config in scope, as at load: the FP8 scheme's create_weights builds its kernel from it
            with set_current_vllm_config(self.model_runner.vllm_config):
                if rollout.weight_sync == "requantize":
                    self.suite_sync = LayerwiseSync(model, rollout.vllm_scheme)
                restage_prepacked(model)
                restage_kv_scales(model)
                try:
                    # verl: buckets -> self._update_weights, then process_weights_after_loading once
                    super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
                finally:
                    sync, self.suite_sync = self.suite_sync, None
                    if sync is not None:
                        sync.close()
            release_memory()
            stats = dict(sync.stats) if sync is not None else {}
            stats.update(seconds=time.perf_counter() - start, peak_extra_bytes=max(0, _memory_peak() - before),
                         device="cuda" if _on_cuda() else "cpu")
            self.suite_last_sync = stats
            log.info("suite %s weight sync: %s", os.environ.get("SUITE_ROLLOUT_QUANT"), stats)

        def suite_sync_stats(self) -> dict | None:
            """The last weight sync's seconds and memory (for ``collective_rpc``)."""
            return self.suite_last_sync

        def _update_weights(self, weights, peft_config, base_sync_done):
            rollout = _rollout()
            if rollout is None or (peft_config and base_sync_done):
                return super()._update_weights(weights, peft_config, base_sync_done)
            if rollout.weight_sync == "fake_quant":
                weights = list(fake_quant_weights(weights, rollout.scheme(*w4_params())))
                return super()._update_weights(weights, peft_config, base_sync_done)
            self.suite_sync.stage(n for n, _ in weights)
            result = super()._update_weights(list(requantize(weights, rollout)), peft_config, base_sync_done)
            self.suite_sync.finish_complete()
            return result

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


__all__ = ["LayerwiseSync", "NoGPUError", "copy_into_live", "fake_quant_weights", "fold_into_live", "int8_layers",
           "is_quantized_linear", "kernel_name", "live_params", "pack_int4", "release_memory", "requantize",
           "requantize_fp8", "requantize_int8", "requantize_w4a16", "require_gpu", "restage_kv_scales",
           "restage_prepacked", "scheme_layers", "unpack_int4", "w4_params"]
