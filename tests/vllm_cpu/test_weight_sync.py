"""The INT8 / W4A16 (int4 and emulated) weight-sync hook (suite.verl.int8_hook) against a live vLLM CPU engine.

The sync runs exactly as in a verl run: the engine is built with the hook as its
``worker_extension_cls``, the weights go through verl's own ``BucketedWeightSender`` (shared
memory, 1 MB buckets: the tiny model's ~2 MB of float32 weights arrive in several buckets, so
fused q/k/v and gate/up shards can land in different ones) into verl's
``update_weights_from_ipc``, which ends with vLLM's ``process_weights_after_loading`` on every
module (verl's post-sync processing). After each sync the engine must compute exactly what a
fresh engine loaded from the checkpoint of the synced weights computes.

Not verified without a GPU (slurm/gpu_check.sh checks it on a GPU node): the fold of the
processed tensors into the live CUDA tensors (``fold_into_live``: same storage, so captured
CUDA graphs stay valid) and vLLM's CUDA INT8 kernels (CUTLASS, whose weight layout is the
transposed one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from vllm_tiny import NUMBERS, W4_GROUP, checkpoints, engine, prompt_logprobs, rollout_logprobs, sequences

BUCKET_MB = 1


@pytest.fixture
def verl_env(monkeypatch):
    """What a verl rollout worker's environment holds: the CPU platform (suite.verl.cpu_workarounds,
    via the suite's verl.plugins entry point) and a job id naming the sync socket."""
    monkeypatch.setenv("SUITE_VERL_CPU", "1")
    monkeypatch.setenv("VERL_RAY_JOB_ID", "suite-test-" + uuid.uuid4().hex[:8])
    import verl  # noqa: F401  (loads the plugins)

    from suite.verl.cpu_workarounds import register

    register()  # idempotent; verl may have been imported by an earlier test without the variable
    return monkeypatch


def _weights(path):
    from safetensors.torch import load_file

    return list(load_file(str(path / "model.safetensors")).items())


def sync(llm, weights) -> float:
    """One verl weight sync into ``llm`` (suite.verl.sync_check, which slurm/gpu_check.sh runs too)."""
    from suite.verl.sync_check import sync_weights

    return sync_weights(llm, weights, bucket_mb=BUCKET_MB)


PROMPTS = [s[:10] for s in sequences(4, seed=1)]


def syncs_equal_fresh_loads(ck: dict, kind: str, dtype: str) -> list[float]:
    """Start an engine from model 0's ``kind`` checkpoint with the sync extension, sync models 1, 2,
    1 into it, and after each sync compare its greedy tokens and log-probs with a fresh engine
    loaded from that model's ``kind`` checkpoint: equal, and unlike model 0's. Returns the seconds."""
    want = {}
    for seed in (1, 2):  # fresh loads of the quantized checkpoints of the weights synced below
        llm = engine(ck[seed][kind], dtype)
        want[seed] = rollout_logprobs(llm, PROMPTS)
        del llm
    llm = engine(ck[0][kind], dtype, worker_extension_cls="suite.verl.int8_hook.QuantizedWeightSyncExtension")
    start = rollout_logprobs(llm, PROMPTS)
    seconds = []
    for seed in (1, 2, 1):  # repeated syncs, back to an earlier model too
        seconds.append(sync(llm, _weights(ck[seed]["fp"])))
        got = rollout_logprobs(llm, PROMPTS)
        assert got == want[seed], f"after syncing model {seed}: {got[0]} vs fresh load {want[seed][0]}"
    del llm
    assert start != want[1]  # the syncs changed what the engine computes
    return seconds


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_int8_syncs_equal_a_fresh_load_of_the_int8_checkpoint(verl_env, tmp_path, dtype):
    verl_env.setenv("SUITE_ROLLOUT_QUANT", "int8")
    ck = {seed: checkpoints(tmp_path, seed) for seed in (0, 1, 2)}
    seconds = syncs_equal_fresh_loads(ck, "int8", dtype)
    NUMBERS.append(f"int8 weight sync ({dtype}, {len(_weights(ck[1]['fp']))} tensors, {BUCKET_MB} MB buckets): "
                   + ", ".join(f"{s:.3f} s" for s in seconds) + "; log-probs identical to a fresh INT8 load")


def test_w4a16_int4_syncs_equal_a_fresh_load_of_the_packed_checkpoint(verl_env, tmp_path):
    """W4A16 on verl = vLLM's int4 kernel (CPUWNA16LinearKernel here) on a packed compressed-tensors
    checkpoint; each sync re-quantizes and packs the weights, a decoder layer at a time."""
    verl_env.setenv("SUITE_ROLLOUT_QUANT", "w4a16")
    verl_env.setenv("SUITE_W4_GROUP_SIZE", str(W4_GROUP))
    verl_env.setenv("SUITE_W4_SYMMETRIC", "1")
    ck = {seed: checkpoints(tmp_path, seed, w4a16=True) for seed in (0, 1, 2)}
    seconds = syncs_equal_fresh_loads(ck, "w4a16", "bfloat16")
    NUMBERS.append(f"w4a16 int4 weight sync (bfloat16, group {W4_GROUP}): " + ", ".join(f"{s:.3f} s" for s in seconds)
                   + "; log-probs identical to a fresh load of the packed checkpoint")


def test_w4a16_int4_matches_the_suite_quantizer_on_bf16_kernels(verl_env, tmp_path):
    """Parity of the int4 kernel with the suite's W4A16 quantizer: teacher-forced log-probs of the
    packed checkpoint on vLLM's int4 kernel against the same weights fake-quantized by suite.core.quant
    on bf16 kernels (the emulated path). Their gap (bf16 scales, the kernels' summation order) must be a
    small fraction of what W4A16 itself changes (emulated against the unquantized model): measured
    0.0053 against 0.123 (ratio 0.043) on an AVX-512 VNNI CPU; the bound is 0.25."""
    from safetensors.torch import save_file

    from suite.core.quant import QuantScheme
    from suite.verl.int8_hook import fake_quant_weights

    ck = checkpoints(tmp_path, 1, w4a16=True)
    emulated = tmp_path / "emulated"
    emulated.mkdir()
    for p in ck["fp"].iterdir():
        if p.suffix != ".safetensors":
            (emulated / p.name).write_bytes(p.read_bytes())
    fq = dict(fake_quant_weights(_weights(ck["fp"]), QuantScheme(precision="w4a16", group_size=W4_GROUP)))
    save_file({k: v.contiguous() for k, v in fq.items()}, str(emulated / "model.safetensors"),
              metadata={"format": "pt"})
    seqs = sequences(8, seed=3)
    logp = {}
    for name, path in (("int4", ck["w4a16"]), ("emulated", emulated), ("bf16", ck["fp"])):
        llm = engine(path, "bfloat16")
        if name == "int4":
            kernels = llm.collective_rpc(lambda self: sorted({type(m.scheme.kernel).__name__ for m in
                                                              self.model_runner.model.modules()
                                                              if hasattr(m, "scheme")}))
            assert kernels[0] == ["CPUWNA16LinearKernel"], kernels
        logp[name] = prompt_logprobs(llm, seqs)
        del llm
    kernel_gap = (logp["int4"] - logp["emulated"]).abs().mean().item()
    quant_effect = (logp["emulated"] - logp["bf16"]).abs().mean().item()
    NUMBERS.append(f"w4a16 parity: mean |dlogp| int4 kernel vs suite quantizer on bf16 kernels {kernel_gap:.4f}; "
                   f"W4A16 itself (emulated vs bf16) {quant_effect:.4f}; ratio {kernel_gap / quant_effect:.3f}")
    assert quant_effect > 0.05  # the quantization is visible, so the comparison can fail
    assert kernel_gap < 0.25 * quant_effect, (kernel_gap, quant_effect)


def test_w4a16_emulated_syncs_equal_a_fresh_load_of_the_fake_quantized_checkpoint(verl_env, tmp_path):
    """quant.w4a16_kernels=emulated: 16-bit kernels on weights put on the 4-bit grid at each sync; on
    vLLM CPU its 16-bit linears are pre-packed after loading, which the hook re-stages."""
    from safetensors.torch import save_file

    from suite.core.quant import QuantScheme
    from suite.verl.int8_hook import fake_quant_weights

    verl_env.setenv("SUITE_ROLLOUT_QUANT", "w4a16_emulated")
    verl_env.setenv("SUITE_W4_GROUP_SIZE", "32")
    verl_env.setenv("SUITE_W4_SYMMETRIC", "1")
    ck0, ck1 = checkpoints(tmp_path, 0), checkpoints(tmp_path, 1)
    w1 = _weights(ck1["fp"])
    fq = dict(fake_quant_weights(w1, QuantScheme(precision="w4a16", group_size=32, symmetric=True)))
    save_file({k: v.contiguous() for k, v in fq.items()}, str(ck1["fp"] / "model.safetensors"),
              metadata={"format": "pt"})
    llm = engine(ck1["fp"], "bfloat16")
    want = rollout_logprobs(llm, PROMPTS)
    del llm
    llm = engine(ck0["fp"], "bfloat16", worker_extension_cls="suite.verl.int8_hook.QuantizedWeightSyncExtension")
    for _ in range(2):
        sync(llm, w1)
        assert rollout_logprobs(llm, PROMPTS) == want
    del llm


def test_a_sync_missing_a_shard_fails_naming_the_layer(verl_env, tmp_path):
    """A sync that never delivers one fused shard (layer 1's v_proj) leaves that layer half-loaded: the
    sync fails naming it instead of serving a layer of stale and new shards."""
    verl_env.setenv("SUITE_ROLLOUT_QUANT", "int8")
    ck0, ck1 = checkpoints(tmp_path, 0), checkpoints(tmp_path, 1)
    llm = engine(ck0["int8"], "bfloat16", worker_extension_cls="suite.verl.int8_hook.QuantizedWeightSyncExtension")
    weights = [(n, t) for n, t in _weights(ck1["fp"]) if n != "model.layers.1.self_attn.v_proj.weight"]
    with pytest.raises(Exception, match=r"1 quantized layers received only part of their shards "
                                        r"\(model.layers.1.self_attn.qkv_proj\)"):
        sync(llm, weights)
    del llm


@pytest.mark.slow
def test_gpu_only_fold_is_guarded_and_skipped_on_cpu():
    """The GPU-only part (fold into the live CUDA tensors) refuses without a GPU (the layer-wise sync
    calls it only for CUDA tensors)."""
    from suite.verl.int8_hook import NoGPUError, fold_into_live

    layer = torch.nn.Linear(4, 4)
    live = {"weight": layer.weight}
    if not torch.cuda.is_available():
        with pytest.raises(NoGPUError, match="CUDA graphs valid and needs a CUDA GPU"):
            fold_into_live(layer, live)


WORKER_SCRIPT = '''
import json, sys
sys.path.insert(0, sys.argv[3])
from vllm_tiny import engine, rollout_logprobs

if __name__ == "__main__":
    llm = engine(sys.argv[1], "bfloat16", worker_extension_cls="suite.verl.int8_hook.QuantizedWeightSyncExtension")
    print("@@" + json.dumps(rollout_logprobs(llm, json.loads(sys.argv[2]))), flush=True)
'''


def test_int8_in_a_fresh_worker_process_as_verl_runs_it(tmp_path):
    """verl's vLLM engines run the model in a worker process of their own (vLLM's multiprocessing
    executor), where nothing has run before it. On an AMX Xeon vLLM's INT8 GEMM (sgl-kernel) uses
    AMX tiles without asking Linux for them, and such a worker died with SIGILL at its first INT8
    linear (exit code -4) in about half the runs (which kernel ran first varies: 2 of 4 for this engine
    with the extension but without its request, 5 of 8 in all; a verl GRPO run, 2 of 3) until the
    worker extension asked at import (suite.hardware.request_amx_tiles; docs/verl.md, "AMX tile
    permission"; tests/test_hardware.py checks the request itself, deterministically). Its rollouts
    equal those of an engine in this process, where torch's own AMX kernels had asked long before."""
    ck = checkpoints(tmp_path, 0)
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # engine core and worker: processes of their own
    proc = subprocess.run([sys.executable, str(script), str(ck["int8"]), json.dumps(PROMPTS),
                           str(Path(__file__).parent)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    got = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("@@"))[2:])
    llm = engine(ck["int8"], "bfloat16")
    want = rollout_logprobs(llm, PROMPTS)
    del llm
    assert [tuple(map(list, r)) for r in got] == [tuple(map(list, r)) for r in want]
