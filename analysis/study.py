"""Summarise one laptop study from its `suite report` directory (analysis/results/README.md).

    python analysis/study.py analysis/results/collapse --by correction
    python analysis/study.py analysis/results/uaq --by uaq_s,lr,uaq_group_lr_s

Reads REPORT/data/runs.csv and history.csv (written by `suite report ... --out STUDY/report`)
and writes into STUDY/:
    runs.csv        one row per run: axes, final and mean metrics (mean rollout_corr/k3_kl included)
    summary.md      per configuration (the --by columns): n, per-seed values, mean and 95% CI
    summary.csv     the same numbers, full precision
    figures/*.png   curves over steps per configuration: mean over seeds, band = seeds' min..max
Intervals are suite.report.cells.cell_stats's (Student-t below 20 seeds), the same as the report's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from suite.report.cells import cell_stats

RUN_COLUMNS = [
    "run_id", "status", "backend", "precision", "correction", "method", "aligned_forward", "algo", "uaq_s",
    "uaq_group_lr_s", "lr", "seed", "steps", "last_step", "acc0", "acc", "acc_max", "delta_acc",
    "train_acc_first10", "train_acc_last10", "train_acc_mean", "kl_first", "kl_last", "kl_mean",
    "k3_kl_first5", "k3_kl_last10", "k3_kl_mean", "error_ratio_mean", "clipfrac_mean",
    "acr_relaxed_mean", "acr_tightened_mean", "visibility", "step_ratio", "step_s", "gen_tokens_per_s",
]
# (column, label, scale, format) of the summary table
SUMMARY = [
    ("acc0", "held-out acc, step 0 (%)", 100, ".1f"),
    ("acc", "held-out acc, final (%)", 100, ".1f"),
    ("delta_acc", "held-out acc, final - step 0 (pp)", 100, "+.1f"),
    ("acc_max", "held-out acc, best (%)", 100, ".1f"),
    ("train_acc_last10", "train acc, last 10 steps (%)", 100, ".1f"),
    ("k3_kl_mean", "k3 KL, mean over steps (1e-3)", 1e3, ".3f"),
    ("k3_kl_first5", "k3 KL, median first 5 steps (1e-3)", 1e3, ".3f"),
    ("k3_kl_last10", "k3 KL, median last 10 steps (1e-3)", 1e3, ".3f"),
    ("error_ratio_mean", "error-token rate, mean (%)", 100, ".2f"),
    ("clipfrac_mean", "clip fraction, mean (%)", 100, ".2f"),
    ("acr_relaxed_mean", "ACR relaxed, mean (%)", 100, ".1f"),
    ("acr_tightened_mean", "ACR tightened, mean (%)", 100, ".1f"),
    ("visibility", "update visibility, mean (%)", 100, ".3f"),
    ("step_s", "seconds per RL step (timing_s/step), mean", 1, ".2f"),
]
CURVES = [  # (metric, title, log y, rolling window, rolling statistic)
    ("train/acc", "train accuracy (rolling mean of 5 steps)", False, 5, "mean"),
    ("acc", "held-out accuracy (greedy)", False, 1, "mean"),
    ("rollout_corr/k3_kl", "rollout_corr/k3_kl (rolling median of 5)", True, 5, "median"),
    ("response/error_ratio", "error-token rate (rolling mean of 5)", False, 5, "mean"),
    ("actor/acr_relaxed_frac", "ACR relaxed fraction (rolling mean of 5)", False, 5, "mean"),
    ("actor/acr_tightened_frac", "ACR tightened fraction (rolling mean of 5)", False, 5, "mean"),
    ("quant/update_code_changed_frac", "weight-update visibility (rolling mean of 5)", True, 5, "mean"),
]


def _window(history: pd.DataFrame, key: str, steps, how: str) -> pd.Series:
    h = history[history["step"].isin(steps)].dropna(subset=[key]) if key in history else history.iloc[:0]
    g = h.groupby("mlflow_run_id")[key] if len(h) else None
    return (g.median() if how == "median" else g.mean()) if g is not None else pd.Series(dtype=float)


def run_table(runs: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """One row per finished run with the study columns (window summaries from the history)."""
    runs = runs[runs["status"] == "FINISHED"].copy()
    last = int(history["step"].max())
    ids = runs["mlflow_run_id"]
    windows = {
        "train_acc_first10": ("train/acc", range(1, 11), "mean"),
        "train_acc_last10": ("train/acc", range(last - 9, last + 1), "mean"),
        "k3_kl_first5": ("rollout_corr/k3_kl", range(1, 6), "median"),
        "k3_kl_last10": ("rollout_corr/k3_kl", range(last - 9, last + 1), "median"),
    }
    for col, (key, steps, how) in windows.items():
        runs[col] = ids.map(_window(history, key, steps, how)).to_numpy(dtype=float)
    runs["delta_acc"] = runs["acc"] - runs["acc0"]
    for col in RUN_COLUMNS:
        if col not in runs:
            runs[col] = np.nan
    order = ["backend", "precision", "correction", "uaq_s", "lr", "seed"]
    return runs[RUN_COLUMNS + ["mlflow_run_id"]].sort_values(order)


def summary_table(runs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    rows = []
    for key, g in runs.groupby(by, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        g = g.assign(group_key="-".join(map(str, key)))
        for col, label, scale, _ in SUMMARY:
            if g[col].notna().any():
                st = cell_stats(g, col, scale)
                rows.append({**dict(zip(by, key)), "metric": label, "column": col, **st})
    return pd.DataFrame(rows)


def summary_markdown(summary: pd.DataFrame, by: list[str]) -> str:
    fmt = {label: f for _, label, _, f in SUMMARY}
    lines = []
    for label in [s[1] for s in SUMMARY]:
        part = summary[summary["metric"] == label]
        if part.empty:
            continue
        f = fmt[label]
        lines += [f"### {label}", "", "| " + " | ".join(by) + " | n | mean | 95% CI | per seed |",
                  "|" + "---|" * (len(by) + 4)]
        for _, r in part.iterrows():
            ci = "" if np.isnan(r["ci_low"]) else f"[{r['ci_low']:{f}}, {r['ci_high']:{f}}]"
            vals = ", ".join(f"{s}: {float(v):{f}}" for s, v in zip(r["seeds"].split(), r["values"].split()))
            lines.append("| " + " | ".join(str(r[b]) for b in by) + f" | {r['n']} | {r['mean']:{f}} | {ci} | {vals} |")
        lines.append("")
    return "\n".join(lines)


def curves(history: pd.DataFrame, runs: pd.DataFrame, by: list[str], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    labels = runs.set_index("mlflow_run_id")[by].astype(str).agg(" ".join, axis=1)
    h = history[history["mlflow_run_id"].isin(labels.index)].copy()
    h["config"] = h["mlflow_run_id"].map(labels)
    written = []
    for key, title, log, win, how in CURVES:
        if key not in h or h[key].notna().sum() == 0:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for config, g in h.dropna(subset=[key]).groupby("config"):
            wide = g.pivot_table(index="step", columns="mlflow_run_id", values=key)
            if win > 1:
                roll = wide.rolling(win, min_periods=1)
                wide = roll.median() if how == "median" else roll.mean()
            ax.plot(wide.index, wide.mean(axis=1), label=f"{config} (n={wide.shape[1]})")
            ax.fill_between(wide.index, wide.min(axis=1), wide.max(axis=1), alpha=0.2)
        if key == "rollout_corr/k3_kl":
            for y in (0.002, 0.025):
                ax.axhline(y, color="grey", lw=0.8, ls=":")
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("RL step")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, title=" ".join(by), title_fontsize=7)
        name = key.replace("/", "_")
        fig.savefig(out / f"{name}.png", bbox_inches="tight", dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", type=Path, help="the study directory; its report is in STUDY/report")
    p.add_argument("--by", required=True, help="comma-separated run columns that name a configuration")
    args = p.parse_args(argv)
    by = args.by.split(",")
    data = args.study / "report" / "data"
    runs = pd.read_csv(data / "runs.csv", dtype={"seed": "Int64"})
    history = pd.read_csv(data / "history.csv")
    table = run_table(runs, history)
    table.to_csv(args.study / "runs.csv", index=False)
    summary = summary_table(table, by)
    summary.to_csv(args.study / "summary.csv", index=False)
    (args.study / "summary.md").write_text(summary_markdown(summary, by), encoding="utf-8")
    figs = curves(history, table, by, args.study / "figures")
    print(f"{args.study}: {len(table)} finished runs, {summary[by].drop_duplicates().shape[0]} configurations, "
          f"figures {', '.join(figs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
