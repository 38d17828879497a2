"""`suite bench rollout`: tokens/s of batched decode per rollout precision, and weight-sync cost.

For every model preset x batch size x new tokens, one full-precision model is built and one
RolloutEngine per precision copies it; the engines' `generate` calls are timed interleaved
(suite.bench.common.interleaved) and each precision's tokens/s is divided by fp32's and
bf16's measured in the same rounds. A call is what `timing_s/gen` times in an RL step:
prefill of the prompts plus `new_tokens` decode steps (the stop id is never sampled, so every
row decodes exactly `new_tokens` tokens), sampling at temperature 1 as RL rollouts do.

The weight sync (re-quantizing the engine's copy from the full-precision weights, what every
RL step pays before its rollout) is timed the same way per precision and model.

`--profile` adds where one generate call spends its time (torch profiler, self CPU time by
operator group) per precision, for the largest batch: it shows what bounds a ratio.
"""

from __future__ import annotations

import argparse
import os

from suite.bench.common import (
    BenchError,
    add_common_args,
    check_common,
    emit,
    interleaved,
    machine_info,
    median,
    note,
    parse_ints,
    parse_list,
    set_threads,
    spread,
)

COLUMNS = ("model", "d_model", "batch", "new_tokens", "precision", "path", "tokens_per_s", "ratio_vs_fp32",
           "ratio_vs_bf16", "gen_s", "spread", "sync_ms", "sync_pct_of_gen")
PROFILE_COLUMNS = ("model", "batch", "precision", "path", "gemm", "attention", "act_quant", "sampling", "other",
                   "total_s", "aten_calls")


def register(sub) -> None:
    p = sub.add_parser("rollout", help="decode tokens/s per precision x model x batch, and weight-sync time",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="small,wide", help="model presets, comma-separated (default small,wide)")
    p.add_argument("--precisions", default=None, help="rollout precisions (default: every registered one)")
    p.add_argument("--batch", default="8,64", help="sequences decoded at once, comma-separated (default 8,64)")
    p.add_argument("--new-tokens", default="32", help="tokens decoded per sequence, comma-separated (default 32)")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per sequence (default 16)")
    p.add_argument("--kernels", default="auto", help="engine kernels: auto | native | emulated (default auto)")
    p.add_argument("--int8-gemms", default="",
                   help="also time int8 with each of these integer GEMMs forced, side by side, comma-separated: "
                        "int_mm (torch._int_mm: oneDNN) | packed (the suite's exact AVX2 kernel) | float32 "
                        "(the emulation); rows int8/<gemm> (default: none)")
    p.add_argument("--unfused", action="store_true",
                   help="also time int8 with its unfused W8A8 path (where the fused one runs), side by side")
    p.add_argument("--python-loop", action="store_true",
                   help="also time each precision whose decode step runs its layer loop in C++ with the Python "
                        "loop instead (the same numbers), side by side")
    p.add_argument("--profile", action="store_true",
                   help="also profile one generate call per precision (largest batch): time by operator group")
    add_common_args(p)
    p.set_defaults(func=cmd_rollout)


def bench_model(preset: str, seed: int = 0, gain: float = 1.0):
    """A randomly initialised preset model (character vocabulary), weights times ``gain``
    (norm gains excepted). gain > 1 makes the logits peaked, so greedy decoding has no near
    ties that rounding differences between implementations could flip."""
    import torch

    from suite.embedded.model import PRESETS, ModelConfig, Transformer
    from suite.embedded.tokenizer import CharTokenizer

    torch.manual_seed(seed)
    m = Transformer(ModelConfig(vocab_size=CharTokenizer().vocab_size, **PRESETS[preset]))
    if gain != 1.0:
        with torch.no_grad():
            for name, p in m.named_parameters():
                if not name.endswith("norm.weight"):
                    p.mul_(gain)
    return m.eval()


def bench_prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """``batch`` distinct random prompts of ``length`` tokens (ids 3.., clear of pad/eos/bos)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=g).tolist()


def _check(args) -> tuple[list[str], list[str], list[int], list[int]]:
    from suite.core.quant import PRECISIONS  # the quantizer registry (torch: not at `suite -h` time)
    from suite.embedded.engine import KERNELS
    from suite.embedded.model import PRESETS

    check_common(args)
    models = parse_list("--models", args.models, tuple(PRESETS))
    args.precisions = args.precisions or ",".join(PRECISIONS)
    precisions = parse_list("--precisions", args.precisions, PRECISIONS)
    batches = parse_ints("--batch", args.batch)
    new_tokens = parse_ints("--new-tokens", args.new_tokens)
    if args.prompt_len < 1:
        raise BenchError(f"--prompt-len={args.prompt_len} must be >= 1")
    if args.kernels not in KERNELS:
        raise BenchError(f"--kernels={args.kernels!r} is not allowed; choose from: {', '.join(KERNELS)}")
    from suite.embedded.qlinear import INT8_GEMMS

    args.int8_gemms = parse_list("--int8-gemms", args.int8_gemms, INT8_GEMMS) if args.int8_gemms else []
    for m in models:
        if args.prompt_len + max(new_tokens) > PRESETS[m]["max_seq_len"]:
            raise BenchError(f"--prompt-len + --new-tokens = {args.prompt_len + max(new_tokens)} > max_seq_len "
                             f"{PRESETS[m]['max_seq_len']} of model {m}")
    return models, precisions, batches, new_tokens


# Operator groups of the profile (aten op names, self CPU time).
_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::_int_mm", "aten::_scaled_mm", "aten::linear",
             "suite_fused::int_mm_packed")  # the packed GEMM, also where mm_rescale runs it (a child record)
_ATTN_OPS = ("aten::bmm", "aten::baddbmm", "aten::_softmax", "aten::masked_fill", "aten::masked_fill_")
_QUANT_OPS = ("aten::round", "aten::round_", "aten::clamp", "aten::clamp_", "aten::aminmax", "aten::maximum",
              "aten::div", "aten::where", "aten::_to_copy", "aten::copy_",
              "suite_fused::quant_rows", "suite_fused::mm_rescale")  # the fused loops (self time: no GEMM)
_SAMPLE_OPS = ("aten::multinomial", "aten::_log_softmax", "aten::exp", "aten::exponential_", "aten::gather",
               "aten::argmax", "aten::sort", "aten::cumsum", "aten::scatter")


# torch 2.13's profiler backend (kineto) writes a `USDT:... profiler_start` / `profiler_stop` line to
# stderr at every profile, at its highest log level. KINETO_LOG_LEVEL is kineto's threshold, read
# when the profiler first starts in a process (PyTorch's own benchmarks/dynamo/common.py sets it to
# quiet the profiler the same way); 6 is above every level, USDT's included. A value the user set wins.
KINETO_QUIET_LEVEL = "6"


def op_shares(fn) -> dict[str, float]:
    """Run ``fn`` once under the torch profiler: the share of self CPU time in GEMMs,
    attention, activation quantization / casts, sampling, and everything else, the total
    self CPU seconds and the number of aten operator calls."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    groups = {"gemm": 0.0, "attention": 0.0, "act_quant": 0.0, "sampling": 0.0, "other": 0.0}
    total, calls = 0.0, 0
    for ev in prof.key_averages():
        t = ev.self_cpu_time_total / 1e6
        total += t
        calls += ev.count
        if ev.key in _GEMM_OPS:
            groups["gemm"] += t
        elif ev.key in _ATTN_OPS:
            groups["attention"] += t
        elif ev.key in _QUANT_OPS:
            groups["act_quant"] += t
        elif ev.key in _SAMPLE_OPS:
            groups["sampling"] += t
        else:
            groups["other"] += t
    out = {k: v / total if total > 0 else float("nan") for k, v in groups.items()}
    out["total_s"] = total
    out["aten_calls"] = calls  # operator calls (each a dispatch: the per-op overhead of eager PyTorch)
    return out


def engine_path(engine) -> str:
    """The GEMM path an engine runs: ``native`` or ``emulated`` (suite.embedded.qlinear), with
    ``:<gemm>`` naming int8's integer GEMM (qlinear.INT8_GEMMS), ``+fused`` where int8 runs
    suite.embedded.fused and ``+cpp-loop`` where its decode step runs the layer loop in C++
    (suite.embedded.decode.NativeLayers)."""
    from suite.embedded.qlinear import Int8Linear

    int8 = [m for m in engine.model.modules() if isinstance(m, Int8Linear)]
    gemm = ":" + "/".join(sorted({m.gemm for m in int8})) if int8 else ""
    fused = "+fused" if any(m.fused for m in int8) else ""
    loop = "+cpp-loop" if engine.decoder.cpp_loop else ""
    return ("native" if engine.native else "emulated") + gemm + fused + loop


def build_engines(model, precisions, kernels: str, unfused: bool, python_loop: bool = False,
                  int8_gemms: tuple[str, ...] = ()) -> dict:
    """One RolloutEngine per precision, plus ``int8/unfused`` (its fused path switched off) when
    ``unfused`` and the int8 engine runs fused, ``int8/<gemm>`` for each integer GEMM of
    ``int8_gemms`` (forced: "float32" is the emulated engine), and ``<precision>/python-loop``
    (the decode step's Python layer loop) for each precision running the C++ one when
    ``python_loop``: variant name -> engine."""
    from suite.core.quant import QuantScheme
    from suite.embedded.decode import set_native_loop
    from suite.embedded.engine import RolloutEngine
    from suite.embedded.qlinear import set_int8_fused

    engines = {p: RolloutEngine(model, QuantScheme(precision=p), kernels=kernels) for p in precisions}
    for gemm in int8_gemms:
        native = gemm != "float32"
        # only the integer GEMM differs from the int8 row: bf16 outside it as --kernels resolves it
        e = engines[f"int8/{gemm}"] = RolloutEngine(model, QuantScheme(precision="int8"),
                                                    kernels="native" if native else "emulated", bf16_kernels=kernels)
        if native:
            e.set_int8_gemm(gemm)
    if unfused and "int8" in engines and "+fused" in engine_path(engines["int8"]):
        engines["int8/unfused"] = e = RolloutEngine(model, QuantScheme(precision="int8"), kernels=kernels)
        set_int8_fused(e.model, False)
    if python_loop:
        for p in precisions:
            if engines[p].decoder.cpp_loop:
                engines[f"{p}/python-loop"] = e = RolloutEngine(model, QuantScheme(precision=p), kernels=kernels)
                set_native_loop(e, False)
    return engines


def run_rollout(models, precisions, batches, new_tokens, *, prompt_len: int, repeats: int, warmup: int,
                kernels: str = "auto", profile: bool = False, unfused: bool = False,
                python_loop: bool = False, int8_gemms: tuple[str, ...] = ()) -> tuple[list[dict], list[dict]]:
    """The benchmark itself: (rows, profile rows). Rows as in COLUMNS; ``unfused`` and
    ``python_loop`` add variants (see build_engines)."""
    import torch

    from suite.hardware import cpu_features

    flags = cpu_features().label()
    rows: list[dict] = []
    prof_rows: list[dict] = []
    for preset in models:
        model = bench_model(preset)
        engines = build_engines(model, precisions, kernels, unfused, python_loop, int8_gemms)
        # Weight sync, interleaved across precisions (at least 5 rounds: it is cheap).
        sync_t = interleaved({p: (lambda e=e: e.sync(model)) for p, e in engines.items()},
                             repeats=max(5, repeats), warmup=warmup)
        sync_s = {p: median(v) for p, v in sync_t.items()}
        for batch in batches:
            prompts = bench_prompts(batch, prompt_len, model.cfg.vocab_size)
            for n in new_tokens:
                note(f"rollout: model={preset} batch={batch} new_tokens={n}: {len(engines)} precisions x "
                     f"{warmup} warm-up + {repeats} rounds")

                def gen(e, n=n, prompts=prompts):
                    ro = e.generate(prompts, max_new_tokens=n, temperature=1.0, top_p=1.0, stop_id=-1, pad_id=0,
                                    generator=torch.Generator().manual_seed(0))
                    assert ro.response_mask.shape == (len(prompts), n)  # every row decoded n tokens

                times = interleaved({p: (lambda e=e: gen(e)) for p, e in engines.items()}, repeats, warmup,
                                    on_round=lambda r: note(f"  round {r + 1}/{repeats}"))
                tps = {p: batch * n / median(t) for p, t in times.items()}
                for p in engines:
                    gen_s = median(times[p])
                    rows.append({
                        "model": preset, "d_model": model.cfg.d_model, "batch": batch, "new_tokens": n,
                        "prompt_len": prompt_len, "precision": p,
                        "kernels": "native" if engines[p].native else "emulated", "path": engine_path(engines[p]),
                        "cpu_flags": flags,
                        "tokens_per_s": tps[p],
                        "ratio_vs_fp32": tps[p] / tps["fp32"] if "fp32" in tps else float("nan"),
                        "ratio_vs_bf16": tps[p] / tps["bf16"] if "bf16" in tps else float("nan"),
                        "gen_s": gen_s, "spread": spread(times[p]), "repeats": repeats,
                        "sync_ms": sync_s[p] * 1e3, "sync_pct_of_gen": 100 * sync_s[p] / gen_s,
                    })
        if profile:
            batch, n = max(batches), max(new_tokens)
            prompts = bench_prompts(batch, prompt_len, model.cfg.vocab_size)
            for p, e in engines.items():
                shares = op_shares(lambda e=e: e.generate(prompts, max_new_tokens=n, temperature=1.0, top_p=1.0,
                                                          stop_id=-1, pad_id=0,
                                                          generator=torch.Generator().manual_seed(0)))
                prof_rows.append({"model": preset, "batch": batch, "new_tokens": n, "precision": p,
                                  "path": engine_path(e), **shares})
    return rows, prof_rows


def cmd_rollout(args) -> int:
    try:
        models, precisions, batches, new_tokens = _check(args)
    except BenchError as exc:
        note(f"suite bench rollout: {exc}")
        return 2
    set_threads(args.threads)
    info = machine_info()
    rows, prof_rows = run_rollout(models, precisions, batches, new_tokens, prompt_len=args.prompt_len,
                                  repeats=args.repeats, warmup=args.warmup, kernels=args.kernels,
                                  profile=args.profile, unfused=args.unfused, python_loop=args.python_loop,
                                  int8_gemms=tuple(args.int8_gemms))
    notes = [
        "tokens_per_s = batch * new_tokens / median seconds of one generate call (prefill + decode, "
        "temperature 1); ratios are against fp32 / bf16 measured in the same interleaved rounds",
        "path: :<gemm> = int8's integer GEMM (int_mm = torch._int_mm, oneDNN's VNNI / AMX kernel; packed = the "
        "suite's exact AVX2 kernel, for CPUs without VNNI; float32 = the emulation); "
        "+fused = int8 with the fused quantize / rescale loops (suite.embedded.fused, the same bits); "
        "+cpp-loop = the decode step's layer loop in C++ (suite.embedded.decode.NativeLayers, the same aten calls); "
        "native = low-precision GEMM kernels; emulated = the same numerics as float32 GEMMs "
        "(suite.embedded.engine: chosen where the CPU lacks VNNI / AVX512-BF16 / AMX)",
        "sync_ms = median seconds of RolloutEngine.sync (re-quantization from the fp32 weights)",
    ]
    for r in rows:
        if r["precision"].startswith("int8") and r["d_model"] >= 512 and r["batch"] == 64:
            notes.append(f"target INT8 >= 1.8x fp32 and >= 1.2x bf16 tokens/s (d_model >= 512, batch 64): "
                         f"{r['model']} n={r['new_tokens']}: {r['ratio_vs_fp32']:.2f}x fp32, "
                         f"{r['ratio_vs_bf16']:.2f}x bf16 ({r['precision']}, {r['path']}, CPU {r['cpu_flags']})")
    if prof_rows:
        from suite.bench.common import table

        notes.append("profile (share of self CPU time of one generate call, by operator group):\n\n"
                     + table(prof_rows, PROFILE_COLUMNS) + "\n")
    metrics = {}
    for r in rows:
        key = f"rollout/{r['model']}/b{r['batch']}/n{r['new_tokens']}/{r['precision']}"
        metrics[f"{key}/tokens_per_s"] = r["tokens_per_s"]
        metrics[f"{key}/ratio_vs_fp32"] = r["ratio_vs_fp32"]
        metrics[f"{key}/sync_ms"] = r["sync_ms"]
    params = {"models": args.models, "precisions": args.precisions, "batch": args.batch,
              "new_tokens": args.new_tokens, "prompt_len": args.prompt_len, "repeats": args.repeats,
              "warmup": args.warmup, "kernels": args.kernels, "unfused": args.unfused,
              "python_loop": args.python_loop, "int8_gemms": ",".join(args.int8_gemms)}
    emit(args, "rollout", "rollout", info, rows, COLUMNS, notes, params, metrics)
    return 0
