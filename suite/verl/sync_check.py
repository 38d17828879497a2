"""Does the re-quantizing weight sync give vLLM the weights it was sent? One command, on a GPU node
or on vLLM's CPU build:

    python -m suite.verl.sync_check --device cuda     # slurm/gpu_check.sh runs this
    python -m suite.verl.sync_check --device cpu      # vLLM's CPU build (tests/vllm_cpu)
    python -m suite.verl.sync_check --device cpu --rollouts int8

For each rollout (``int8``: W8A8 INT8; ``fp8_per_channel``: QuRL's FP8; ``w4a16``: QaRL's W4A16 on
vLLM's int4 kernels), two different models A and B (random, with logits far from uniform, so that
the check can tell them apart) are written as float32 checkpoints and as that rollout's
compressed-tensors checkpoints (suite.verl.w8a8_checkpoint). An engine is started from A's
checkpoint with the suite's worker extension (suite.verl.int8_hook), then B, A and B again are
synced into it through verl's own sender and receiver (``BucketedWeightSender`` ->
``update_weights_from_ipc``), as a verl run syncs. After each sync the engine's greedy tokens must
equal, and its log-probs match, those of a fresh engine loaded from the synced model's checkpoint;
before the first sync they must differ from B's (else the comparison proves nothing). The sync's
extra memory must stay within the decoder layers one bucket reaches (it is done a layer at a
time), below the whole model's quantized weights; the figures are printed. On a GPU the quantized
layers' live tensors must also stay the same storage (CUDA graphs captured on them read the new
weights), and the GPU re-quantizer must equal the CPU one bit for bit.

The transport is verl's shared-memory path on both devices: CUDA IPC cannot open a handle in the
process that made it, and sender and engine share this process. Every check prints
``CHECK name: PASS|FAIL detail`` and the last line is ``CHECKS <json list>``; there is no skip: a
check that cannot run fails, naming what to install. Exit status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path

from suite.verl.install import INSTALL  # what a GPU node installs

# head_dim 32: served on CPU and GPU; 4 decoder layers of ~0.85 MB float32 each, so a 1 MB bucket
# reaches at most two of them and a layer-wise sync holds less than the whole model
VOCAB, HIDDEN, LAYERS, HEADS, FFN, MAX_LEN = 256, 64, 4, 2, 1024, 128
ROLLOUTS = ("int8", "fp8_per_channel", "w4a16")
W4_GROUP = 32  # the tiny model's 64-wide inputs hold two groups (vLLM needs the width a multiple of it)
LOGPROB_TOL = 1e-3  # synced vs fresh INT8 engine: the same weights and kernels (measured: 0 on vLLM CPU)
BUCKET_MB = 1  # several buckets: fused q/k/v and gate/up shards may land in different ones


class CheckFailed(Exception):
    pass


def tiny_checkpoint(root: Path, seed: int, rollouts: tuple[str, ...] = ("int8",)) -> dict[str, Path]:
    """A random Llama (``seed``) as a float32 HF checkpoint ``fp`` and its copy for each of ``rollouts``
    (W4A16 at group :data:`W4_GROUP`, symmetric)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from suite.verl.w8a8_checkpoint import write_w8a8_checkpoint

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=MAX_LEN,
                      tie_word_embeddings=False, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # far from uniform: linears x3 over the 0.02 init, norm gains in [0.5, 1.5]
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif "embed_tokens" not in name:
                p.mul_(3.0)
    fp = root / f"fp{seed}"
    model.save_pretrained(fp, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1", bos_token="t2",
                            unk_token="t0").save_pretrained(fp)
    return {"fp": fp, **{r: write_w8a8_checkpoint(fp, root / f"{r}_{seed}", r, W4_GROUP, True) for r in rollouts}}


def _engine(path: Path, device: str, **kw):
    from vllm import LLM

    extra = {"gpu_memory_utilization": 0.2} if device == "cuda" else {}
    # on a GPU CUDA graphs are captured (enforce_eager=False): the fold into the live tensors is what keeps them valid
    return LLM(model=str(path), dtype="bfloat16", max_model_len=MAX_LEN, enforce_eager=device != "cuda", seed=0,
               max_num_seqs=8, **extra, **kw)


def _rollouts(llm, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": p} for p in prompts],
                       SamplingParams(temperature=0.0, max_tokens=16, logprobs=0), use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids,
                                                                            o.outputs[0].logprobs)]) for o in out]


def _compare(got, want) -> float:
    """Largest |log-prob difference| where every token agrees; raises where a token differs."""
    worst = 0.0
    for i, ((tg, lg), (tw, lw)) in enumerate(zip(got, want)):
        if tg != tw:
            raise CheckFailed(f"prompt {i}: tokens {tg} after the sync, {tw} from a fresh load")
        worst = max([worst, *(abs(a - b) for a, b in zip(lg, lw))])
    return worst


def sync_weights(llm, weights: list, bucket_mb: int = BUCKET_MB) -> float:
    """One verl weight sync into ``llm`` (an engine in this process with the suite's worker extension):
    verl's sender in a thread, the engine's receiver here; returns the receiver's seconds."""
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    handle = f"ipc:///tmp/rl-colocate-zmq-{os.environ['VERL_RAY_JOB_ID']}-replica-0-rank-0.sock"
    errors: list[BaseException] = []

    def send():
        try:
            sender = BucketedWeightSender(handle, bucket_size_mb=bucket_mb, use_shm=True)
            asyncio.run(sender.async_send_weights(iter(weights)))
        except BaseException as exc:  # noqa: BLE001 (re-raised below: a dead sender would hang the receiver)
            errors.append(exc)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    start = time.perf_counter()
    llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True})
    seconds = time.perf_counter() - start
    t.join(120)
    if errors:
        raise errors[0]
    return seconds


def _live_pointers(llm, scheme: str) -> list[int]:
    def read(ext_self):
        from suite.verl.int8_hook import int8_layers, live_params

        return [t.data_ptr() for m in int8_layers(ext_self.model_runner.model, scheme)
                for t in live_params(m).values()]

    return llm.collective_rpc(read)[0]


def _kernel(llm, scheme: str) -> str:
    """The kernel class vLLM chose for the rollout's quantized linears."""
    def read(ext_self):
        from suite.verl.int8_hook import int8_layers, kernel_name

        layers = int8_layers(ext_self.model_runner.model, scheme)
        return kernel_name(layers[0].scheme) if layers else "none"

    return llm.collective_rpc(read)[0]


def check_platform(device: str) -> str:
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise CheckFailed("torch.cuda.is_available() is False: run on a GPU node (srun --gres=gpu:1 ...)")
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    from suite.hardware import cpu_features
    from suite.verl.rollout_quant import vllm_cpu_precisions

    features = cpu_features()
    if "int8" not in vllm_cpu_precisions(features):
        raise CheckFailed(f"vLLM's CPU build does not serve W8A8 INT8 on this CPU ({features.label()}): docs/verl.md")
    return f"CPU {features.label()}, torch {torch.__version__}"


def check_requant() -> str:
    """The GPU re-quantizers (int8, per-channel fp8, packed int4) equal the CPU ones bit for bit."""
    import torch

    from suite.verl.int8_hook import requantize_fp8, requantize_int8, requantize_w4a16

    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 512, generator=g).to(torch.bfloat16)
    name = "model.layers.0.mlp.up_proj.weight"
    quantizers = {"int8": requantize_int8, "fp8": requantize_fp8,
                  "w4a16": lambda x: requantize_w4a16(x, 128, True),
                  "w4a16 asym": lambda x: requantize_w4a16(x, 128, False)}
    for label, quantize in quantizers.items():
        gpu = dict(quantize([(name, w.cuda())]))
        cpu = dict(quantize([(name, w)]))
        for k, t in cpu.items():
            a, b = gpu[k].cpu(), t
            if a.dtype != b.dtype or not torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                                                     b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b):
                raise CheckFailed(f"GPU vs CPU {label} quantizer: {k} differs on {tuple(w.shape)}")
    return f"int8, fp8, w4a16 (sym, asym) codes and scales equal on {tuple(w.shape)}"


def check_vllm() -> str:
    try:
        import vllm
        import verl  # noqa: F401  (loads the suite's verl.plugins entry point)
    except ImportError as exc:
        raise CheckFailed(f"{exc}: install with {INSTALL}") from None
    return f"vllm {vllm.__version__}"


def check_sync(device: str, root: Path, rollout: str) -> str:
    from safetensors.torch import load_file

    from suite.verl.rollout_quant import ROLLOUTS_BY_NAME

    scheme = ROLLOUTS_BY_NAME[rollout].vllm_scheme
    os.environ["SUITE_ROLLOUT_QUANT"] = rollout
    os.environ["SUITE_W4_GROUP_SIZE"], os.environ["SUITE_W4_SYMMETRIC"] = str(W4_GROUP), "1"
    os.environ.setdefault("VERL_RAY_JOB_ID", "suite-sync-check-" + uuid.uuid4().hex[:8])
    import torch

    ck = {seed: tiny_checkpoint(root / rollout, seed, (rollout,)) for seed in (0, 1)}
    g = torch.Generator().manual_seed(7)
    prompts = [[2, *torch.randint(3, VOCAB, (9,), generator=g).tolist()] for _ in range(4)]
    want = {}
    for seed in (0, 1):  # fresh loads of each model's quantized checkpoint
        llm = _engine(ck[seed][rollout], device)
        want[seed] = _rollouts(llm, prompts)
        del llm
    if want[0] == want[1]:
        raise CheckFailed("models A and B roll out the same tokens and log-probs: the check could not tell them apart")
    llm = _engine(ck[0][rollout], device, worker_extension_cls="suite.verl.int8_hook.QuantizedWeightSyncExtension")
    if _compare(_rollouts(llm, prompts), want[0]) > LOGPROB_TOL:
        raise CheckFailed(f"two fresh engines of A's {rollout} checkpoint disagree: the comparison is not "
                          "deterministic")
    kernel = _kernel(llm, scheme)
    pointers = _live_pointers(llm, scheme) if device == "cuda" else []  # vLLM CPU repacks its weights (no graphs)
    parts, stats = [], []
    for seed in (1, 0, 1):  # B, back to A, B again
        weights = list(load_file(str(ck[seed]["fp"] / "model.safetensors")).items())
        seconds = sync_weights(llm, weights)
        stats.append(llm.collective_rpc("suite_sync_stats")[0])
        try:
            worst = _compare(_rollouts(llm, prompts), want[seed])
        except CheckFailed as exc:
            raise CheckFailed(f"after syncing model {'AB'[seed]}: {exc}") from None
        if worst > LOGPROB_TOL:
            raise CheckFailed(f"after syncing model {'AB'[seed]}: log-probs differ by up to {worst:.3g} "
                              f"from a fresh load (> {LOGPROB_TOL})")
        parts.append(f"{'AB'[seed]} {seconds:.2f} s, max |dlogp| {worst:.2g}")
    if device == "cuda" and _live_pointers(llm, scheme) != pointers:
        raise CheckFailed(f"a sync replaced the {scheme} layers' live tensors: CUDA graphs would read stale weights")
    memory = _check_memory(stats)
    n = sum(len(t) for t, _ in want[1])
    return (f"{kernel}; syncs {'; '.join(parts)}; {n} tokens each equal a fresh {rollout} load; {memory}"
            + ("; live tensors kept" if device == "cuda" else ""))


def _check_memory(stats: list[dict]) -> str:
    """The layer-wise sync's bound: the quantized weights it held at once are at most the two decoder
    layers one bucket can reach (BUCKET_MB < two layers' float32 weights), less than the model's."""
    s = max(stats, key=lambda x: x["peak_staged_bytes"])
    bound = 2 * s["layer_bytes_max"]
    if not s["peak_staged_bytes"] or s["peak_staged_bytes"] > bound or s["peak_staged_bytes"] >= s["model_bytes"]:
        raise CheckFailed(f"a sync held {s['peak_staged_bytes']} B of staged weights at once: not within two decoder "
                          f"layers ({bound} B) and below the model's {s['model_bytes']} B")
    peak = max(x["peak_extra_bytes"] for x in stats)
    kind = "allocated" if s["device"] == "cuda" else "resident"
    return (f"staged at most {s['peak_staged_bytes'] / 1024:.0f} KiB at once (one decoder layer "
            f"{s['layer_bytes_max'] / 1024:.0f} KiB, the model's {s['layers']} layers {s['model_bytes'] / 1024:.0f} "
            f"KiB); peak {kind} memory over a sync +{peak / 2**20:.1f} MiB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.verl.sync_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--rollouts", default=",".join(ROLLOUTS),
                   help=f"comma-separated, of {', '.join(ROLLOUTS)} (default: all)")
    args = p.parse_args(argv)
    rollouts = [r for r in args.rollouts.split(",") if r]
    unknown = [r for r in rollouts if r not in ROLLOUTS]
    if unknown or not rollouts:
        p.error(f"--rollouts {args.rollouts!r}: allowed: {', '.join(ROLLOUTS)}")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: our objects reach it
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.device == "cpu":  # verl's CPU platform (suite.verl.cpu_workarounds), as a verl run on CPU has it
        os.environ["SUITE_VERL_CPU"] = "1"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    results: list[tuple[str, str, str]] = []

    def check(name, fn, *a) -> bool:
        t = time.time()
        try:
            results.append((name, "PASS", f"{fn(*a)} ({time.time() - t:.1f} s)"))
        except Exception as exc:  # noqa: BLE001 - report every failure, then stop
            if not isinstance(exc, CheckFailed):
                traceback.print_exc()
            results.append((name, "FAIL", f"{type(exc).__name__}: {exc}"))
        print(f"CHECK {name}: {results[-1][1]} {results[-1][2]}", flush=True)
        return results[-1][1] == "PASS"

    ok = check("platform", check_platform, args.device)
    if ok and args.device == "cuda":
        ok = check("requant", check_requant)
    ok = ok and check("vllm", check_vllm)
    if ok and args.device == "cpu":
        from suite.verl.cpu_workarounds import register

        register()
    with tempfile.TemporaryDirectory(prefix="suite_sync_check_") as tmp:
        for rollout in rollouts:  # each rollout checked even when an earlier one failed
            if ok:
                check(f"sync-{rollout}", check_sync, args.device, Path(tmp), rollout)
    print("CHECKS " + json.dumps([{"name": n, "status": s, "detail": d} for n, s, d in results]), flush=True)
    return 0 if ok and all(s == "PASS" for _, s, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
