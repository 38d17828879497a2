"""Per-run summaries of a run's metric history (`summarize`), the columns `runs.csv` carries
beside the axes: what `suite.report.data.load_runs` adds after reading the history."""

from __future__ import annotations

import numpy as np
import pandas as pd

ACC = "acc"  # the run's held-out accuracy (val-core/<task>/acc/mean_at_1, or its acc_metric), a fraction in [0, 1]
ACC_ROLLOUT = "acc_rollout"  # its quantized rollout copy's (val-aux/<task>/rollout_acc/mean_at_1)


# Per-run means (over RL steps) of the mechanism's metrics, the runs.csv column -> its key (docs/metrics.md).
MECHANISM_MEANS = {
    "r_p1_mean": "rollout_corr/ratio_p1",
    "r_p99_mean": "rollout_corr/ratio_p99",
    "r_frac_below_half_mean": "rollout_corr/ratio_frac_below_0.5",
    "r_frac_above_2_mean": "rollout_corr/ratio_frac_above_2",
    "clip_high_mean": "actor/pg_clipfrac_high_bound",
    "clip_low_mean": "actor/pg_clipfrac_low_bound",
    "ppo_kl_mean": "actor/ppo_kl",
    "ratio_p99_mean": "actor/ratio_p99",
    "entropy_mean": "actor/entropy",
    "grad_norm_mean": "actor/grad_norm",
    "rep4_rate_mean": "response/rep4_rate/mean",
    "acr_inverted_mean": "actor/acr_inverted_frac",
    "grad_probe_cos_mean": "actor/grad_probe_cos",
    "grad_probe_norm_ratio_mean": "actor/grad_probe_norm_ratio",
}


def _first_last(history: pd.DataFrame, col: str):
    """(first, last) logged value of `col` per run, by step, over the rows where it is set; (nan,
    nan) when the history has no such column."""
    if col not in history.columns:
        return np.nan, np.nan
    g = history.dropna(subset=[col]).sort_values("step").groupby("mlflow_run_id")[col]
    return g.first(), g.last()


def summarize(runs: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """Per-run summaries of the history, added as columns of `runs` (pure):

    acc0 (held-out accuracy at step 0, before RL), kl_first / kl_last (`rollout_corr/kl` at the
    first and last RL step), and over RL steps (step >= 1) the means visibility
    (`quant/update_code_changed_frac`), step_ratio (`quant/update_step_ratio`), gen_tokens_per_s
    (`perf/gen_tokens_per_s`), sync_s (`timing_s/update_weights`), gen_s (`timing_s/gen`),
    step_s (`timing_s/step`), the mismatch kl_mean / k3_kl_mean (`rollout_corr/kl`, `k3_kl`),
    train_acc_mean (`train/acc`), error_ratio_mean (`response/error_ratio`), clipfrac_mean
    (`actor/pg_clipfrac`), acr_relaxed_mean / acr_tightened_mean (`actor/acr_*_frac`, ACR runs), and
    the mechanism (MECHANISM_MEANS: r's tails, the clip fraction at each bound, ppo_kl, R's p99,
    entropy, pre-clip gradient norm, the repeated-4-gram rate, ACR's inverted-bound fraction, the
    naive-vs-TIS gradient probe); acc_max (best held-out accuracy, step 0 included); acc_rollout0 /
    acc_rollout_final (the quantized rollout copy's held-out accuracy at step 0 and at its last
    evaluation, runs with task.eval_rollout_copy); last_step: the last step any metric was
    logged at. A mean over a metric a run never logged is NaN.
    """
    out = runs.copy()
    h = history
    means = {
        "visibility": "quant/update_code_changed_frac",
        "step_ratio": "quant/update_step_ratio",
        "gen_tokens_per_s": "perf/gen_tokens_per_s",
        "sync_s": "timing_s/update_weights",
        "gen_s": "timing_s/gen",
        "step_s": "timing_s/step",
        "kl_mean": "rollout_corr/kl",
        "k3_kl_mean": "rollout_corr/k3_kl",
        "train_acc_mean": "train/acc",
        "error_ratio_mean": "response/error_ratio",
        "clipfrac_mean": "actor/pg_clipfrac",
        "acr_relaxed_mean": "actor/acr_relaxed_frac",
        "acr_tightened_mean": "actor/acr_tightened_frac",
        **MECHANISM_MEANS,
    }
    new = pd.DataFrame(index=out["mlflow_run_id"])
    if h.empty:
        for col in ("acc0", "acc_max", "acc_rollout0", "acc_rollout_final", "kl_first", "kl_last", "last_step",
                    *means):
            new[col] = np.nan
    else:
        g = h.groupby("mlflow_run_id")
        new["last_step"] = g["step"].max()
        new["acc0"] = h[h["step"] == 0].set_index("mlflow_run_id")[ACC]
        new["acc_max"] = g[ACC].max()
        new["acc_rollout0"] = h[h["step"] == 0].set_index("mlflow_run_id")[ACC_ROLLOUT] \
            if ACC_ROLLOUT in h.columns else np.nan
        new["acc_rollout_final"] = _first_last(h, ACC_ROLLOUT)[1]
        rl = h[h["step"] >= 1]
        new["kl_first"], new["kl_last"] = _first_last(rl, "rollout_corr/kl")
        grl = rl.groupby("mlflow_run_id")
        for col, key in means.items():
            new[col] = grl[key].mean() if key in rl.columns else np.nan
    new = new.reindex(out["mlflow_run_id"])
    for col in new.columns:
        out[col] = new[col].to_numpy(dtype=float)
    return out
