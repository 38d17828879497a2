"""The GPU section: its arithmetic here; its kernels only where CUDA is present."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from suite.bench import gpu

SCRIPT = Path(gpu.__file__)


def test_block_shapes_follow_the_model_configs():
    # Qwen2.5-7B: q 28 x 128 = 3584, k and v 4 x 128 = 512 each; gate and up 18944 each.
    assert gpu.block_shapes("7B") == {"qkv": (3584, 4608), "o": (3584, 3584), "gate_up": (3584, 37888),
                                      "down": (18944, 3584)}
    assert gpu.block_shapes("32B") == {"qkv": (5120, 7168), "o": (5120, 5120), "gate_up": (5120, 55296),
                                       "down": (27648, 5120)}


def test_amdahl_and_the_share_the_paper_needs():
    assert gpu.amdahl(0.4, 2.0) == pytest.approx(1.25)  # 1 / (0.6 + 0.4 / 2)
    assert gpu.required_share(1.25, 2.0) == pytest.approx(0.4)  # (1 - 0.8) / (1 - 0.5)
    assert gpu.required_share(1.9, 1.5) > 1  # 1.5x linears cannot give 1.9x overall
    assert gpu.required_share(1.2, 1.0) == math.inf


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_standalone_script_says_no_cuda_device(tmp_path):
    # Run as a plain script from another directory: it must need nothing but torch.
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0
    assert "no CUDA device" in proc.stderr and proc.stdout.strip() == "[]"
    bad = subprocess.run([sys.executable, str(SCRIPT), "--batch", "8"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    assert bad.returncode == 2 and "--batch=8: must be > 16" in bad.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernels_and_a_short_run():
    gpu.check_kernels()  # int8 / fp8 GEMMs reproduce the dequantized reference
    rows, summary, info = gpu.run_gpu(models=("7B",), batches=(32,), repeats=2, calls=4, time_limit_s=120)
    assert len(rows) == 4 and len(summary) == 1 and info["complete"]
    s = summary[0]
    tot = {v: sum(r[f"{v}_us"] for r in rows) for v in gpu.VARIANTS}
    assert s["fp8_speedup"] == pytest.approx(tot["bf16"] / tot["fp8"])
