"""`suite bench peer`: our rollout engine against Hugging Face `generate`, same network.

The same weights run in both: `suite.embedded.model.to_hf_llama` maps our decoder one to one
onto `LlamaForCausalLM` (a tiny `LlamaConfig`). Both decode greedily (temperature 0) the same
batch of equal-length prompts for exactly the same number of new tokens (no stop token; HF
with its KV cache, `min_new_tokens = max_new_tokens`), in the same dtype, timed interleaved.
The row says whether the greedy tokens of the two implementations are identical and how far
their full-forward logits are apart: a speed ratio is only meaningful for the same
computation.

dtype fp32: both compute in float32. dtype bf16: HF runs the model cast to bfloat16 (native
bf16 kernels); our "bf16" engine computes the same bf16 numerics, as float32 GEMMs over bf16
values where the CPU has no fast bf16 kernel (suite.embedded.engine) -- the row's `kernels`
column says which.
"""

from __future__ import annotations

import argparse

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
from suite.bench.vllm_peer import VLLM_PYTHON
from suite.hardware import cpu_features

DTYPES = ("fp32", "bf16", "int8")  # int8: our W8A8 engine against vLLM's (HF has no W8A8 CPU path)
COLUMNS = ("model", "batch", "group_size", "new_tokens", "dtype", "kernels", "ours_tokens_per_s", "hf_tokens_per_s",
           "ratio_vs_hf", "vllm_tokens_per_s", "ratio_vs_vllm", "ours_spread", "hf_spread", "tokens_match",
           "vllm_tokens_match", "vllm_tf_match", "ours_tf_match", "vllm_first_diff_margin", "vllm_lp_diff",
           "logits_max_abs_diff", "ours_ops_per_token", "hf_ops_per_token", "ours_gemm_share",
           "hf_gemm_share", "ours_gemm_s", "ratio_bound")


def register(sub) -> None:
    p = sub.add_parser("peer", help="our engine vs Hugging Face LlamaForCausalLM.generate, same weights",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="small,wide", help="model presets, comma-separated (default small,wide)")
    p.add_argument("--batch", default="8,64", help="sequences decoded at once, comma-separated (default 8,64)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per sequence (default 32)")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per sequence (default 16)")
    p.add_argument("--group-size", type=int, default=1,
                   help="rows per distinct prompt, as GRPO samples G responses per prompt (default 1: every row "
                        "its own prompt); our engine prefills each distinct prompt once, HF generate every row")
    p.add_argument("--dtypes", default="fp32", help="fp32, bf16, int8 (vLLM only), comma-separated (default fp32)")
    p.add_argument("--vllm-python", default=VLLM_PYTHON,
                   help="Python of a vLLM CPU environment: adds vLLM as a peer (default %(default)s; "
                        "skipped with a note where it does not exist; '' = off)")
    add_common_args(p)
    p.set_defaults(func=cmd_peer)


def hf_llama(model, dtype):
    """``LlamaForCausalLM`` holding ``model``'s weights (suite.embedded.model.to_hf_llama), in ``dtype``."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - transformers is a core dependency
        raise RuntimeError("suite bench peer needs transformers: pip install 'transformers>=4.45'") from exc
    from suite.embedded.model import to_hf_llama

    kw, sd = to_hf_llama(model)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    hf.load_state_dict(sd, strict=True)
    hf.generation_config.eos_token_id = None  # never stop early: exactly max_new_tokens tokens
    hf.generation_config.pad_token_id = 0
    return hf.to(dtype)


def hf_generate(hf, input_ids, new_tokens: int):
    """Greedy decode with HF's KV cache; returns the new tokens [B, new_tokens]."""
    import torch

    with torch.no_grad():
        out = hf.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                          max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True,
                          eos_token_id=None, pad_token_id=0)
    return out[:, input_ids.shape[1]:]


def ours_generate(engine, prompts, new_tokens: int):
    """Greedy decode with our engine; returns the new tokens [B, new_tokens]."""
    import torch

    ro = engine.generate(prompts, max_new_tokens=new_tokens, temperature=0.0, top_p=1.0, stop_id=-1, pad_id=0,
                         generator=torch.Generator().manual_seed(0))
    return ro.tokens[:, ro.response_start:]


def grouped_prompts(batch: int, group_size: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``batch`` rows of ``batch / group_size`` distinct random prompts, each repeated
    ``group_size`` times in a row (the layout of a GRPO rollout batch)."""
    from suite.bench.rollout import bench_prompts

    return [p for p in bench_prompts(batch // group_size, length, vocab, seed=seed) for _ in range(group_size)]


def run_peer(models, batches, new_tokens: int, dtypes, *, prompt_len: int, repeats: int, warmup: int,
             gain: float = 4.0, vllm_python: str | None = None, threads: int = 0, group_size: int = 1) -> list[dict]:
    """The benchmark: rows as in COLUMNS. ``gain`` scales the random weights so that greedy
    decoding has clear winners (suite.bench.rollout.bench_model). ``vllm_python``: a vLLM CPU
    environment's Python, for vLLM as a third peer (None: without it; dtype int8 needs it).
    ``group_size``: rows per distinct prompt (grouped_prompts)."""
    import tempfile

    import torch

    from suite.bench.rollout import bench_model
    from suite.bench.vllm_peer import VllmPeer, export_model
    from suite.core.quant import QuantScheme
    from suite.embedded.engine import RolloutEngine

    rows = []
    for preset in models:
        model = bench_model(preset, gain=gain)
        for dt in dtypes:
            hf = hf_llama(model, torch.float32 if dt == "fp32" else torch.bfloat16) if dt != "int8" else None
            engine = RolloutEngine(model, QuantScheme(precision=dt))
            for batch in batches:
                prompts = grouped_prompts(batch, group_size, prompt_len, model.cfg.vocab_size, seed=1)
                ids = torch.tensor(prompts)  # [B, P], equal lengths: no padding on either side
                note(f"peer: model={preset} dtype={dt} batch={batch} new_tokens={new_tokens}")
                fns = {"ours": lambda: ours_generate(engine, prompts, new_tokens)}
                if hf is not None:
                    fns["hf"] = lambda: hf_generate(hf, ids, new_tokens)
                vllm = None
                with tempfile.TemporaryDirectory(prefix="suite-peer-vllm-") as folder:
                    if vllm_python:
                        vllm = VllmPeer(vllm_python, folder, export_model(model, folder, dt), prompts, new_tokens,
                                        threads)
                        note(f"  vLLM {vllm.version} ready ({vllm.init_s:.0f} s to start)")
                        if dt == "int8" and not cpu_features().int8_dot_exact:
                            # docs/verl.md, "vLLM's CPU build on each CPU kind"
                            note("  vLLM's int8 here is oneDNN's saturating int16 kernel (no VNNI / AMX): "
                                 "not W8A8, so its row's agreement columns compare two computations")
                        fns["vllm"] = vllm.generate
                    try:
                        row = _measure(fns, engine, hf, ids, prompts, new_tokens, repeats, warmup, vllm)
                    finally:
                        if vllm is not None:
                            vllm.close()
                row.update({"model": preset, "batch": batch, "group_size": group_size, "new_tokens": new_tokens,
                            "prompt_len": prompt_len,
                            "dtype": dt, "kernels": "native" if engine.native else "emulated",
                            "vllm": vllm.version if vllm else "", "repeats": repeats})
                rows.append(row)
    return rows


def vllm_agreement(ours_tok, ours_lp, vllm_tok, tf: dict) -> dict:
    """How far vLLM's greedy tokens part from ours, and why: greedy sequences part for good at
    the first step where the two engines' logits, which differ by rounding, order a near tie
    differently; what follows is a different prefix, so ``vllm_tokens_match`` says little
    about the two computations. ``ours_tok`` / ``vllm_tok`` [B, R]: the new tokens; ``ours_lp``
    [B, P + R, V]: our log-probs teacher-forced on prompt + ``ours_tok``; ``tf``: vLLM's on the
    same sequences (VllmPeer.teacher_forced, [B, P + R - 1] each). Returns ``vllm_tf_match``
    (fraction of new positions where vLLM's argmax given our prefix is our token),
    ``vllm_first_diff_margin`` (median over the rows that part of our top-1 minus top-2
    log-prob at the first differing step, where both engines saw the same prefix; nan if none
    part), ``vllm_lp_diff`` (median |our log-prob - vLLM's| of our tokens) and ``ours_tf_match``
    (the same as ``vllm_tf_match`` for our own full forward: where our prefill and our decode
    step round differently, bf16, they too pick other tokens at near ties)."""
    r = ours_tok.shape[1]
    own = ours_lp[:, -r - 1:-1]  # [B, R, V]: the distributions our new tokens were drawn from
    top2 = own.topk(2, dim=-1).values  # [B, R, 2]
    margin = top2[..., 0] - top2[..., 1]  # [B, R]
    parted = (vllm_tok != ours_tok).any(1)  # [B]
    first = (vllm_tok != ours_tok).int().argmax(1)  # [B]: the first differing step where a row parts
    at = margin[parted, first[parted]]  # [rows that part]
    ours_own = own.gather(-1, ours_tok[..., None])[..., 0]  # [B, R]
    return {"vllm_tf_match": float((tf["top"][:, -r:] == ours_tok).float().mean()),
            "ours_tf_match": float((own.argmax(-1) == ours_tok).float().mean()),
            "vllm_first_diff_margin": float(at.median()) if at.numel() else float("nan"),
            "vllm_lp_diff": float((ours_own - tf["lp"][:, -r:]).abs().median())}


def ratio_bound(hf_s: float, ours_gemm_s: float) -> float:
    """The highest ``ratio_vs_hf`` our engine could reach if everything in its call but the
    GEMMs were free: HF's call (median seconds) over our GEMMs' self CPU seconds in one
    profiled call. Both run the same network through the same GEMM library, so where this is
    below a target, no overhead removed reaches it; only a faster GEMM would."""
    return hf_s / ours_gemm_s if ours_gemm_s > 0 else float("nan")


def _measure(fns, engine, hf, ids, prompts, new_tokens: int, repeats: int, warmup: int, vllm=None) -> dict:
    """One row's numbers: tokens/s of each peer in ``fns`` (timed interleaved), whether the
    greedy tokens and logits agree with ours (and with ``vllm``'s, a VllmPeer, teacher-forced
    on our tokens), and the profile of ours and HF's calls."""
    import torch

    from suite.bench.rollout import op_shares

    nan = float("nan")
    batch = len(prompts)
    ours_tok = fns["ours"]()
    toks = {name: fn() for name, fn in fns.items() if name != "ours"}  # [B, R] each
    times = interleaved(fns, repeats, warmup)
    tps = {name: batch * new_tokens / median(t) for name, t in times.items()}
    row = {"ours_tokens_per_s": tps["ours"], "ours_spread": spread(times["ours"])}
    for name in ("hf", "vllm"):
        row[f"{name}_tokens_per_s"] = tps.get(name, nan)
        row[f"ratio_vs_{name}"] = tps["ours"] / tps[name] if name in tps else nan
    row["hf_spread"] = spread(times["hf"]) if "hf" in times else nan
    row["vllm_tokens_match"] = float((toks["vllm"] == ours_tok).float().mean()) if "vllm" in toks else nan
    row.update({"vllm_tf_match": nan, "ours_tf_match": nan, "vllm_first_diff_margin": nan, "vllm_lp_diff": nan})
    if vllm is not None:
        ours_full = torch.cat([ids, ours_tok], 1)  # [B, P + R]
        ours_lp = torch.log_softmax(engine.logits(ours_full), -1)  # [B, P + R, V]
        row.update(vllm_agreement(ours_tok, ours_lp, toks["vllm"], vllm.teacher_forced(ours_full)))
    # What bounds the ratio: aten operator calls per decoded token (eager dispatch overhead)
    # and the GEMM share of self CPU time, one profiled call each.
    po = op_shares(fns["ours"])
    row.update({"ours_ops_per_token": po["aten_calls"] / new_tokens, "ours_gemm_share": po["gemm"],
                "ours_gemm_s": po["gemm"] * po["total_s"]})
    if hf is None:
        return {**row, "tokens_match": nan, "logits_max_abs_diff": nan, "hf_ops_per_token": nan, "hf_gemm_share": nan,
                "ratio_bound": nan}
    row["ratio_bound"] = ratio_bound(median(times["hf"]), row["ours_gemm_s"])
    full = torch.cat([ids, toks["hf"]], 1)  # [B, P + R]
    with torch.no_grad():
        a = engine.logits(full).float()  # [B, P + R, V]
        b = hf(input_ids=full).logits.float()  # [B, P + R, V]
    ph = op_shares(fns["hf"])
    return {**row, "tokens_match": float((ours_tok == toks["hf"]).float().mean()),
            "logits_max_abs_diff": float((a - b).abs().max()), "hf_ops_per_token": ph["aten_calls"] / new_tokens,
            "hf_gemm_share": ph["gemm"]}


def cmd_peer(args) -> int:
    from suite.embedded.model import PRESETS

    try:
        check_common(args)
        models = parse_list("--models", args.models, tuple(PRESETS))
        batches = parse_ints("--batch", args.batch)
        dtypes = parse_list("--dtypes", args.dtypes, DTYPES)
        if args.new_tokens < 1 or args.prompt_len < 1:
            raise BenchError(f"--new-tokens={args.new_tokens} and --prompt-len={args.prompt_len} must be >= 1")
        if args.group_size < 1 or any(b % args.group_size for b in batches):
            raise BenchError(f"--group-size={args.group_size} must be >= 1 and divide every --batch ({args.batch})")
    except BenchError as exc:
        note(f"suite bench peer: {exc}")
        return 2
    from suite.bench.vllm_peer import vllm_missing

    vllm_python = args.vllm_python or None
    why = vllm_missing(vllm_python) if vllm_python else "--vllm-python=''"
    if why:
        note(f"suite bench peer: vLLM peer skipped: {why}")
        vllm_python = None
        if "int8" in dtypes:
            note("suite bench peer: --dtypes int8 needs the vLLM peer (Hugging Face has no W8A8 CPU path); "
                 "int8 skipped")
            dtypes = [d for d in dtypes if d != "int8"]
            if not dtypes:
                return 2
    set_threads(args.threads)
    info = machine_info()
    import transformers

    rows = run_peer(models, batches, args.new_tokens, dtypes, prompt_len=args.prompt_len, repeats=args.repeats,
                    warmup=args.warmup, vllm_python=vllm_python, threads=args.threads, group_size=args.group_size)
    notes = [f"Hugging Face transformers {transformers.__version__}, LlamaForCausalLM.generate (greedy, KV cache)",
             "ratio_vs_hf = our tokens/s / HF tokens/s, same weights, prompts, batch, new tokens and dtype",
             "tokens_match = fraction of greedy tokens identical; logits_max_abs_diff = max |ours - HF| of the "
             "full-forward logits over prompt + generated tokens",
             "*_ops_per_token: aten operator calls per decode step (profiler, one call); *_gemm_share: share of self "
             "CPU time in GEMMs (mm / addmm / linear)"]
    if args.group_size > 1:
        notes.append(f"prompts: batch / {args.group_size} distinct, each repeated {args.group_size} times (a GRPO "
                     "batch): our engine prefills each distinct prompt once, HF generate prefills every row")
    notes.append("ratio_bound = HF's call / our GEMMs' self CPU time in one profiled call: the ratio_vs_hf a "
                 "free rest of our call would give (peer.ratio_bound)")
    notes.append("target ours >= 2x HF tokens/s: " + ", ".join(
        f"{r['model']} b{r['batch']} {r['dtype']} {r['ratio_vs_hf']:.2f}x (bound {r['ratio_bound']:.2f}x)"
        for r in rows if r["dtype"] != "int8"))
    if vllm_python:
        notes.append(f"vLLM {rows[0]['vllm'] if rows else '?'} (CPU build, {vllm_python}), in-process engine, "
                     "enforce_eager, greedy, ignore_eos; one call = one LLM.generate in its child process (the "
                     "time includes the line-protocol round trip, ~ms); int8 = a compressed-tensors W8A8 "
                     "checkpoint of our per-channel codes and scales, per-token dynamic activations "
                     "(suite.bench.vllm_peer); vllm_tokens_match = fraction of greedy tokens equal to ours")
        notes.append("vllm_tf_match = fraction of new positions where vLLM's argmax given OUR prefix (teacher-forced) "
                     "is our token: the agreement of the two computations (greedy sequences part for good at the "
                     "first flipped near tie); vllm_first_diff_margin = median of our top-1 minus top-2 log-prob at "
                     "the first step a row parts; vllm_lp_diff = median |our log-prob - vLLM's| of our tokens "
                     "(peer.vllm_agreement); ours_tf_match = the same for our own full forward against our decode")
        notes.append("ours vs vLLM: " + ", ".join(
            f"{r['model']} b{r['batch']} {r['dtype']} {r['ratio_vs_vllm']:.2f}x" for r in rows))
    else:
        notes.append(f"vLLM peer skipped: {why}")
    metrics = {f"peer/{r['model']}/b{r['batch']}/{r['dtype']}/ratio_vs_{p}": r[f"ratio_vs_{p}"]
               for r in rows for p in ("hf", "vllm")}
    params = {"models": args.models, "batch": args.batch, "new_tokens": args.new_tokens,
              "prompt_len": args.prompt_len, "group_size": args.group_size, "dtypes": args.dtypes,
              "repeats": args.repeats,
              "transformers": transformers.__version__, "vllm_python": vllm_python or ""}
    emit(args, "peer", "peer", info, rows, COLUMNS, notes, params, metrics)
    return 0
