"""slurm/gpu_check.sh's weight-sync check, run on vLLM's CPU build (`--device cpu`): the same
command a GPU node runs, without its CUDA parts (the GPU re-quantizer and the live-tensor fold):
INT8, per-channel FP8 and W4A16 on int4 kernels, each synced A, B, A, B, a decoder layer at a time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_tiny import NUMBERS

pytestmark = pytest.mark.slow


def test_the_sync_check_passes_on_vllm_cpu(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "suite.verl.sync_check", "--device", "cpu"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=800)
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-4000:]
    checks = json.loads(next(x for x in out.splitlines() if x.startswith("CHECKS "))[len("CHECKS "):])
    assert [(c["name"], c["status"]) for c in checks] == [
        ("platform", "PASS"), ("vllm", "PASS"), ("sync-int8", "PASS"), ("sync-fp8_per_channel", "PASS"),
        ("sync-w4a16", "PASS")]
    for c in checks[2:]:
        assert c["detail"].count("max |dlogp|") == 3 and "staged at most" in c["detail"], c
        NUMBERS.append(f"sync check (--device cpu) {c['name']}: {c['detail']}")
    assert checks[-1]["detail"].startswith("CPUWNA16LinearKernel;")  # vLLM's int4 kernel, not bf16 GEMMs


def test_the_sync_check_fails_without_cuda_and_says_why(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "suite.verl.sync_check", "--device", "cuda"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "CHECK platform: FAIL" in proc.stdout and "run on a GPU node" in proc.stdout, proc.stdout


CONTROL = """
import sys
import suite.verl.int8_hook as hook
import suite.verl.w8a8_checkpoint  # noqa: F401  (the reference checkpoints keep the real quantizer)
from suite.verl import sync_check

real = hook.requantize_int8


def scales_off(weights):
    for name, t in real(weights):
        yield name, (t * 1.05 if name.endswith("weight_scale") else t)


hook.requantize_int8 = scales_off  # what the extension calls at each sync (the engine runs in this process)
sys.exit(sync_check.main(["--device", "cpu", "--rollouts", "int8"]))
"""


def test_the_sync_check_fails_when_the_sync_is_off(tmp_path):
    """The control: a sync whose re-quantizer scales the weights by 1.05 (every code right, every
    scale 5 % off) must fail the check, naming the model after whose sync it differs."""
    proc = subprocess.run([sys.executable, "-c", CONTROL], cwd=tmp_path, capture_output=True, text=True, timeout=800)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("CHECK ")]
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    assert lines[-1].startswith("CHECK sync-int8: FAIL") and "after syncing model B" in lines[-1], lines
