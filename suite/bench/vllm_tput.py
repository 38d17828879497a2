"""One precision of `suite bench vllm`, in a process of its own (a fresh engine and device context).

Run by the environment that has vLLM (its CPU build, or the `gpu` extra on a GPU node), with the
suite importable (for the weight sync: suite.verl.int8_hook and verl's sender):

    python -m suite.bench.vllm_tput --model DIR --rollout int8 --prompts 256 --prompt-len 512 \
        --response-len 512 --device cuda

DIR holds a model's ``config.json`` (with the rollout's compressed-tensors ``quantization_config``);
the weights are vLLM's dummy ones (``load_format=dummy``: nothing to download), the prompts random
token ids (no tokenizer). Measured, in this order:

- start-up: seconds of the ``LLM(...)`` constructor (load, kernel set-up, CUDA graph capture);
- prefill: the median seconds of ``generate`` with one new token per prompt, over ``--repeats``;
- rollout: the median seconds of ``generate`` with exactly ``--response-len`` new tokens per prompt
  (``ignore_eos``), over ``--repeats``; decode = rollout - prefill;
- sync: the median seconds of ``--sync-steps`` weight syncs of random full-precision weights of the
  model's shape through verl's sender and the suite's worker extension, as a verl step syncs (over
  shared memory: a GPU run of verl uses CUDA IPC, so on a GPU this over-states the transport);
- profile (``--profile``): time by kernel group (GEMM, attention, quantization, other) of one
  ``generate`` call, from torch's profiler.

Prints one line ``@@suite {json}`` (the row); everything else vLLM prints is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid

MARK = "@@suite "
SEED = 0
# kernel names -> group, first match wins (lower case): what a decode step's time goes to
PROFILE_GROUPS = (
    ("quantization", ("quant", "scaled_fp8", "per_token")),
    ("gemm", ("gemm", "matmul", "mm_", "cutlass", "marlin", "machete", "sm90", "onednn", "linear", "addmm", "wna16",
              "int8_scaled_mm", "_mm")),
    ("attention", ("attn", "attention", "flash", "paged", "rotary", "rope")),
)


def group_of(kernel: str) -> str:
    name = kernel.lower()
    for group, keys in PROFILE_GROUPS:
        if any(k in name for k in keys):
            return group
    return "other"


def linear_kernels(worker) -> list[str]:
    """The kernel classes of the model's block linears (a quantized scheme's kernel, else the 16-bit
    linear method), read inside the worker (``collective_rpc``)."""
    from suite.verl.int8_hook import kernel_name

    model = worker.model_runner.model
    names = {kernel_name(m.scheme) for m in model.modules() if getattr(m, "scheme", None) is not None}
    if not names:
        names = {type(m.quant_method).__name__ for n, m in model.named_modules()
                 if ".layers." in n and n.endswith("_proj") and hasattr(m, "quant_method")}
    return sorted(names)


def hf_weight_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of a Llama / Qwen2 checkpoint of ``config``, in state-dict order."""
    h, f, n = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    d = config.get("head_dim") or h // heads
    bias = config.get("model_type") == "qwen2"  # Qwen2's q / k / v projections carry biases
    out = [("model.embed_tokens.weight", (config["vocab_size"], h))]
    for i in range(n):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (heads * d, h)), (p + "self_attn.k_proj.weight", (kv * d, h)),
                (p + "self_attn.v_proj.weight", (kv * d, h))]
        if bias:
            out += [(p + "self_attn.q_proj.bias", (heads * d,)), (p + "self_attn.k_proj.bias", (kv * d,)),
                    (p + "self_attn.v_proj.bias", (kv * d,))]
        out += [(p + "self_attn.o_proj.weight", (h, heads * d)), (p + "mlp.gate_proj.weight", (f, h)),
                (p + "mlp.up_proj.weight", (f, h)), (p + "mlp.down_proj.weight", (h, f)),
                (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out += [("model.norm.weight", (config["hidden_size"],))]
    if not config.get("tie_word_embeddings", False):
        out += [("lm_head.weight", (config["vocab_size"], h))]
    return out


def random_weights(config: dict, device: str, seed: int):
    """Random bf16 weights of the model's shape, made one tensor at a time (the sender buckets them),
    so the host never holds a second model."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    for name, shape in hf_weight_shapes(config):
        t = torch.randn(shape, generator=g, device=device, dtype=torch.float32).mul_(0.02).to(torch.bfloat16)
        yield name, (t.add_(1.0) if name.endswith("norm.weight") else t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--rollout", required=True, help="bf16 | int8 | fp8_per_channel | w4a16 (suite.verl.rollout_quant)")
    p.add_argument("--prompts", type=int, required=True)
    p.add_argument("--prompt-len", type=int, required=True)
    p.add_argument("--response-len", type=int, required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sync-steps", type=int, default=2)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--bucket-mb", type=int, default=2048, help="verl's update_weights_bucket_megabytes (its default)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)

    # the engine in this process: the sync's receiver and the timed calls reach it directly
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VERL_RAY_JOB_ID", "suite-bench-" + uuid.uuid4().hex[:8])
    os.environ["SUITE_W4_GROUP_SIZE"], os.environ["SUITE_W4_SYMMETRIC"] = str(args.group_size), "1"
    if args.rollout != "bf16":
        os.environ["SUITE_ROLLOUT_QUANT"] = args.rollout
    if args.device == "cpu":
        os.environ["SUITE_VERL_CPU"] = "1"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if args.device == "cpu":
        from suite.verl.cpu_workarounds import register

        register()
    import suite.verl.int8_hook  # noqa: F401  (keeps W4A16 on 16-bit activations on vLLM CPU's AMX)
    from suite.verl.sync_check import sync_weights

    with open(os.path.join(args.model, "config.json")) as fh:
        config = json.load(fh)
    cuda = args.device == "cuda"
    extra = {"gpu_memory_utilization": args.gpu_memory_utilization} if cuda else {}
    t0 = time.perf_counter()
    llm = LLM(model=args.model, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=SEED,
              max_model_len=args.prompt_len + args.response_len, max_num_seqs=args.prompts,
              enable_prefix_caching=False, enforce_eager=not cuda,
              worker_extension_cls="suite.verl.int8_hook.QuantizedWeightSyncExtension", **extra)
    startup = time.perf_counter() - t0
    kernels = llm.collective_rpc(linear_kernels)[0]
    g = torch.Generator().manual_seed(SEED)
    vocab = config["vocab_size"]
    prompts = [TokensPrompt(prompt_token_ids=torch.randint(10, vocab - 10, (args.prompt_len,), generator=g).tolist())
               for _ in range(args.prompts)]

    def generate(n_tokens: int, batch=prompts) -> float:
        sp = SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True, detokenize=False)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        outs = llm.generate(batch, sp, use_tqdm=False)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        got = sum(len(o.outputs[0].token_ids) for o in outs)
        if got != n_tokens * len(batch):
            raise RuntimeError(f"generated {got} tokens, asked for {n_tokens * len(batch)}")
        return seconds

    generate(min(16, args.response_len), prompts[: min(8, len(prompts))])  # warm-up: lazy init, autotuning
    prefill = statistics.median(generate(1) for _ in range(args.repeats))
    rollout = statistics.median(generate(args.response_len) for _ in range(args.repeats))
    syncs = []
    for step in range(args.sync_steps):
        syncs.append(sync_weights(llm, random_weights(config, args.device, SEED + step), bucket_mb=args.bucket_mb))
    stats = llm.collective_rpc("suite_sync_stats")[0] or {}
    profile = {}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with torch_profile(activities=acts) as prof:
            generate(min(args.response_len, 64))
        times: dict[str, float] = {}
        for e in prof.key_averages():
            t = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6
            times[group_of(e.key)] = times.get(group_of(e.key), 0.0) + t
        total = sum(times.values()) or 1.0
        profile = {k: round(100 * v / total, 1) for k, v in sorted(times.items())}
    n, L, R = args.prompts, args.prompt_len, args.response_len
    decode = max(rollout - prefill, 1e-9)
    row = {
        "rollout": args.rollout, "kernels": ",".join(kernels) or "-", "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if cuda else "", "vllm": vllm.__version__, "torch": torch.__version__,
        "cuda": torch.version.cuda or "", "prompts": n, "prompt_len": L, "response_len": R,
        "startup_s": startup, "prefill_s": prefill, "rollout_s": rollout, "decode_s": decode,
        "prefill_tok_s": n * L / prefill, "decode_tok_s": n * (R - 1) / decode if R > 1 else float("nan"),
        "rollout_tok_s": n * R / rollout,
        "sync_s": statistics.median(syncs) if syncs else float("nan"),
        "sync_peak_extra_mib": stats.get("peak_extra_bytes", float("nan")) / 2**20 if stats else float("nan"),
        "sync_staged_mib": stats.get("peak_staged_bytes", 0) / 2**20 if stats else float("nan"),
        "profile": profile,
    }
    print(MARK + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
