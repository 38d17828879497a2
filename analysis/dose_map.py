"""The dose-response map (analysis/results/dose_response/README.md): mismatch dose x policy movement
x correction, paired by seed, with the mechanism.

    python analysis/dose_map.py                      # reads ./mlflow.db, writes analysis/results/dose_response
    python analysis/dose_map.py --tracking-uri sqlite:///other.db --out DIR

Reads every finished run of the MLflow experiment `study_dose_response` (`suite.report.data.load_runs`:
the same per-run summaries as `suite report`), names its dose (fp32, or INT8 with its outlier alpha
and channels), its movement level (mini-batches x epochs x lr) and its machine (the run's `cpu_flags`
tag), and writes into --out:
    runs.csv          one row per run: dose, movement, correction, seed, precision, CPU kind, first and
                      final held-out accuracy of the fp32 model and of its quantized rollout copy, the
                      mean k3 KL and the mechanism's means (r tails, clip high / low, ppo_kl, R's p99,
                      entropy, gradient norm, error tokens, ACR's inversions, the gradient probe)
    summary.csv/.md   per movement x dose x correction: n, per-seed values, mean and t-interval; and
                      the paired differences (naive, bypass, ACR minus TIS, per seed) with t-intervals
    figures/dose_response.png   k3 KL (x, per cell) against the paired difference in final held-out
                      accuracy (y, with its interval), one line per movement level; bypass's clip
                      fraction against k3 KL
Kinds of machine are never pooled: a run whose CPU kind differs from the map's first is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from suite.report.stats import mean_ci

EXPERIMENT = "study_dose_response"
REFERENCE = "tis"  # the paired differences are arm - TIS, per seed
ARMS = ("naive", "bypass", "tis", "acr")
MECHANISM = ["k3_kl_mean", "kl_mean", "clipfrac_mean", "clip_high_mean", "clip_low_mean", "ppo_kl_mean",
             "ratio_p99_mean", "r_p1_mean", "r_p99_mean", "r_frac_below_half_mean", "r_frac_above_2_mean",
             "entropy_mean", "grad_norm_mean", "error_ratio_mean", "acr_inverted_mean", "grad_probe_cos_mean",
             "grad_probe_norm_ratio_mean", "step_s"]
COLUMNS = ["run_id", "cpu_flags", "dose", "precision", "outlier_alpha", "outlier_channels", "movement",
           "minibatches", "epochs", "lr", "correction", "seed", "steps", "acc0", "acc", "acc_rollout0",
           "acc_rollout_final", *MECHANISM, "wall_s", "mlflow_run_id"]
# (column, label, scale, format) of the per-cell summary
SUMMARY = [("acc", "held-out acc of the fp32 model, final (%)", 100, ".1f"),
           ("acc_rollout_final", "held-out acc of the quantized rollout copy, final (%)", 100, ".1f"),
           ("k3_kl_mean", "k3 KL, mean over steps (1e-3)", 1e3, ".3f"),
           ("clipfrac_mean", "PPO clip fraction, mean (%)", 100, ".2f"),
           ("r_frac_above_2_mean", "r > 2, fraction of tokens (%)", 100, ".3f"),
           ("grad_probe_cos_mean", "cosine of naive and TIS gradients, mean", 1, ".4f")]


def _cfg(row) -> dict:
    return json.loads(row["config"]) if isinstance(row.get("config"), str) and row["config"] else {}


def _get(cfg: dict, key: str, default=None):
    if key in cfg:
        return cfg[key]
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def dose_label(precision: str, alpha: float, channels: int) -> str:
    if precision != "int8":
        return precision
    return f"int8-a{alpha:g}" + ("" if channels == 4 else f"-c{channels}")


def movement_label(minibatches: int, epochs: int, lr: float) -> str:
    return f"mb{minibatches}-ep{epochs}-lr{lr:g}"


def load(tracking_uri: str, experiment: str = EXPERIMENT) -> pd.DataFrame:
    """One row per finished run (COLUMNS)."""
    from mlflow.tracking import MlflowClient

    from suite.report.data import load_runs

    data = load_runs(tracking_uri, experiment=experiment)
    runs = data.runs[data.runs["status"] == "FINISHED"].copy()
    client = MlflowClient(tracking_uri)
    rows = []
    for _, r in runs.iterrows():
        cfg = _cfg(r)
        alpha = float(_get(cfg, "quant.outlier_alpha", 1.0))
        channels = int(_get(cfg, "quant.outlier_channels", 4))
        mb, ep = int(_get(cfg, "train.minibatches", 2)), int(_get(cfg, "train.epochs", 1))
        lr = float(r["lr"])
        run = client.get_run(r["mlflow_run_id"])
        info = run.info
        rows.append({**{c: r.get(c, np.nan) for c in COLUMNS},
                     "cpu_flags": run.data.tags.get("cpu_flags", "unknown"),
                     "dose": dose_label(r["precision"], alpha, channels), "outlier_alpha": alpha,
                     "outlier_channels": channels, "movement": movement_label(mb, ep, lr), "minibatches": mb,
                     "epochs": ep, "lr": lr, "wall_s": (info.end_time - info.start_time) / 1e3})
    out = pd.DataFrame(rows, columns=COLUMNS)
    kinds = out["cpu_flags"].unique().tolist()
    if len(kinds) > 1:
        raise SystemExit(f"runs from {len(kinds)} CPU kinds ({kinds}): a map never pools kinds; "
                         "filter the runs or use one store per kind")
    return out.sort_values(["movement", "outlier_channels", "outlier_alpha", "correction", "seed"])


def _ci(vals) -> dict:
    mean, lo, hi, method = mean_ci(np.asarray(vals, dtype=float))
    return {"n": int(np.isfinite(vals).sum()), "mean": mean, "ci_low": lo, "ci_high": hi, "method": method}


def cell_summary(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (mov, dose, corr), g in runs.groupby(["movement", "dose", "correction"], sort=True):
        g = g.sort_values("seed")
        for col, label, scale, _ in SUMMARY:
            vals = g[col].to_numpy(dtype=float) * scale
            if not np.isfinite(vals).any():
                continue
            rows.append({"movement": mov, "dose": dose, "correction": corr, "metric": label, **_ci(vals),
                         "seeds": " ".join(str(int(s)) for s in g["seed"]),
                         "values": " ".join(f"{v:.4g}" for v in vals)})
    return pd.DataFrame(rows)


def paired(runs: pd.DataFrame, col: str = "acc", scale: float = 100.0) -> pd.DataFrame:
    """Per movement x dose, arm - TIS of `col` x `scale`, per seed (seeds both arms finished)."""
    rows = []
    for (mov, dose), g in runs.groupby(["movement", "dose"], sort=True):
        ref = g[g["correction"] == REFERENCE].set_index("seed")[col]
        k3 = g["k3_kl_mean"].mean()
        for arm in ARMS:
            if arm == REFERENCE:
                continue
            a = g[g["correction"] == arm].set_index("seed")[col]
            seeds = sorted(set(a.index) & set(ref.index))
            if not seeds:
                continue
            d = (a.loc[seeds] - ref.loc[seeds]).to_numpy(dtype=float) * scale
            rows.append({"movement": mov, "dose": dose, "k3_kl": k3, "comparison": f"{arm} - {REFERENCE}",
                         "column": col, **_ci(d), "seeds": " ".join(map(str, seeds)),
                         "values": " ".join(f"{v:+.2f}" for v in d)})
    return pd.DataFrame(rows, columns=["movement", "dose", "k3_kl", "comparison", "column", "n", "mean", "ci_low",
                                       "ci_high", "method", "seeds", "values"])


def markdown(cells: pd.DataFrame, pairs: pd.DataFrame) -> str:
    lines = ["# Dose-response map: summary", "",
             "95% t-intervals over seeds (Student-t, n - 1 degrees of freedom); paired differences are "
             "per seed, arm minus TIS.", "", "## Paired differences in final held-out accuracy (pp)", "",
             "| movement | dose | k3 KL | comparison | n | mean | 95% CI | per seed |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in pairs.iterrows():
        ci = "" if np.isnan(r["ci_low"]) else f"[{r['ci_low']:+.1f}, {r['ci_high']:+.1f}]"
        lines.append(f"| {r['movement']} | {r['dose']} | {r['k3_kl']:.2e} | {r['comparison']} | {r['n']} | "
                     f"{r['mean']:+.1f} | {ci} | {r['values']} |")
    fmt = {label: f for _, label, _, f in SUMMARY}
    for label in fmt:
        part = cells[cells["metric"] == label]
        if part.empty:
            continue
        f = fmt[label]
        lines += ["", f"## {label}", "", "| movement | dose | correction | n | mean | 95% CI | per seed |",
                  "|---|---|---|---|---|---|---|"]
        for _, r in part.iterrows():
            ci = "" if np.isnan(r["ci_low"]) else f"[{r['ci_low']:{f}}, {r['ci_high']:{f}}]"
            lines.append(f"| {r['movement']} | {r['dose']} | {r['correction']} | {r['n']} | {r['mean']:{f}} | {ci} | "
                         f"{r['values']} |")
    return "\n".join(lines) + "\n"


def figure(runs: pd.DataFrame, pairs: pd.DataFrame, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, comp in zip(axes[:2], ("naive - tis", "bypass - tis")):
        part = pairs[pairs["comparison"] == comp]
        for mov, g in part.groupby("movement", sort=True):
            g = g.sort_values("k3_kl")
            err = np.vstack([g["mean"] - g["ci_low"], g["ci_high"] - g["mean"]])
            ax.errorbar(g["k3_kl"], g["mean"], yerr=np.nan_to_num(err), marker="o", capsize=3, label=mov)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("k3 KL (mean over steps of the cell's runs)")
        ax.set_ylabel(f"{comp}: final held-out accuracy (pp)")
        ax.set_title(f"{comp}, paired by seed, 95% t-interval", fontsize=10)
        ax.legend(fontsize=7, title="movement", title_fontsize=7)
    ax = axes[2]
    by = runs[runs["correction"] == "bypass"].groupby(["movement", "dose"])[["k3_kl_mean", "clipfrac_mean"]].mean()
    for mov, g in by.reset_index().groupby("movement", sort=True):
        g = g.sort_values("k3_kl_mean")
        ax.plot(g["k3_kl_mean"], g["clipfrac_mean"] * 100, marker="o", label=mov)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("k3 KL")
    ax.set_ylabel("bypass: PPO clip fraction (%)")
    ax.set_title("bypass's clip rate against dose", fontsize=10)
    ax.legend(fontsize=7, title="movement", title_fontsize=7)
    path = out / "dose_response.png"
    fig.savefig(path, bbox_inches="tight", dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    p.add_argument("--experiment", default=EXPERIMENT)
    p.add_argument("--steps", type=int, default=100,
                   help="the map's run length (the probe's 60-step round 1 is left out)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dose_response")
    args = p.parse_args(argv)
    runs = load(args.tracking_uri, args.experiment)
    runs = runs[runs["steps"] == args.steps]
    args.out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(args.out / "runs.csv", index=False)
    cells, pairs = cell_summary(runs), paired(runs)
    pd.concat([cells.assign(kind="cell"), pairs.assign(kind="paired")]).to_csv(args.out / "summary.csv", index=False)
    (args.out / "summary.md").write_text(markdown(cells, pairs), encoding="utf-8")
    fig = figure(runs, pairs, args.out / "figures")
    print(f"{args.out}: {len(runs)} finished runs on {runs['cpu_flags'].iloc[0] if len(runs) else '-'}; "
          f"{len(pairs)} paired comparisons; {fig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
