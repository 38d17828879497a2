"""Dose probe (issue 31): 6 RL steps per dose of a real quantizer at T = 1.0, the median k3 KL of
each, and the quantized rollout copy's greedy held-out accuracy against the fp32 model's.

    PYTHONPATH=. python analysis/dose_probe.py            # ~15-30 min on 2 shared CPU cores

Each dose is one `suite run steps=6 eval_every=6 uaq.s=1.0 threads=1 rollout.temperature=1.0 <dose>`
(a subprocess of this interpreter, default model and task, the default cached warm start), two at a
time. From its metrics.jsonl: median and mean of `rollout_corr/k3_kl` over the 6 steps and the fp32
model's greedy held-out accuracy (`val-core/arith/acc/mean@1`, steps 0 and 6). The run does not
evaluate its quantized copy, so this script rebuilds the run (`EmbeddedRun(cfg, run_dir).build()`,
the same warm start) and scores the rollout engine with the trainer's own `evaluate()` (the eval
engine swapped for the rollout engine): at the warm start (step 0) and on the step-6 checkpoint.
The fp32 accuracies it recomputes must equal the logged ones (checked: a mismatch stops it).

Writes <out>/probe.tsv (one row per dose, appended: a dose already there is skipped, so a stopped
probe resumes and new doses append in the order tried). Run dirs and the MLflow store go to --work.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import platform
import statistics as st
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["steps=6", "eval_every=6", "uaq.s=1.0", "threads=1", "rollout.temperature=1.0"]
# (label, overrides), in the order tried; --doses picks a subset by label
DOSES = [
    ("w8a16", "quant=wa16 quant.weight_bits=8"),
    ("w6a16", "quant=wa16 quant.weight_bits=6"),
    ("w4a16", "quant=wa16 quant.weight_bits=4"),
    ("w3a16", "quant=wa16 quant.weight_bits=3"),
    ("w2a16", "quant=wa16 quant.weight_bits=2"),
    ("w3a16-lmhead", "quant=wa16 quant.weight_bits=3 quant.lm_head=true"),
    ("w2a16-lmhead", "quant=wa16 quant.weight_bits=2 quant.lm_head=true"),
    ("int8-a1", "quant=int8 quant.outlier_alpha=1.0"),
    ("int8-a8", "quant=int8 quant.outlier_alpha=8.0"),
    ("int8-a32", "quant=int8 quant.outlier_alpha=32.0"),
    ("int8-a128", "quant=int8 quant.outlier_alpha=128.0"),
    ("int8-a512", "quant=int8 quant.outlier_alpha=512.0"),
    ("int8-a2048", "quant=int8 quant.outlier_alpha=2048.0"),
    # added after the rows above: the gaps between 32 and 128 (int8) and between 3 and 2 bits (wa16)
    ("int8-a64", "quant=int8 quant.outlier_alpha=64.0"),
    ("w2a16-g32", "quant=wa16 quant.weight_bits=2 quant.group_size=32"),
    ("w2a16-g16", "quant=wa16 quant.weight_bits=2 quant.group_size=16"),
    ("w2a16-g8", "quant=wa16 quant.weight_bits=2 quant.group_size=8"),
    # added third: can INT8 reach 1e-2 with accuracy kept? more outlier channels at alpha 64; alpha 96
    ("int8-a64-c8", "quant=int8 quant.outlier_alpha=64.0 quant.outlier_channels=8"),
    ("int8-a64-c16", "quant=int8 quant.outlier_alpha=64.0 quant.outlier_channels=16"),
    ("int8-a96", "quant=int8 quant.outlier_alpha=96.0"),
]
COLUMNS = ["label", "overrides", "run_id", "median_k3", "mean_k3", "min_k3", "max_k3", "median_kl",
           "acc_fp32_0", "acc_q_0", "ratio_0", "acc_fp32_6", "acc_q_6", "ratio_6", "run_s", "eval_s"]
K3_LO, K3_HI, RATIO_MIN, N_MIN = 3e-4, 1e-2, 0.8, 4  # the conditions


def machine() -> str:
    import torch

    flags = set()
    name = platform.processor()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.lower().startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
            if line.startswith("Model name"):
                name = line.split(":", 1)[1].strip()
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16") if f in flags]
    return f"{name}, {os.cpu_count()} cores, {'+'.join(isa) or 'no avx2'}, torch {torch.__version__}"


def probe_one(label: str, overrides: str, work: str) -> dict:
    """Run one dose, then score its quantized copy (a worker process: torch is imported here)."""
    import torch

    from suite.config import compose_config, run_id
    from suite.embedded.trainer import EmbeddedRun
    from suite.tracking import checkpoint as ckpt

    args = COMMON + overrides.split() + [f"out_dir={work}/runs",
                                         f"tracking.tracking_uri=sqlite:///{work}/probe.db",
                                         "tracking.experiment=dose_probe"]
    cfg = compose_config(args)
    rid = run_id(cfg)
    run_dir = os.path.join(cfg.out_dir, rid)
    os.makedirs(f"{work}/logs", exist_ok=True)
    t0 = time.perf_counter()
    with open(f"{work}/logs/{label}.log", "w") as log:
        rc = subprocess.run([sys.executable, "-m", "suite.cli", "run", "--no-progress", *args],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    run_s = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{label}: suite run exited {rc}; see {work}/logs/{label}.log")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    by_step = {r["step"]: r["metrics"] for r in rows}
    acc_key = f"val-core/{cfg.task.name}/acc/mean@1"
    k3 = [m["rollout_corr/k3_kl"] for s, m in sorted(by_step.items()) if "rollout_corr/k3_kl" in m]
    kl = [m["rollout_corr/kl"] for s, m in sorted(by_step.items()) if "rollout_corr/kl" in m]

    # The quantized copy's greedy held-out accuracy: the trainer's evaluate() on its rollout engine.
    t0 = time.perf_counter()
    run = EmbeddedRun(cfg, run_dir, progress=False)
    run.build()
    fp32_engine = run.eval_engine
    acc = {}
    for step in (0, cfg.steps):
        if step:
            state = ckpt.load_latest_checkpoint(run_dir)
            assert state is not None and state[1]["step"] == step, f"{label}: no step-{step} checkpoint"
            run.actor.load_state_dict(state[1]["actor"])
        run.eval_engine = fp32_engine
        acc[f"acc_fp32_{step}"] = run.evaluate()
        run.eval_engine = run.engine  # evaluate() syncs it from the actor (quantizer, outlier transform)
        acc[f"acc_q_{step}"] = run.evaluate()
        logged = by_step[step][acc_key]
        if abs(acc[f"acc_fp32_{step}"] - logged) > 1e-12:
            raise RuntimeError(f"{label}: fp32 accuracy at step {step} recomputed {acc[f'acc_fp32_{step}']} "
                               f"!= logged {logged}: the rebuilt run is not the run")
    eval_s = time.perf_counter() - t0
    del run, torch
    return {
        "label": label, "overrides": overrides, "run_id": rid,
        "median_k3": st.median(k3), "mean_k3": st.mean(k3), "min_k3": min(k3), "max_k3": max(k3),
        "median_kl": st.median(kl), **acc,
        "ratio_0": acc["acc_q_0"] / acc["acc_fp32_0"],
        "ratio_6": acc[f"acc_q_{cfg.steps}"] / acc[f"acc_fp32_{cfg.steps}"],
        "run_s": round(run_s, 1), "eval_s": round(eval_s, 1), "n_k3": len(k3),
    }


def fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def choose(rows: list[dict]) -> tuple[list[dict], str]:
    """Doses meeting the accuracy condition at both steps, and whether they span the k3 range."""
    ok = sorted((r for r in rows if min(float(r["ratio_0"]), float(r["ratio_6"])) >= RATIO_MIN),
                key=lambda r: float(r["median_k3"]))
    lo = [r for r in ok if float(r["median_k3"]) <= K3_LO]
    hi = [r for r in ok if float(r["median_k3"]) >= K3_HI]
    verdict = (f"{len(ok)} doses keep greedy accuracy >= {RATIO_MIN}x fp32; {len(lo)} at median k3 <= {K3_LO:g}, "
               f"{len(hi)} at >= {K3_HI:g}: " + ("the range is spanned" if lo and hi and len(ok) >= N_MIN
                                                   else "the range is NOT spanned"))
    return ok, verdict


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(REPO, "analysis/results/dose_response/probe"))
    p.add_argument("--work", default="/tmp/dose_probe", help="run dirs, MLflow store, logs")
    p.add_argument("--jobs", type=int, default=2, help="doses at once (each threads=1)")
    p.add_argument("--doses", default="", help="comma-separated labels (default: all, in order)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    tsv = os.path.join(a.out, "probe.tsv")
    done = set()
    if os.path.exists(tsv):
        done = {r["label"] for r in csv.DictReader(open(tsv), delimiter="\t")}
    else:
        with open(tsv, "w") as fh:
            fh.write("\t".join(COLUMNS) + "\n")
    want = [d for d in a.doses.split(",") if d]
    known = dict(DOSES)
    for d in want:
        if d not in known:
            print(f"unknown dose {d!r}; labels: {', '.join(known)}", file=sys.stderr)
            return 2
    todo = [(lab, ov) for lab, ov in DOSES if (not want or lab in want) and lab not in done]
    print(f"dose probe: {len(todo)} doses to run ({len(done)} already in {tsv}); machine: {machine()}", flush=True)
    t_all = time.perf_counter()
    with mp.get_context("spawn").Pool(a.jobs) as pool:
        pending = [(lab, pool.apply_async(probe_one, (lab, ov, a.work))) for lab, ov in todo]
        for lab, res in pending:  # in order, so probe.tsv keeps the order tried
            r = res.get()
            with open(tsv, "a") as fh:
                fh.write("\t".join(fmt(r[c]) for c in COLUMNS) + "\n")
            print(f"{lab:14s} k3 median {r['median_k3']:.3g} mean {r['mean_k3']:.3g} | greedy acc fp32 "
                  f"{r['acc_fp32_0']:.3f} q {r['acc_q_0']:.3f} (x{r['ratio_0']:.2f}) -> step 6 fp32 "
                  f"{r['acc_fp32_6']:.3f} q {r['acc_q_6']:.3f} (x{r['ratio_6']:.2f}) | run {r['run_s']:.0f} s, "
                  f"eval {r['eval_s']:.0f} s | {r['run_id']}", flush=True)
    print(f"probe wall {time.perf_counter() - t_all:.0f} s", flush=True)
    rows = list(csv.DictReader(open(tsv), delimiter="\t"))
    ok, verdict = choose(rows)
    print(verdict)
    print("candidates (median k3 ascending): " + ", ".join(f"{r['label']} {float(r['median_k3']):.2g}" for r in ok))
    return 0


if __name__ == "__main__":
    sys.exit(main())
