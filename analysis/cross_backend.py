"""The cross-backend study's checks (analysis/results/cross_backend/README.md), from its runs.csv.

    python analysis/study.py analysis/results/cross_backend --by backend,precision,correction
    python analysis/cross_backend.py analysis/results/cross_backend

Reads STUDY/runs.csv (one row per run, with a `backend` column: analysis/study.py) and writes
STUDY/checks.md and STUDY/checks.csv: per configuration (precision x correction), the embedded and
the verl numbers side by side and each pre-registered check with its verdict:
    1 step-0 held-out accuracy equal: |verl - embedded| <= max(0.05, 2 SE), SE binomial on n_eval prompts
    2 verl learns: mean (final - step 0) over seeds > 0, its 95% t-interval above 0
    3 final accuracies agree: |mean verl - mean embedded| <= max(0.05, 2 SE of the difference of means)
    4 INT8 k3 KL within 1.5x across backends (ratio of the means over seeds of each run's step mean)
    5 seconds per step side by side (no check)
    6 ACR - naive, paired by seed, per backend and precision: mean and 95% t-interval
Refuses runs of more than one CPU kind (`--cpu` names the kind; runs are never pooled across kinds).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from suite.report.stats import t_interval

BACKENDS = ("embedded", "verl")
N_EVAL = 256  # held-out prompts per evaluation (the study's task.n_eval)


def _mean_se(x: pd.Series) -> tuple[float, float, int]:
    x = x.dropna().to_numpy(dtype=float)
    n = x.size
    return (float(x.mean()) if n else math.nan, float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan, n)


def _fmt(v: float, f: str = ".3f") -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{f}}"


def checks(runs: pd.DataFrame, n_eval: int = N_EVAL) -> pd.DataFrame:
    """One row per (precision, correction): both backends' numbers and checks 1-5."""
    rows = []
    for (precision, correction), g in runs.groupby(["precision", "correction"], sort=True):
        side = {b: g[g["backend"] == b] for b in BACKENDS}
        row: dict = {"precision": precision, "correction": correction}
        for b, r in side.items():
            row[f"n_{b}"] = len(r)
            row[f"acc0_{b}"] = float(r["acc0"].mean()) if len(r) else math.nan
            row[f"acc_{b}"], row[f"acc_se_{b}"], _ = _mean_se(r["acc"])
            row[f"k3_kl_{b}"] = float(r["k3_kl_mean"].mean()) if len(r) else math.nan
            row[f"step_s_{b}"] = float(r["step_s"].mean()) if len(r) else math.nan
        a, e = row["acc0_verl"], row["acc0_embedded"]
        se0 = math.sqrt(a * (1 - a) / n_eval + e * (1 - e) / n_eval)
        row["check1_diff"], row["check1_bound"] = a - e, max(0.05, 2 * se0)
        row["check1"] = abs(a - e) <= row["check1_bound"]
        d = (side["verl"]["acc"] - side["verl"]["acc0"]).dropna().to_numpy(dtype=float)
        lo, hi = t_interval(d) if d.size > 1 else (math.nan, math.nan)
        row["check2_delta"], row["check2_low"], row["check2_high"] = float(d.mean()) if d.size else math.nan, lo, hi
        row["check2"] = bool(d.size > 1 and d.mean() > 0 and lo > 0)
        se = math.sqrt(row["acc_se_verl"] ** 2 + row["acc_se_embedded"] ** 2)
        row["check3_diff"], row["check3_bound"] = row["acc_verl"] - row["acc_embedded"], max(0.05, 2 * se)
        row["check3"] = abs(row["check3_diff"]) <= row["check3_bound"]
        ratio = row["k3_kl_verl"] / row["k3_kl_embedded"]
        row["k3_ratio"] = ratio
        row["check4"] = bool(1 / 1.5 <= ratio <= 1.5) if precision == "int8" else None
        rows.append(row)
    return pd.DataFrame(rows)


def acr_minus_naive(runs: pd.DataFrame) -> pd.DataFrame:
    """Check 6: ACR - naive final held-out accuracy, paired by seed, per backend and precision."""
    rows = []
    for (backend, precision), g in runs.groupby(["backend", "precision"], sort=True):
        w = g.pivot_table(index="seed", columns="correction", values="acc")
        if not {"acr", "naive"} <= set(w.columns):
            continue
        d = (w["acr"] - w["naive"]).dropna().to_numpy(dtype=float)
        lo, hi = t_interval(d) if d.size > 1 else (math.nan, math.nan)
        rows.append({"backend": backend, "precision": precision, "n": d.size, "mean": float(d.mean()),
                     "ci_low": lo, "ci_high": hi, "per_seed": " ".join(f"{v:+.3f}" for v in d)})
    return pd.DataFrame(rows)


def _verdict(v) -> bool | None:
    """A check's value as True / False, or None where it does not apply (NaN after a CSV round trip)."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else bool(v)


def markdown(table: pd.DataFrame, paired: pd.DataFrame, cpu: str) -> str:
    yes = {True: "holds", False: "**fails**", None: "-"}
    out = [f"# Cross-backend checks ({cpu})", "",
           "Accuracies are held-out greedy accuracy in %; E = embedded, V = verl on vLLM's CPU build; "
           "final = step 40; the bounds are the pre-registered ones (README).", "",
           "| rollout | correction | n E / V | step 0 E / V | check 1: V - E (bound) | V final - step 0 [95% CI] "
           "| check 2 | final E / V | check 3: V - E (bound) | k3 KL E / V (1e-4) | V / E | check 4 | s/step E / V |",
           "|" + "---|" * 13]
    for _, r in table.iterrows():
        out.append(
            f"| {r.precision} | {r.correction} | {r.n_embedded} / {r.n_verl} "
            f"| {100 * r.acc0_embedded:.1f} / {100 * r.acc0_verl:.1f} "
            f"| {100 * r.check1_diff:+.1f} ({100 * r.check1_bound:.1f}): {yes[bool(r.check1)]} "
            f"| {100 * r.check2_delta:+.1f} [{100 * r.check2_low:+.1f}, {100 * r.check2_high:+.1f}] "
            f"| {yes[bool(r.check2)]} | {100 * r.acc_embedded:.1f} / {100 * r.acc_verl:.1f} "
            f"| {100 * r.check3_diff:+.1f} ({100 * r.check3_bound:.1f}): {yes[bool(r.check3)]} "
            f"| {1e4 * r.k3_kl_embedded:.2f} / {1e4 * r.k3_kl_verl:.2f} | {r.k3_ratio:.2f} "
            f"| {yes[_verdict(r.check4)]} "
            f"| {r.step_s_embedded:.2f} / {r.step_s_verl:.2f} |")
    out += ["", "Check 6, ACR - naive final held-out accuracy (points), paired by seed:", "",
            "| backend | rollout | n | mean | 95% CI | per seed |", "|---|---|---|---|---|---|"]
    for _, r in paired.iterrows():
        out.append(f"| {r.backend} | {r.precision} | {r.n} | {100 * r['mean']:+.1f} "
                   f"| [{100 * r.ci_low:+.1f}, {100 * r.ci_high:+.1f}] "
                   f"| {' '.join(f'{100 * float(v):+.1f}' for v in r.per_seed.split())} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", type=Path, help="the study directory (its runs.csv from analysis/study.py)")
    p.add_argument("--cpu", required=True, help="the CPU kind every run ran on (named in the output)")
    p.add_argument("--n-eval", type=int, default=N_EVAL, help="held-out prompts per evaluation")
    args = p.parse_args(argv)
    runs = pd.read_csv(args.study / "runs.csv", dtype={"seed": "Int64"})
    unknown = sorted(set(runs["backend"].dropna()) - set(BACKENDS))
    if unknown:
        print(f"cross_backend: backend {', '.join(unknown)} in runs.csv; allowed: {', '.join(BACKENDS)}",
              file=sys.stderr)
        return 2
    table = checks(runs, args.n_eval)
    paired = acr_minus_naive(runs)
    table.to_csv(args.study / "checks.csv", index=False)
    (args.study / "checks.md").write_text(markdown(table, paired, args.cpu), encoding="utf-8")
    print((args.study / "checks.md").read_text())
    return 0 if np.isfinite(table[["acc_embedded", "acc_verl"]].to_numpy(dtype=float)).all() else 1


if __name__ == "__main__":
    sys.exit(main())
