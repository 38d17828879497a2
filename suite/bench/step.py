"""`suite bench step`: one RL step split into its phases, per rollout precision.

One `EmbeddedRun` per precision is built from the same config (the default experiment, plus
any Hydra overrides given), so all share one warm start; their RL steps are then run
interleaved (one step of each precision per round, order rotated) and each phase's median
over the rounds is reported from the trainer's own timings (docs/metrics.md):

    sync   timing_s/update_weights   re-quantize the rollout copy
    gen    timing_s/gen              sample the step's rollouts with the quantized copy
    prox   timing_s/old_log_prob     log pi_prox with the full-precision actor
    train  timing_s/adv + ref + update_actor
    step   timing_s/step             the whole step (other = step - the four above: rewards,
                                     mismatch and visibility metrics)

Each precision's actor trains on its own rollouts, so response lengths (and with them the
work of a step) drift apart between precisions; `gen_tokens_per_s` (generated tokens per
second of gen) is the rollout speed that does not depend on that, and is compared too.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

from suite.bench.common import (
    BenchError,
    add_common_args,
    check_common,
    emit,
    interleaved,
    machine_info,
    median,
    note,
    parse_list,
    set_threads,
)

PHASES = {  # column -> the trainer's timing keys that make it up
    "sync_s": ("timing_s/update_weights",),
    "gen_s": ("timing_s/gen",),
    "prox_s": ("timing_s/old_log_prob",),
    "train_s": ("timing_s/adv", "timing_s/ref", "timing_s/update_actor"),
    "step_s": ("timing_s/step",),
}
COLUMNS = ("precision", "step_s", "sync_s", "gen_s", "prox_s", "train_s", "other_s", "rollout_share", "sync_share",
           "step_speedup_vs_fp32", "gen_tokens_per_s", "gen_ratio_vs_fp32", "response_len")


def register(sub) -> None:
    p = sub.add_parser("step", help="one RL step split into sync / gen / prox log-probs / train, per precision",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the experiment (default: the default experiment)")
    p.add_argument("--precisions", default=None, help="rollout precisions (default: every registered one)")
    add_common_args(p)
    p.set_defaults(func=cmd_step)


def _configs(overrides: list[str], precisions: list[str]) -> dict:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from suite.config import ConfigError, compose_config

    for ov in overrides:
        if ov.split("=", 1)[0].lstrip("+~") in ("quant", "quant.precision"):
            raise BenchError(f"override {ov!r}: the precision is the benchmark's axis; use --precisions")
    # The trainer in the dtype `train.autocast=auto` picks on this machine (bf16 where bf16 GEMMs
    # are native), unless the overrides choose one: the step ratio is then the machine's own.
    own = any(ov.split("=", 1)[0].lstrip("+~") == "train.autocast" for ov in overrides)
    cfgs = {}
    for p in precisions:
        try:
            cfgs[p] = compose_config(list(overrides) + ([] if own else ["train.autocast=auto"]) + [f"quant={p}"])
        except (ConfigError, HydraException, OmegaConfBaseException) as exc:
            raise BenchError(f"quant={p} {' '.join(overrides)}: {exc}") from None
        if cfgs[p].backend.name != "embedded":
            raise BenchError(f"backend.name={cfgs[p].backend.name!r}: suite bench step runs the embedded backend only")
    return cfgs


def run_step(cfgs: dict, *, repeats: int, warmup: int) -> tuple[list[dict], dict]:
    """Build one EmbeddedRun per precision and time its steps interleaved: (rows, config summary)."""
    from suite.embedded.trainer import EmbeddedRun
    from suite.hardware import resolve_autocast

    tmp = tempfile.mkdtemp(prefix="suite-bench-step-")
    try:
        runs = {}
        for p, cfg in cfgs.items():
            note(f"step: building the {p} run (warm start from cache or trained once: "
                 f"{cfg.warm_start.steps} steps)")
            run = EmbeddedRun(cfg, f"{tmp}/{p}", progress=False)
            # The trainer has no public set-up call: _build() is what run() does before its first step.
            run.build()
            runs[p] = run
        metrics: dict[str, list[dict]] = {p: [] for p in runs}

        def one_step(p: str) -> None:
            run = runs[p]
            run.step += 1
            metrics[p].append(run.train_step())

        timed = interleaved({p: (lambda p=p: one_step(p)) for p in runs}, repeats, warmup,
                            on_round=lambda r: note(f"  round {r + 1}/{repeats}"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows = []
    for p in runs:
        ms = metrics[p][warmup:]  # the timed steps
        row = {"precision": p, "steps_timed": len(ms), "wall_step_s": median(timed[p])}
        for col, keys in PHASES.items():
            row[col] = median([sum(m.get(k, 0.0) for k in keys) for m in ms])
        row["other_s"] = row["step_s"] - sum(row[c] for c in ("sync_s", "gen_s", "prox_s", "train_s"))
        row["rollout_share"] = row["gen_s"] / row["step_s"]
        row["sync_share"] = row["sync_s"] / row["step_s"]
        row["train_share"] = (row["prox_s"] + row["train_s"]) / row["step_s"]
        row["gen_tokens_per_s"] = median([m.get("perf/gen_tokens_per_s", float("nan")) for m in ms])
        row["response_len"] = median([m.get("response_length/mean", float("nan")) for m in ms])
        rows.append(row)
    ref = next((r for r in rows if r["precision"] == "fp32"), None)
    for r in rows:
        r["step_speedup_vs_fp32"] = ref["step_s"] / r["step_s"] if ref else float("nan")
        r["gen_ratio_vs_fp32"] = r["gen_tokens_per_s"] / ref["gen_tokens_per_s"] if ref else float("nan")
    c = next(iter(cfgs.values()))
    summary = {"model": c.model.preset, "algo": c.algo.name, "correction": c.correction.mode,
               "rollouts_per_step": c.rollout.prompts_per_step * c.algo.group_size,
               "max_new_tokens": c.rollout.max_new_tokens, "minibatches": c.train.minibatches,
               "epochs": c.train.epochs, "autocast": c.train.autocast,
               "trainer_dtype": resolve_autocast(c.train.autocast)}
    return rows, summary


def cmd_step(args) -> int:
    try:
        check_common(args)
        from suite.core.quant import PRECISIONS  # the quantizer registry (torch: not at `suite -h` time)

        args.precisions = args.precisions or ",".join(PRECISIONS)
        precisions = parse_list("--precisions", args.precisions, PRECISIONS)
        cfgs = _configs(args.overrides, precisions)
    except BenchError as exc:
        note(f"suite bench step: {exc}")
        return 2
    set_threads(args.threads)
    rows, summary = run_step(cfgs, repeats=args.repeats, warmup=args.warmup)
    info = machine_info()  # after the runs: a config's `threads` is applied when its run is built
    by = {r["precision"]: r for r in rows}
    notes = [
        "experiment: " + ", ".join(f"{k}={v}" for k, v in summary.items())
        + (f"; overrides: {' '.join(args.overrides)}" if args.overrides else " (the default experiment)"),
        "seconds are medians over the timed steps of the trainer's own timings (timing_s/*); "
        "train_s = adv + ref + update_actor; other_s = the rest of the step (rewards, metrics)",
    ]
    if "int8" in by:
        notes.append(f"target weight sync <= 5% of an INT8 step: {100 * by['int8']['sync_share']:.2f}%")
        if "fp32" in by:
            i8 = by["int8"]
            notes.append(f"target INT8 step >= 1.3x faster than fp32: {i8['step_speedup_vs_fp32']:.2f}x "
                         f"(rollout tokens/s {i8['gen_ratio_vs_fp32']:.2f}x; the trainer part, prox + train, "
                         f"is {100 * by['fp32']['train_share']:.0f}% of the fp32 step; trainer dtype "
                         f"{summary['trainer_dtype']})")
            rest = i8["step_s"] - i8["gen_s"] - i8["sync_s"]  # what the rollout cannot speed up
            notes.append(f"bound: with a free INT8 rollout and sync the step would be "
                         f"{by['fp32']['step_s'] / rest:.2f}x fp32's (prox + train + other = {rest:.3f} s)")
    trains = [r["train_s"] / r["response_len"] for r in rows if r["response_len"] > 0]
    if len(trains) > 1 and max(trains) > 1.2 * min(trains):
        # Every precision runs the same trainer: per response token its phase should take the same
        # time, so a gap is the shared machine's load moving between rounds, not the precision.
        notes.append(f"warning: train_s per response token differs {max(trains) / min(trains):.2f}x across "
                     f"precisions for the same trainer: the machine's load moved; step ratios of this run are "
                     f"unreliable (gen_ratio_vs_fp32 is less affected)")
    metrics = {}
    for r in rows:
        for k in ("step_s", "sync_s", "gen_s", "prox_s", "train_s", "step_speedup_vs_fp32", "gen_tokens_per_s"):
            metrics[f"step/{r['precision']}/{k}"] = r[k]
    params = {"overrides": " ".join(args.overrides), "precisions": args.precisions, "repeats": args.repeats,
              "warmup": args.warmup, **summary}
    emit(args, "step", "step", info, rows, COLUMNS, notes, params, metrics)
    return 0
