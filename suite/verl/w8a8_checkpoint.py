"""A compressed-tensors W8A8 INT8 (or per-channel FP8) checkpoint of a Hugging Face model, quantized by the suite.

``write_w8a8_checkpoint(IN_DIR, OUT_DIR)`` writes the checkpoint vLLM loads with its
compressed-tensors W8A8 INT8 scheme (``quantization_config`` = suite.verl.rollout_quant
``W8A8_QUANT_CONFIG``): every block linear's weight becomes int8 codes plus a float32
``weight_scale`` [out, 1] from suite.core.quant ``quantize_int8_per_channel`` (the embedded
engine's quantizer; suite.verl.int8_hook ``requantize_int8``), everything else is copied as is.
It is what the INT8 weight sync must reproduce: after a sync of full-precision weights W the
engine must compute what a fresh load of ``write_w8a8_checkpoint`` of W computes
(tests/vllm_cpu/test_weight_sync.py), and what the parity test loads (tests/vllm_cpu/test_parity.py).
``write_w8a8_checkpoint(IN, OUT, rollout="fp8_per_channel")`` writes QuRL's FP8 instead: float8 E4M3
codes and per-channel scales (suite.verl.int8_hook ``requantize_fp8``), ``FP8_CHANNEL_QUANT_CONFIG``;
``rollout="w4a16", group_size=G, symmetric=...`` QaRL's W4A16 as llm-compressor's "pack-quantized"
format (int4 codes packed in int32, group-wise scales; suite.verl.int8_hook ``requantize_w4a16``),
which vLLM serves on its int4 kernels.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from suite.verl.int8_hook import requantize_fp8, requantize_int8, requantize_w4a16
from suite.verl.rollout_quant import ROLLOUTS_BY_NAME

# bound at import: the checkpoint is the reference a sync is checked against, so a test that breaks
# the extension's quantizer (tests/vllm_cpu/test_sync_check.py, the control) leaves this one real
_REQUANTIZE = {"int8": lambda w, g, sym: requantize_int8(w), "fp8_per_channel": lambda w, g, sym: requantize_fp8(w),
               "w4a16": requantize_w4a16}


def write_w8a8_checkpoint(in_dir: str | os.PathLike, out_dir: str | os.PathLike, rollout: str = "int8",
                          group_size: int = 128, symmetric: bool = True) -> Path:
    """Quantize the safetensors shards of ``in_dir`` into ``out_dir`` (created; tokenizer files copied)
    for the verl rollout named ``rollout``: ``int8``, ``fp8_per_channel`` or ``w4a16`` (at
    ``group_size`` / ``symmetric``)."""
    spec = ROLLOUTS_BY_NAME.get(rollout)
    if spec is None or spec.quant_config is None:
        allowed = ", ".join(n for n, r in ROLLOUTS_BY_NAME.items() if r.quant_config is not None)
        raise ValueError(f"rollout={rollout!r} has no compressed-tensors checkpoint; allowed: {allowed}")
    from safetensors import safe_open
    from safetensors.torch import save_file

    in_dir, out_dir = Path(in_dir), Path(out_dir)
    shards = sorted(in_dir.glob("*.safetensors"))
    if not (in_dir / "config.json").is_file() or not shards:
        raise ValueError(f"{in_dir}: not a Hugging Face safetensors model directory (config.json + *.safetensors)")
    out_dir.mkdir(parents=True, exist_ok=False)
    weight_map = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            tensors = [(k, f.get_tensor(k)) for k in f.keys()]  # noqa: SIM118 (safe_open is no dict)
        out = {k: t.contiguous() for k, t in _REQUANTIZE[rollout](tensors, group_size, symmetric)}
        save_file(out, str(out_dir / shard.name), metadata={"format": "pt"})
        weight_map.update({k: shard.name for k in out})
    if len(shards) > 1:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = json.loads((in_dir / "config.json").read_text())
    config["quantization_config"] = spec.checkpoint_config(group_size, symmetric)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    for p in in_dir.iterdir():  # tokenizer and generation config
        if p.is_file() and p.suffix != ".safetensors" and p.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(p, out_dir / p.name)
    return out_dir


__all__ = ["write_w8a8_checkpoint"]
