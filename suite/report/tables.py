"""The papers' tables as pure functions of the tidy run frame (`suite.report.data`).

Each table function takes DataFrames and returns a numeric DataFrame (written as CSV); a
`display_*` companion (`suite.report.fmt`) formats it for Markdown, LaTeX and HTML. A row is
one configuration: runs whose semantic configs are equal except for the seed
(`suite.report.cells`), never a mix of step counts, learning rates, trainer dtypes, kernel
paths or FP8 granularities. Only FINISHED runs are averaged; every other run (FAILED, KILLED,
RUNNING, SUPERSEDED, or an expected sweep cell with no run, MISSING) is counted in the
`not_averaged` column of its row and listed by `run_status`. An expected sweep cell with no run
is a row with n = 0, shown as "missing"; a setting no run and no sweep asked for is no row (the
papers' values stand in the `paper_vs_*` tables, every published row with its source).

Accuracy is reported in percent (the papers' unit): the run's last held-out accuracy
(`val-core/<task>/acc/mean@1`; for a verl run the largest mean@N it logged, e.g. Avg@32, mean over its
data sources: the runs frame's `acc_metric`) x 100, mean over seeds with a 95% confidence interval
(`suite.report.stats`: Student-t below 20 seeds, percentile bootstrap from there).
"""

from __future__ import annotations

import hashlib
import json
import math

import pandas as pd

from suite.report import fmt
from suite.report.cells import (FULL, GROUP, LOW_BIT, ROW_AXES, ensure_prepared, finished_mean,
                                pooled_frame, prepare, sort_rows, uaq_label, with_lr_factor)
from suite.evaluation import ENGINES
from suite.report.data import ACC, FINISHED, MISSING
from suite.report.fmt import Table
from suite.report.identity import SUPERSEDED
from suite.report.paper import (LAYOUTS, MEASURED_LABEL, PAPER_LABEL, PaperDataError, analysis_dir, growth, layout,
                                load_paper, paper_vs_kl, paper_vs_main, paper_vs_throughput, paper_vs_uaq)
from suite.report.stats import CI_SEED, N_RESAMPLES, bootstrap_ci, describe, mean_ci, t_interval

__all__ = ["FULL", "GROUP", "LOW_BIT", "MEASURED_LABEL", "PAPER_LABEL", "PaperDataError", "Table", "analysis_dir",
           "bootstrap_ci", "build_tables", "eval_scores", "eval_table", "group_lr_controls",
           "kl_table", "load_paper", "main_table", "mean_ci", "paper_vs_kl",
           "paper_vs_main", "paper_vs_throughput", "paper_vs_uaq", "run_status", "status_counts", "t_interval",
           "throughput_table", "uaq_label", "uaq_table", "with_lr_factor"]

ACC_COLUMNS = {"mean": "acc_pct", "ci_low": "acc_ci_low", "ci_high": "acc_ci_high"}


def held_out_label(acc_metrics) -> str:
    """How a row's accuracy was measured, as the papers name it: ``mean@1`` (one sample per prompt:
    greedy on the embedded backend and in the verl defaults) or ``Avg@N`` (the mean over N samples,
    QuRL's AIME Avg@32), from the runs' ``acc_metric`` keys (``.../acc/mean_at_N``); several, joined."""
    ns = set()
    for metric in acc_metrics:
        for key in str(metric).split(";"):
            tail = key.rsplit("/", 1)[-1]
            if tail.startswith("mean_at_") and tail[len("mean_at_"):].isdigit():
                ns.add(int(tail[len("mean_at_"):]))
    return " / ".join("mean@1" if n == 1 else f"Avg@{n}" for n in sorted(ns))


# ------------------------------------------------------------------------------ main table


def main_table(runs: pd.DataFrame, n_resamples: int = N_RESAMPLES, seed: int = CI_SEED) -> pd.DataFrame:
    """QuRL/QaRL main table: held-out accuracy (%) per configuration (ROW_AXES + group key).

    Every run the frame holds, the UAQ ablation's LR and per-group LR controls included (each its
    own row, `lr_factor` / `uaq_group_lr_s` saying which); a sweep cell with no run (MISSING) is a
    row with n = 0. Settings nobody ran are not rows: the papers' values stand in `paper_vs_main`.
    """
    r = ensure_prepared(runs)
    df = pooled_frame(r, ACC, 100.0, n_resamples, seed,
                      extra={"acc_at": lambda d: held_out_label(d["acc_metric"]) if "acc_metric" in d else ""})
    return sort_rows(df.rename(columns=ACC_COLUMNS))


# ------------------------------------------------------------------------------ UAQ ablation


def uaq_table(runs: pd.DataFrame, n_resamples: int = N_RESAMPLES, seed: int = CI_SEED) -> pd.DataFrame:
    """QuRL UAQ ablation: accuracy (%) and weight-update visibility per configuration.

    Low-bit runs only (UAQ acts on the quantizer). setting: UAQ s, LR factor (train.lr over the
    setting's reference lr) and per-group LR control. visibility_pct: mean over RL steps and
    seeds of `quant/update_code_changed_frac` x 100; step_ratio: mean of `quant/update_step_ratio`
    (|dW| / quantization step). Rows are the configurations that ran (or a sweep expected).
    """
    r = ensure_prepared(runs)
    r = r[r["precision"].isin(LOW_BIT)]
    df = pooled_frame(r, ACC, 100.0, n_resamples, seed,
                      extra={"visibility_pct": lambda d: finished_mean(d, "visibility", 100.0),
                             "step_ratio": lambda d: finished_mean(d, "step_ratio")})
    df.insert(len(ROW_AXES) + 2, "setting",
              [uaq_label(s, f, q) for s, f, q in zip(df["uaq_s"], df["lr_factor"], df["uaq_group_lr_s"])])
    return sort_rows(df.rename(columns=ACC_COLUMNS))


# ------------------------------------------------------------------------------ throughput


def _workload(run) -> str:
    """What a rollout's speed is compared at: the semantic config without the rollout-precision
    and training-method sections (quant., correction., uaq.), and the bf16 kernel path; or, for a
    run without params, its setting, backend, steps, lr and trainer dtype."""
    if run["config"]:
        cfg = {k: v for k, v in json.loads(run["config"]).items()
               if not k.startswith(("quant.", "correction.", "uaq."))}
        blob = [cfg, run["bf16_kernels"]]
    else:
        cols = (*GROUP, "backend", "steps", "lr", "trainer_dtype", "bf16_kernels")
        blob = [None if pd.isna(run[c]) else (run[c] if isinstance(run[c], str) else float(run[c])) for c in cols]
    return "wl-" + hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]


def _reference(df: pd.DataFrame, i) -> int | None:
    """Index of the row a throughput row's speed-up is over: a bf16 row (else fp32) of the same
    workload with finished runs; among several, the papers' baseline (naive, s = 1), then the
    row with the most runs. A bf16 reference ran the row's GEMM path (`kernels_executed`, native
    or emulated): a speed-up never divides a native row by an emulated one (fp32 has one path)."""
    same = df[(df["workload"] == df.at[i, "workload"]) & (df["n"] > 0)]
    for prec in FULL:
        cand = same[same["precision"] == prec]
        if prec != "fp32" and df.at[i, "precision"] != "fp32":
            cand = cand[cand["kernels_executed"] == df.at[i, "kernels_executed"]]
        if len(cand):
            order = cand.assign(_b=~((cand["correction"] == "naive") & (cand["uaq_s"] == 1.0)))
            return order.sort_values(["_b", "n"], ascending=[True, False], kind="stable").index[0]
    return None


def throughput_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rollout throughput per configuration (finished runs; means over seeds).

    gen_tokens_per_s: `perf/gen_tokens_per_s` (response tokens per second of generation), with
    per-seed values; speedup: over a BF16 (else FP32) row of the same workload (`_workload`), as
    a ratio (`speedup_ref`: its precision, `speedup_ref_key`: its group key), never across GEMM
    paths (`kernels_executed`, see `_reference`); sync_s:
    `timing_s/update_weights` per step; sync_share_pct and gen_share_pct: their mean share of
    `timing_s/step` (per run, ratio of means over RL steps, then averaged over seeds).
    """
    r = ensure_prepared(runs)
    r["sync_share"] = r["sync_s"] / r["step_s"]
    r["gen_share"] = r["gen_s"] / r["step_s"]
    r["workload"] = [_workload(row) for _, row in r.iterrows()]
    # a run that ended before it was tagged ran the path its config resolved to
    r["kernels_executed"] = [e or k for e, k in zip(r["kernels_executed"], r["kernels"])]
    # runs of one cell that ran different GEMM paths (node types of a cluster) are separate rows
    df = pooled_frame(r, "gen_tokens_per_s", axes=(*ROW_AXES, "kernels_executed", "workload"),
                      extra={"sync_s": lambda d: finished_mean(d, "sync_s"),
                             "step_s": lambda d: finished_mean(d, "step_s"),
                             "sync_share_pct": lambda d: finished_mean(d, "sync_share", 100.0),
                             "gen_share_pct": lambda d: finished_mean(d, "gen_share", 100.0)})
    df = df.rename(columns={"mean": "gen_tokens_per_s"}).drop(columns=["ci_low", "ci_high", "ci_method"])
    refs = [_reference(df, i) for i in df.index]
    df["speedup"] = [df.at[i, "gen_tokens_per_s"] / df.at[j, "gen_tokens_per_s"] if j is not None else math.nan
                     for i, j in zip(df.index, refs)]
    df["speedup_ref"] = [df.at[j, "precision"] if j is not None else "" for j in refs]
    df["speedup_ref_key"] = [df.at[j, "group_key"] if j is not None else "" for j in refs]
    return sort_rows(df, lead=("model", "task", "algo"))


# ------------------------------------------------------------------------------ KL drift


def kl_table(runs: pd.DataFrame) -> pd.DataFrame:
    """KL(quantized || full precision) drift per configuration: `rollout_corr/kl` at the first
    and last RL step (nats/token), means over finished seeds (per-seed last values in `values`),
    and their ratio."""
    r = ensure_prepared(runs)
    df = pooled_frame(r, "kl_last", extra={"kl_first": lambda d: finished_mean(d, "kl_first"),
                                           "last_step": lambda d: float(d["last_step"].max()) if len(d) else math.nan})
    df = df.rename(columns={"mean": "kl_last", "ci_low": "kl_last_ci_low", "ci_high": "kl_last_ci_high"})
    df["kl_growth"] = [growth(a, b) for a, b in zip(df["kl_first"], df["kl_last"])]
    return sort_rows(df)


# ------------------------------------------------------------------------------ per-benchmark scores (suite eval)


def eval_scores(runs: pd.DataFrame) -> pd.DataFrame:
    """The prepared run frame's `suite eval` scores, one row per run x (benchmark, engine, k)."""
    from suite.report.data import eval_rows

    return eval_rows(ensure_prepared(runs))


def group_lr_controls(scores: pd.DataFrame) -> list[tuple[float, float, float]]:
    """(s, lr factor, per-group LR s) of the scored runs' per-group LR controls (the UAQ control the
    paper does not run), for `paper_vs_uaq`."""
    if scores.empty:
        return []
    c = scores[scores["uaq_group_lr_s"] != 1.0]
    return sorted({(float(s), float(f), float(q)) for s, f, q in zip(c["uaq_s"], c["lr_factor"], c["uaq_group_lr_s"])})


def eval_table(runs: pd.DataFrame, n_resamples: int = N_RESAMPLES, seed: int = CI_SEED,
               scores: pd.DataFrame | None = None) -> pd.DataFrame:
    """Trained policies scored per benchmark (`suite eval`): accuracy (%) per configuration x benchmark x
    engine x k (samples per prompt), mean over finished seeds with its CI; `rollout_minus_ref` on a rollout
    row: its mean minus the bf16 (else fp32) row's of the same configuration, benchmark and k, the
    rollout engine's own error. Every benchmark is its own row: none is averaged with another.
    ``scores``: `eval_scores(runs)` where the caller has it already."""
    e = eval_scores(runs) if scores is None else scores
    # mean@k and pass@k are rows apart, and so are checkpoints: scores of different steps are never pooled
    axes = (*ROW_AXES, "benchmark", "engine", "k", "agg", "eval_step")
    df = pooled_frame(e, "eval_acc", 100.0, n_resamples, seed, axes=axes) if len(e) else pd.DataFrame(
        columns=[*axes, "group_key", "variant", "n", "mean", "ci_low", "ci_high", "ci_method", "seeds", "values",
                 "not_averaged", "recipe"])
    means = {(g, b, k, a, st, eng): m for g, b, k, a, st, eng, m in zip(
        df["group_key"], df["benchmark"], df["k"], df["agg"], df["eval_step"], df["engine"], df["mean"])}

    def diff(row) -> float:
        if row["engine"] != "rollout":
            return math.nan
        for ref in ("bf16", "fp32"):
            other = means.get((row["group_key"], row["benchmark"], row["k"], row["agg"], row["eval_step"], ref))
            if other is not None:
                return row["mean"] - other
        return math.nan

    df["rollout_minus_ref"] = [diff(r) for _, r in df.iterrows()]
    df = df.rename(columns={"mean": "acc_pct", "ci_low": "acc_ci_low", "ci_high": "acc_ci_high"})
    if df.empty:
        return df
    order = {e: i for i, e in enumerate(ENGINES)}
    df = sort_rows(df.assign(_e=df["engine"].map(order)).sort_values(["benchmark", "k", "agg", "eval_step", "_e"],
                                                                      kind="stable"))
    return df.drop(columns=["_e"])


# ------------------------------------------------------------------------------ run status

REASONS = {"FAILED": "the run failed", "KILLED": "the run was killed", "RUNNING": "not finished (or died unmarked)",
           MISSING: "an expected sweep cell with no MLflow run",
           SUPERSEDED: "a later FINISHED run of the same configuration and seed counts instead"}


def run_status(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run that is not averaged (FAILED, KILLED, RUNNING, SUPERSEDED, MISSING sweep cells), with why."""
    r = ensure_prepared(runs)
    cols = ["status", "reason", "cell", *GROUP, "precision", "fp8_granularity", "method", "uaq_s", "seed", "lr",
            "steps", "trainer_dtype", "last_step", ACC, "group_key", "run_name", "mlflow_run_id", "run_id"]
    df = r[r["status"] != FINISHED].assign(reason=lambda d: d["status"].map(REASONS).fillna(""))[cols].copy()
    df[ACC] = df[ACC] * 100
    return df.rename(columns={ACC: "acc_pct_latest"}).sort_values(["status", "cell", "run_name"]).reset_index(drop=True)


def status_counts(runs: pd.DataFrame) -> dict[str, int]:
    return {str(k): int(v) for k, v in runs["status"].value_counts().sort_index().items()}


# ------------------------------------------------------------------------------ all of them

def _captions() -> dict:
    """suite/report/captions.yaml: the tables' titles and captions, and the notes they share."""
    import importlib.resources

    import yaml

    return yaml.safe_load(importlib.resources.files("suite.report").joinpath("captions.yaml").read_text("utf-8"))


CAPTIONS = _captions()
PAPER_NOTE = CAPTIONS["notes"]["paper"]
ROWS_NOTE = CAPTIONS["notes"]["rows"]


def build_tables(runs: pd.DataFrame, paper: dict[str, pd.DataFrame], n_resamples: int = N_RESAMPLES,
                 seed: int = CI_SEED, bench: pd.DataFrame | None = None) -> dict[str, Table]:
    """Every table of the report, keyed by file stem. The run frame is prepared once here
    (`prepare`); each table reads that frame. ``bench``: `suite bench vllm` rows (paper.load_bench)
    for the throughput comparison."""
    runs = prepare(runs)
    ci = describe(n_resamples, seed)
    main = main_table(runs, n_resamples, seed)
    uaq = uaq_table(runs, n_resamples, seed)
    thr = throughput_table(runs)
    kl = kl_table(runs)
    status = run_status(runs)
    counts = ", ".join(f"{n} {s}" for s, n in status_counts(runs).items()) or "no runs"
    scores = eval_scores(runs)
    evals = eval_table(runs, n_resamples, seed, scores)
    pvm = paper_vs_main(scores, paper["main"])
    pvu = paper_vs_uaq(scores, paper["uaq"], group_lr_controls(scores))
    pvt = paper_vs_throughput(thr, paper["throughput"], bench)
    pvk = paper_vs_kl(kl, paper["kl"])
    fill = {"ci": ci, "rows": ROWS_NOTE, "paper": PAPER_NOTE, "counts": counts, "missing": MISSING}
    frames = {
        "main": (main, fmt.display_main(main)),
        "uaq_ablation": (uaq, fmt.display_uaq(uaq)),
        "throughput": (thr, fmt.display_throughput(thr)),
        "kl_drift": (kl, fmt.display_kl(kl)),
        "eval": (evals, fmt.display_eval(evals)),
        "paper_vs_main": (pvm, fmt.display_paper_vs(pvm)),
        "paper_vs_uaq": (pvu, fmt.display_paper_vs(pvu)),
        "paper_vs_throughput": (pvt, fmt.display_paper_vs_long(pvt, "throughput")),
        "paper_vs_kl": (pvk, fmt.display_paper_vs_long(pvk, "kl")),
        "runs_not_averaged": (status, fmt.display_status(status)),
    }
    text = CAPTIONS["tables"]
    built = {name: Table(name, text[name]["title"], text[name]["caption"].format(**fill), data, shown)
             for name, (data, shown) in frames.items()}
    # the papers' own tables, in their layouts: published values, ours beside them where scored
    both = pd.concat([pvm, pvu], ignore_index=True)
    for (paper_name, table), title in LAYOUTS.items():
        grid = layout(both, paper_name, table)
        if len(grid):
            name = f"layout_{paper_name.lower()}_{table}"
            built[name] = Table(name, title, CAPTIONS["notes"]["layout"].format(**fill), grid, grid)
    return built
