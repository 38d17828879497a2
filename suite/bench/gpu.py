"""GPU section of the benchmarks: INT8 and FP8 GEMMs against bf16 at 7B / 32B linear shapes.

One prepared script, runnable standalone with torch alone (no other suite import) and a
time limit, on any machine with a CUDA GPU:

    python suite/bench/gpu.py --time-limit 240 [--json] [--out DIR]
    suite bench gpu                   # the same, plus the MLflow run of every `suite bench`

For the linear layers of one decoder block of Qwen2.5-7B and Qwen2.5-32B (fused qkv, o,
fused gate_up, down; x [M, K] @ W^T [K, N]) at decode batch sizes M, it times

    bf16        F.linear in bfloat16 (the papers' BF16 rollout baseline)
    int8mm      torch._int_mm alone, int8 x int8 -> int32 (the GEMM, no epilogue)
    int8        the same, then the per-token x per-channel rescale to bf16 (W8A8, QuRL / vLLM
                layout; unfused: PyTorch has no scaled int8 GEMM)
    int8+q      the same plus the dynamic per-token quantization of the bf16 activations
    fp8         torch._scaled_mm, E4M3 x E4M3 with row-wise scales, bf16 output (W8A8-FP8)
    fp8t        the same with one scale per tensor (the classic cuBLASLt FP8 path)
    fp8+q       row-wise fp8 plus the per-token E4M3 quantization of the activations

interleaved, median of repeats, each call replayed from a CUDA graph (as vLLM decodes) and
cycling through enough copies of the weights that they do not stay in L2 (each layer of a
real model has its own weights). Activation quantization here is a few unfused PyTorch
kernels; serving engines fuse it into the preceding kernel, so "+q" is a pessimistic bound.

From the block's summed linear times it reports the linear-layer speed-up s over bf16 (an
upper bound of the rollout speed-up: attention, sampling and the rest do not get faster) and
the share f of rollout time the linears would need to have for the paper's end-to-end
speed-up S (QuRL: +20-30 % for 7B, +70-90 % for 32B on H100): ``S = 1 / ((1 - f) + f / s)``
gives ``f = (1 - 1/S) / (1 - 1/s)``; f > 1 means s alone cannot explain S.

On a machine without CUDA it says "no CUDA device" and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

# Linear shapes (K = in, N = out) of one decoder block, from the models' config.json:
# Qwen2.5-7B: hidden 3584, intermediate 18944, 28 heads / 4 KV heads of 128, 28 layers.
# Qwen2.5-32B: hidden 5120, intermediate 27648, 40 heads / 8 KV heads of 128, 64 layers.
MODELS = {
    "7B": dict(hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128, layers=28),
    "32B": dict(hidden=5120, intermediate=27648, heads=40, kv_heads=8, head_dim=128, layers=64),
}
# QuRL's rollout speed-ups on H100 (arXiv 2602.13953, INT8 rollout vs BF16), as (low, high) fractions.
PAPER_SPEEDUP = {"7B": (1.20, 1.30), "32B": (1.70, 1.90)}
BATCHES = (32, 64, 128, 256, 512, 1024)  # decode batch sizes M (cuBLAS int8 needs M > 16)
VARIANTS = ("bf16", "int8mm", "int8", "int8+q", "fp8", "fp8t", "fp8+q")
L2_FLUSH_BYTES = 256 << 20  # weight copies cycled per variant: > 4x the H100/H200 L2 (50-60 MB)
COLUMNS = ("model", "layer", "M", "K", "N", "bf16_us", "int8mm_us", "int8_us", "int8+q_us", "fp8_us", "fp8t_us",
           "fp8+q_us", "int8mm_speedup", "int8_speedup", "fp8_speedup", "fp8t_speedup", "bf16_tflops", "bf16_TBps")
NO_CUDA = "no CUDA device"


def block_shapes(model: str) -> dict[str, tuple[int, int]]:
    """{layer: (K, N)} of one decoder block's linears (q, k, v fused; gate, up fused)."""
    c = MODELS[model]
    qkv = (c["heads"] + 2 * c["kv_heads"]) * c["head_dim"]
    return {"qkv": (c["hidden"], qkv), "o": (c["heads"] * c["head_dim"], c["hidden"]),
            "gate_up": (c["hidden"], 2 * c["intermediate"]), "down": (c["intermediate"], c["hidden"])}


def amdahl(f: float, s: float) -> float:
    """End-to-end speed-up when a share ``f`` of the time gets ``s`` times faster."""
    return 1.0 / ((1.0 - f) + f / s)


def required_share(S: float, s: float) -> float:
    """The share f of time that must speed up by ``s`` for an end-to-end speed-up ``S``
    (inverse of :func:`amdahl`); inf when s <= 1 (no share suffices)."""
    if s <= 1.0:
        return math.inf
    return (1.0 - 1.0 / S) / (1.0 - 1.0 / s)


# ----------------------------------------------------------------------------- CUDA timing


def _quant_int8(x, torch):
    """Per-token symmetric int8: codes [M, K] int8, scales [M, 1] float32."""
    s = x.abs().amax(-1, keepdim=True).float().clamp_(min=1e-12) / 127.0  # [M, 1]
    return torch.round(x.float() / s).clamp_(-127, 127).to(torch.int8), s


def _quant_fp8(x, torch):
    """Per-token E4M3: codes [M, K] float8_e4m3fn, scales [M, 1] float32."""
    s = x.abs().amax(-1, keepdim=True).float().clamp_(min=1e-12) / 448.0  # [M, 1]
    return (x.float() / s).clamp_(-448.0, 448.0).to(torch.float8_e4m3fn), s


def _variants(M: int, K: int, N: int, torch, F):
    """{variant: a no-argument callable doing one x @ W^T} with weight copies to defeat L2."""
    dev = "cuda"
    copies = max(2, math.ceil(L2_FLUSH_BYTES / (K * N * 2)))
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]  # [N, K]
    # int8 / fp8 weights, per output channel; .t() of a row-major [N, K] is the column-major
    # [K, N] operand cuBLAS wants.
    wq8, ws8, wf8, wsf = [], [], [], []
    for wi in w:
        q, s = _quant_int8(wi, torch)
        wq8.append(q)
        ws8.append(s.view(1, -1))  # [1, N]
        q, s = _quant_fp8(wi, torch)
        wf8.append(q)
        wsf.append(s.view(1, -1).contiguous())  # [1, N]
    xq8, xs8 = _quant_int8(x, torch)
    xf8, xsf = _quant_fp8(x, torch)
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % copies
        return state["i"]

    def bf16():
        return F.linear(x, w[nxt()])

    def int8mm():
        return torch._int_mm(xq8, wq8[nxt()].t())

    one = torch.ones((), device=dev)

    def fp8t():
        i = nxt()
        return torch._scaled_mm(xf8, wf8[i].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    def int8():
        i = nxt()
        return (torch._int_mm(xq8, wq8[i].t()).float() * xs8 * ws8[i]).to(torch.bfloat16)

    def int8q():
        i = nxt()
        q, s = _quant_int8(x, torch)
        return (torch._int_mm(q, wq8[i].t()).float() * s * ws8[i]).to(torch.bfloat16)

    def fp8():
        i = nxt()
        return torch._scaled_mm(xf8, wf8[i].t(), scale_a=xsf, scale_b=wsf[i], out_dtype=torch.bfloat16)

    def fp8q():
        i = nxt()
        q, s = _quant_fp8(x, torch)
        return torch._scaled_mm(q, wf8[i].t(), scale_a=s, scale_b=wsf[i], out_dtype=torch.bfloat16)

    return {"bf16": bf16, "int8mm": int8mm, "int8": int8, "int8+q": int8q, "fp8": fp8, "fp8t": fp8t,
            "fp8+q": fp8q}, copies


def _graph(fn, calls: int, torch):
    """A replayable CUDA graph of ``calls`` calls of ``fn`` (eager fallback if capture fails)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        return g.replay, True
    except Exception:  # noqa: BLE001 - a kernel that cannot be captured: time it eagerly
        torch.cuda.synchronize()

        def eager():
            for _ in range(calls):
                fn()

        return eager, False


def time_shape(M: int, K: int, N: int, *, repeats: int, calls: int) -> tuple[dict[str, float], bool]:
    """Median microseconds per call of each variant, interleaved rounds, CUDA events."""
    import torch
    import torch.nn.functional as F

    fns, _ = _variants(M, K, N, torch, F)
    runners, graphed = {}, True
    for name, fn in fns.items():
        runners[name], ok = _graph(fn, calls, torch)
        graphed &= ok
    times = {name: [] for name in runners}
    names = list(runners)
    for name in names:  # warm-up replay
        runners[name]()
    torch.cuda.synchronize()
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            runners[name]()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b) * 1e3 / calls)  # ms -> us per call
    return {n: statistics.median(v) for n, v in times.items()}, graphed


def check_kernels() -> None:
    """Correctness first: the int8 and fp8 paths reproduce the dequantized reference."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    q, s = _quant_int8(x, torch)
    wq, ws = _quant_int8(w, torch)
    got = torch._int_mm(q, wq.t()).float() * s * ws.view(1, -1)
    want = (q.float() * s) @ (wq.float() * ws).t()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)
    q, s = _quant_fp8(x, torch)
    wq, ws = _quant_fp8(w, torch)
    # Row-wise scaled fp8 GEMMs output bf16 (sm90): half a bf16 ulp (2**-9 relative) of rounding.
    got = torch._scaled_mm(q, wq.t(), scale_a=s, scale_b=ws.view(1, -1).contiguous(), out_dtype=torch.bfloat16)
    want = (q.float() * s) @ (wq.float() * ws).t()
    torch.testing.assert_close(got.float(), want, rtol=4e-3, atol=1e-2)


def run_gpu(*, models=tuple(MODELS), batches=BATCHES, repeats: int = 7, calls: int = 20,
            time_limit_s: float = 240.0, log=print) -> tuple[list[dict], list[dict], dict]:
    """(per-layer rows, per-model summary rows, info). Stops adding shapes once the time limit
    is reached (the rows measured so far are kept and the summary says what is missing)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(NO_CUDA)
    t0 = time.perf_counter()
    check_kernels()
    info = {"gpu": torch.cuda.get_device_name(0), "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "torch": torch.__version__, "cuda": torch.version.cuda, "repeats": repeats, "calls_per_graph": calls,
            "graphed": True, "complete": True}
    rows: list[dict] = []
    for model in models:
        for M in batches:
            for layer, (K, N) in block_shapes(model).items():
                if time.perf_counter() - t0 > time_limit_s:
                    info["complete"] = False
                    break
                try:
                    us, graphed = time_shape(M, K, N, repeats=repeats, calls=calls)
                except Exception as exc:  # noqa: BLE001 - keep the other shapes; say what failed
                    info.setdefault("errors", []).append(f"{model} M={M} {layer}: {type(exc).__name__}: {exc}")
                    log(f"  {model} M={M} {layer}: FAILED {type(exc).__name__}: {exc}")
                    continue
                info["graphed"] &= graphed
                row = {"model": model, "layer": layer, "M": M, "K": K, "N": N}
                row.update({f"{v}_us": us[v] for v in VARIANTS})
                row.update({f"{v}_speedup": us["bf16"] / us[v] for v in VARIANTS if v != "bf16"})
                row["bf16_tflops"] = 2 * M * K * N / (us["bf16"] * 1e-6) / 1e12
                row["bf16_TBps"] = 2 * (M * K + K * N + M * N) / (us["bf16"] * 1e-6) / 1e12  # bytes moved
                rows.append(row)
                log(f"  {model} M={M} {layer} [{K}x{N}]: " + " ".join(f"{v} {us[v]:.1f}us" for v in VARIANTS))
    summary = []
    for model in models:
        for M in batches:
            sel = [r for r in rows if r["model"] == model and r["M"] == M]
            if len(sel) < 4:
                continue
            tot = {v: sum(r[f"{v}_us"] for r in sel) for v in VARIANTS}
            row = {"model": model, "M": M, "block_linears_bf16_us": tot["bf16"],
                   "linear_tokens_per_s_bf16": M / (MODELS[model]["layers"] * tot["bf16"] * 1e-6)}
            lo, hi = PAPER_SPEEDUP[model]
            for v in VARIANTS[1:]:
                s = tot["bf16"] / tot[v]
                row[f"{v}_speedup"] = s
                # The linear share needed to explain the paper's range with this linear speed-up.
                row[f"{v}_share_for_paper"] = f"{required_share(lo, s):.2f}-{required_share(hi, s):.2f}"
            summary.append(row)
    info["elapsed_s"] = time.perf_counter() - t0
    return rows, summary, info


SUMMARY_COLUMNS = ("model", "M", "block_linears_bf16_us", "int8mm_speedup", "int8_speedup", "int8+q_speedup",
                   "fp8_speedup", "fp8t_speedup", "fp8+q_speedup", "int8mm_share_for_paper", "fp8_share_for_paper",
                   "fp8t_share_for_paper", "linear_tokens_per_s_bf16")


def _md(rows, columns) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(fmt(r.get(c, "-")) for c in columns) + " |" for r in rows]
    return "\n".join(out)


def report(rows, summary, info) -> str:
    lines = [f"# GPU GEMMs: {info['gpu']} (sm {info['capability']}), torch {info['torch']}, CUDA {info['cuda']}; "
             f"median of {info['repeats']} rounds x {info['calls_per_graph']} calls"
             f"{' (CUDA graphs)' if info['graphed'] else ' (some eager: graph capture failed)'}"
             f"{'' if info['complete'] else '; TIME LIMIT REACHED, shapes missing'}", "",
             "## Per decoder block (sum of the four linears): speed-up over bf16", "",
             _md(summary, SUMMARY_COLUMNS), "",
             "*_share_for_paper: share of rollout time the linears must have for the paper's speed-up "
             "(7B: 1.2-1.3x, 32B: 1.7-1.9x) given this linear speed-up; > 1 = not reachable by the linears alone.",
             "", "## Per layer (microseconds per call)", "", _md(rows, COLUMNS)]
    lines += [f"ERROR {e}" for e in info.get("errors", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_args(p)
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of the tables")
    p.add_argument("--out", default=None, help="directory for gpu.json and gpu.md")
    args = p.parse_args(argv)
    return _run_standalone(args)


def _add_args(p) -> None:
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    p.add_argument("--batch", default=",".join(map(str, BATCHES)), help="decode batch sizes M (> 16)")
    p.add_argument("--gpu-repeats", type=int, default=7, help="timed rounds per variant (median)")
    p.add_argument("--calls", type=int, default=20, help="calls per CUDA-graph replay")
    p.add_argument("--time-limit", type=float, default=240.0, help="seconds; no new shape is started after it")


def _parse(args) -> tuple[list[str], list[int]]:
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            raise ValueError(f"--models={m!r} is not allowed; choose from: {', '.join(MODELS)}")
    try:
        batches = [int(b) for b in args.batch.split(",") if b]
    except ValueError:
        raise ValueError(f"--batch={args.batch!r}: comma-separated integers") from None
    for b in batches:
        if b <= 16:
            raise ValueError(f"--batch={b}: must be > 16 (cuBLAS int8 GEMMs need M > 16)")
    return models, batches


def _run_standalone(args) -> int:
    try:
        models, batches = _parse(args)
    except ValueError as exc:
        print(f"gpu.py: {exc}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print(f"{NO_CUDA}: torch.cuda.is_available() is False (torch {torch.__version__}); "
              "the GPU section needs an NVIDIA GPU. Nothing measured.", file=sys.stderr)
        if getattr(args, "json", False):
            print("[]")
        return 0
    rows, summary, info = run_gpu(models=models, batches=batches, repeats=args.gpu_repeats, calls=args.calls,
                                  time_limit_s=args.time_limit, log=lambda m: print(m, file=sys.stderr, flush=True))
    text = report(rows, summary, info)
    if getattr(args, "json", False):
        print(json.dumps({"info": info, "summary": summary, "rows": rows}, indent=1))
    else:
        print(text, end="")
    out = getattr(args, "out", None)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gpu.json"), "w") as fh:
            json.dump({"info": info, "summary": summary, "rows": rows}, fh, indent=1)
        with open(os.path.join(out, "gpu.md"), "w") as fh:
            fh.write(text)
    return 0


# ----------------------------------------------------------------------------- `suite bench gpu`


def register(sub) -> None:
    p = sub.add_parser("gpu", help="INT8 / FP8 GEMM throughput vs bf16 at 7B / 32B shapes (needs CUDA)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_args(p)
    from suite.bench.common import add_common_args

    add_common_args(p)
    p.set_defaults(func=cmd_gpu)


def cmd_gpu(args) -> int:
    from suite.bench.common import emit, machine_info, note

    try:
        models, batches = _parse(args)
    except ValueError as exc:
        note(f"suite bench gpu: {exc}")
        return 2
    import torch

    if not torch.cuda.is_available():
        note(f"suite bench gpu: {NO_CUDA} (torch.cuda.is_available() is False, torch {torch.__version__}): "
             "the GPU section needs an NVIDIA GPU; nothing measured. On a GPU machine run "
             "`python suite/bench/gpu.py --time-limit 240` (torch alone) or `suite bench gpu`.")
        if args.json:
            print("[]")
        return 0
    rows, summary, ginfo = run_gpu(models=models, batches=batches, repeats=args.gpu_repeats, calls=args.calls,
                                   time_limit_s=args.time_limit, log=note)
    info = {**machine_info(), **{f"gpu_{k}": v for k, v in ginfo.items()}}
    metrics = {f"gpu/{r['model']}/M{r['M']}/{v.replace('+', '_')}_speedup": r[f"{v}_speedup"]
               for r in summary for v in VARIANTS[1:]}
    emit(args, "gpu", "gpu", info, summary + rows, SUMMARY_COLUMNS, [report(rows, summary, ginfo)],
         {"models": args.models, "batch": args.batch}, metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
