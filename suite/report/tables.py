"""The papers' tables as pure functions of the tidy run frame (`suite.report.data`).

Each table function takes DataFrames and returns a numeric DataFrame (written as CSV); a
`display_*` companion formats it for Markdown, LaTeX and HTML. Only FINISHED runs are
averaged; every other run (FAILED, KILLED, RUNNING, or an expected sweep cell with no run,
MISSING) is counted in the `not averaged` column of its row and listed by `run_status`.
A grid cell with no finished run stays in the table with n = 0, shown as "missing".

Accuracy is reported in percent (the papers' unit): the run's last held-out accuracy
(`val-core/<task>/acc/mean@1`) x 100, mean over seeds with a seeded percentile bootstrap 95%
confidence interval (Efron & Tibshirani 1993, ch. 13; rliable uses the same for RL scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from suite.report.data import ACC, FINISHED, MISSING

N_RESAMPLES = 10_000  # bootstrap resamples (>= 2,000 for stable 2.5% / 97.5% percentiles)
CI_SEED = 0  # bootstrap seed: the same runs always give the same interval
GROUP = ("task", "model", "algo")  # a measured "setting": rows compare only within one
LOW_BIT = ("int8", "fp8", "w4a16")
FULL = ("bf16", "fp32")
# The papers' main grid: the full-precision baseline and naive / TIS / ACR at INT8 and FP8.
MAIN_GRID = (("bf16", "BF16"),) + tuple((p, m) for p in ("int8", "fp8") for m in ("naive", "TIS", "ACR"))
QARL_ROWS = (("w4a16", "naive"), ("w4a16", "aligned+TBPO"), ("bf16", "TBPO"))  # shown when any w4a16/TBPO run exists
UAQ_GRID = ((1.0, 1.0), (1.25, 1.0), (1.5, 1.0), (2.0, 1.0), (1.0, 1.5), (1.0, 2.0))  # (s, lr factor), QuRL ablation
PAPER_LABEL = "paper"  # column prefix of published values (their models, GPUs, benchmarks)
MEASURED_LABEL = "measured"  # column prefix of values from the runs at hand


def bootstrap_ci(values, n_resamples: int = N_RESAMPLES, seed: int = CI_SEED, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean of `values`.

    Draws `n_resamples` resamples of len(values) with replacement (numpy Generator(PCG64)
    seeded with `seed`, one `integers(0, n, size=(n_resamples, n))` call) and returns the
    (1-level)/2 and (1+level)/2 percentiles of the resample means (numpy's linear
    interpolation). One value gives (x, x); none gives (nan, nan).
    """
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return (math.nan, math.nan)
    if x.size == 1:
        return (float(x[0]), float(x[0]))
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_resamples, x.size))  # [B, n]
    means = x[idx].mean(axis=1)  # [B]
    lo, hi = np.percentile(means, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return (float(lo), float(hi))


def _others(group: pd.DataFrame) -> str:
    """'1 FAILED, 2 RUNNING' for the runs of a cell that are not averaged."""
    counts = group.loc[group["status"] != FINISHED, "status"].value_counts()
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def _stats(group: pd.DataFrame, col: str, scale: float, n_resamples: int, seed: int) -> dict:
    done = group[group["status"] == FINISHED]
    vals = done[col].to_numpy(dtype=float) * scale
    vals = vals[~np.isnan(vals)]
    lo, hi = bootstrap_ci(vals, n_resamples, seed)
    return {
        "n": int(vals.size),
        "mean": float(vals.mean()) if vals.size else math.nan,
        "ci_low": lo,
        "ci_high": hi,
        "seeds": " ".join(str(s) for s in sorted(done["seed"].dropna().astype(int))),
        "not_averaged": _others(group),
    }


def _base_lr(runs: pd.DataFrame) -> pd.Series:
    """Each run's reference learning rate: the most common lr among finished runs of its
    (task, model, algo) setting (ties: the smaller). LR controls are runs away from it."""
    done = runs[(runs["status"] == FINISHED) & runs["lr"].notna()]
    ref = {}
    for key, g in done.groupby(list(GROUP)):
        counts = g["lr"].value_counts()
        ref[key] = float(min(counts[counts == counts.max()].index))
    return pd.Series([ref.get(tuple(r), math.nan) for r in runs[list(GROUP)].itertuples(index=False)], index=runs.index)


def with_lr_factor(runs: pd.DataFrame) -> pd.DataFrame:
    out = runs.copy()
    base = _base_lr(out)
    factor = (out["lr"] / base).round(6)
    out["lr_factor"] = factor.where(base.notna() & out["lr"].notna(), 1.0)
    return out


def _settings(runs: pd.DataFrame) -> list[tuple]:
    return sorted({tuple(r) for r in runs[list(GROUP)].itertuples(index=False) if all(r)})


# ------------------------------------------------------------------------------ main table


def main_table(runs: pd.DataFrame, n_resamples: int = N_RESAMPLES, seed: int = CI_SEED) -> pd.DataFrame:
    """QuRL/QaRL main table: held-out accuracy (%) per task for each precision x method.

    Rows: (task, model, algo, precision, method, uaq_s) over runs at their setting's reference
    learning rate (LR controls belong to `uaq_table`), plus the papers' grid (BF16; naive/TIS/ACR
    at INT8 and FP8; QaRL's rows when any W4A16 or TBPO run exists) with n = 0 where nothing ran.
    """
    r = with_lr_factor(runs)
    r = r[r["lr_factor"] == 1.0]
    keys = [*GROUP, "precision", "method", "uaq_s"]
    rows = []
    for key, g in r.groupby(keys, dropna=False, sort=True):
        rows.append({**dict(zip(keys, key)), **_stats(g, ACC, 100.0, n_resamples, seed)})
    have = {tuple(row[k] for k in (*GROUP, "precision", "method")) for row in rows}
    qarl = bool(((runs["precision"] == "w4a16") | (runs["correction"] == "tbpo")).any())
    for setting in _settings(runs):
        for prec, meth in MAIN_GRID + (QARL_ROWS if qarl else ()):
            if (*setting, prec, meth) not in have:
                rows.append({**dict(zip(GROUP, setting)), "precision": prec, "method": meth, "uaq_s": math.nan,
                             "n": 0, "mean": math.nan, "ci_low": math.nan, "ci_high": math.nan, "seeds": "",
                             "not_averaged": ""})
    cols = [*keys, "n", "mean", "ci_low", "ci_high", "seeds", "not_averaged"]
    df = pd.DataFrame(rows, columns=cols).rename(columns={"mean": "acc_pct", "ci_low": "acc_ci_low", "ci_high": "acc_ci_high"})
    order = {p: i for i, p in enumerate(("fp32", "bf16", "int8", "fp8", "w4a16"))}
    morder = {m: i for i, m in enumerate(("FP32", "BF16", "naive", "TIS", "ACR", "TBPO", "aligned+naive", "aligned+TIS",
                                          "aligned+ACR", "aligned+TBPO"))}
    df = df.assign(_p=df["precision"].map(order).fillna(9), _m=df["method"].map(morder).fillna(99))
    return df.sort_values([*GROUP, "_p", "_m", "uaq_s"]).drop(columns=["_p", "_m"]).reset_index(drop=True)


# ------------------------------------------------------------------------------ UAQ ablation


def uaq_label(s: float, lr_factor: float) -> str:
    if math.isnan(s):
        return "?"
    name = "no UAQ (s=1)" if s == 1.0 else f"s={s:g}"
    if lr_factor != 1.0:
        return f"LR x{lr_factor:g} ({'s=1' if s == 1.0 else name})"
    return name


def uaq_table(runs: pd.DataFrame, n_resamples: int = N_RESAMPLES, seed: int = CI_SEED) -> pd.DataFrame:
    """QuRL UAQ ablation: accuracy (%) and weight-update visibility per UAQ scale s and LR control.

    Low-bit runs only (UAQ acts on the quantizer). visibility_pct: mean over RL steps and seeds
    of `quant/update_code_changed_frac` x 100 (codes changed per step); step_ratio: mean of
    `quant/update_step_ratio` (|dW| / quantization step). Settings with two or more (s, LR)
    variants also get the paper's grid (s = 1, 1.25, 1.5, 2; LR x1.5 and x2 at s = 1), n = 0
    where nothing ran.
    """
    r = with_lr_factor(runs[runs["precision"].isin(LOW_BIT)])
    keys = [*GROUP, "precision", "method", "uaq_s", "lr_factor"]
    rows = []
    for key, g in r.groupby(keys, dropna=False, sort=True):
        done = g[g["status"] == FINISHED]
        rows.append({**dict(zip(keys, key)), **_stats(g, ACC, 100.0, n_resamples, seed),
                     "visibility_pct": float(done["visibility"].mean() * 100) if len(done) else math.nan,
                     "step_ratio": float(done["step_ratio"].mean()) if len(done) else math.nan})
    df = pd.DataFrame(rows, columns=[*keys, "n", "mean", "ci_low", "ci_high", "seeds", "not_averaged",
                                     "visibility_pct", "step_ratio"])
    extra = []
    for gkey, g in df.groupby([*GROUP, "precision", "method"]):
        present = {(float(s), float(f)) for s, f in zip(g["uaq_s"], g["lr_factor"])}
        if len(present) < 2:
            continue
        for s, f in UAQ_GRID:
            if (s, f) not in present:
                extra.append({**dict(zip([*GROUP, "precision", "method"], gkey)), "uaq_s": s, "lr_factor": f, "n": 0,
                              "mean": math.nan, "ci_low": math.nan, "ci_high": math.nan, "seeds": "", "not_averaged": "",
                              "visibility_pct": math.nan, "step_ratio": math.nan})
    if extra:
        df = pd.concat([df, pd.DataFrame(extra)], ignore_index=True)
    df.insert(len(GROUP) + 2, "setting", [uaq_label(s, f) for s, f in zip(df["uaq_s"], df["lr_factor"])])
    df = df.rename(columns={"mean": "acc_pct", "ci_low": "acc_ci_low", "ci_high": "acc_ci_high"})
    return df.sort_values([*GROUP, "precision", "method", "lr_factor", "uaq_s"]).reset_index(drop=True)


# ------------------------------------------------------------------------------ throughput


def throughput_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rollout throughput per precision and model size (finished runs; means over runs).

    gen_tokens_per_s: `perf/gen_tokens_per_s` (response tokens per second of generation);
    speedup: over the same model's BF16 runs (FP32 when no BF16 ran), as a ratio; sync_s:
    `timing_s/update_weights` per step; sync_share_pct and gen_share_pct: their mean share of
    `timing_s/step` (per run, ratio of means over RL steps, then averaged over runs).
    """
    r = runs.copy()
    r["sync_share"] = r["sync_s"] / r["step_s"]
    r["gen_share"] = r["gen_s"] / r["step_s"]
    rows = []
    for (model, prec), g in r.groupby(["model", "precision"], sort=True):
        done = g[g["status"] == FINISHED]
        rows.append({"model": model, "precision": prec, "n": len(done),
                     "gen_tokens_per_s": done["gen_tokens_per_s"].mean(), "sync_s": done["sync_s"].mean(),
                     "step_s": done["step_s"].mean(), "sync_share_pct": done["sync_share"].mean() * 100,
                     "gen_share_pct": done["gen_share"].mean() * 100, "not_averaged": _others(g)})
    df = pd.DataFrame(rows, columns=["model", "precision", "n", "gen_tokens_per_s", "sync_s", "step_s",
                                     "sync_share_pct", "gen_share_pct", "not_averaged"])
    ref_prec, speed = [], []
    for _, row in df.iterrows():
        same = df[(df["model"] == row["model"]) & (df["n"] > 0)]
        ref = next((p for p in ("bf16", "fp32") if p in set(same["precision"])), None)
        ref_prec.append(ref or "")
        base = same.loc[same["precision"] == ref, "gen_tokens_per_s"].iloc[0] if ref else math.nan
        speed.append(row["gen_tokens_per_s"] / base if ref else math.nan)
    df.insert(4, "speedup", speed)
    df.insert(5, "speedup_ref", ref_prec)
    order = {p: i for i, p in enumerate(("fp32", "bf16", "int8", "fp8", "w4a16"))}
    return df.assign(_p=df["precision"].map(order)).sort_values(["model", "_p"]).drop(columns="_p").reset_index(drop=True)


# ------------------------------------------------------------------------------ KL drift


def _growth(first: float, last: float) -> float:
    """last / first when both are positive; the k1 estimate of a tiny KL can be negative, and a
    ratio with a negative end says nothing about drift."""
    return last / first if first > 0 and last > 0 else math.nan


def kl_table(runs: pd.DataFrame) -> pd.DataFrame:
    """KL(quantized || full precision) drift per configuration: `rollout_corr/kl` at the first
    and last RL step (nats/token), means over finished seeds, and their ratio."""
    keys = [*GROUP, "precision", "method", "uaq_s"]
    rows = []
    for key, g in runs.groupby(keys, dropna=False, sort=True):
        done = g[g["status"] == FINISHED]
        first, last = done["kl_first"].mean(), done["kl_last"].mean()
        rows.append({**dict(zip(keys, key)), "n": len(done), "kl_first": first, "kl_last": last,
                     "kl_growth": _growth(first, last),
                     "last_step": done["last_step"].max(), "not_averaged": _others(g)})
    return pd.DataFrame(rows, columns=[*keys, "n", "kl_first", "kl_last", "kl_growth", "last_step", "not_averaged"])


# ------------------------------------------------------------------------------ run status


def run_status(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run that is not averaged (FAILED, KILLED, RUNNING, ..., MISSING sweep cells)."""
    cols = ["status", "cell", *GROUP, "precision", "method", "uaq_s", "seed", "lr", "last_step", ACC, "run_name",
            "mlflow_run_id", "run_id"]
    df = runs.loc[runs["status"] != FINISHED, cols].copy()
    df[ACC] = df[ACC] * 100
    return df.rename(columns={ACC: "acc_pct_latest"}).sort_values(["status", "cell", "run_name"]).reset_index(drop=True)


def status_counts(runs: pd.DataFrame) -> dict[str, int]:
    return {str(k): int(v) for k, v in runs["status"].value_counts().sort_index().items()}


# ------------------------------------------------------------------------------ paper values


def analysis_dir() -> Path:
    """`analysis/` of the source tree: the papers' published values, kept as data."""
    return Path(__file__).resolve().parents[2] / "analysis"


def load_paper(directory: str | Path | None = None) -> dict[str, pd.DataFrame]:
    d = Path(directory) if directory else analysis_dir()
    names = ("main", "uaq", "throughput", "kl")
    missing = [n for n in names if not (d / f"paper_{n}.csv").exists()]
    if missing:
        raise FileNotFoundError(f"{d}: published values paper_{missing[0]}.csv not found (analysis/ of the suite source)")
    return {n: pd.read_csv(d / f"paper_{n}.csv") for n in names}


def paper_vs_main(main: pd.DataFrame, paper_main: pd.DataFrame) -> pd.DataFrame:
    """The papers' main tables beside ours: one row per (precision, method) of either; a
    `paper: <paper> <benchmark>` column per published benchmark and, per measured setting,
    `measured: <task>/<model>/<algo>` columns (mean, 95% CI, n). Published values are from
    the papers' own models, GPUs and benchmarks; measured ones from the runs at hand."""
    pairs = list(dict.fromkeys([*zip(paper_main["precision"], paper_main["method"]),
                                *zip(main["precision"], main["method"])]))
    out = pd.DataFrame({"precision": [p for p, _ in pairs], "method": [m for _, m in pairs]})
    for (paper, bench), g in paper_main.groupby(["paper", "benchmark"], sort=False):
        vals = {(p, m): v for p, m, v in zip(g["precision"], g["method"], g["value"])}
        out[f"{PAPER_LABEL}: {paper} {bench} (%)"] = [vals.get(k, math.nan) for k in pairs]
    for setting, g in main.groupby(list(GROUP), sort=True):
        name = "/".join(setting)
        # One measured value per (precision, method): the UAQ scale the most seeds ran at.
        best = g.sort_values("n", ascending=False).drop_duplicates(["precision", "method"])
        vals = {(p, m): (a, lo, hi, n) for p, m, a, lo, hi, n in
                zip(best["precision"], best["method"], best["acc_pct"], best["acc_ci_low"], best["acc_ci_high"], best["n"])}
        none = (math.nan, math.nan, math.nan, 0)
        out[f"{MEASURED_LABEL}: {name} acc (%)"] = [vals.get(k, none)[0] for k in pairs]
        out[f"{MEASURED_LABEL}: {name} CI low"] = [vals.get(k, none)[1] for k in pairs]
        out[f"{MEASURED_LABEL}: {name} CI high"] = [vals.get(k, none)[2] for k in pairs]
        out[f"{MEASURED_LABEL}: {name} n"] = [vals.get(k, none)[3] for k in pairs]
    return out


def paper_vs_uaq(uaq: pd.DataFrame, paper_uaq: pd.DataFrame) -> pd.DataFrame:
    """QuRL's UAQ ablation (INT8 ACR, AIME24) beside ours, matched on (s, LR factor)."""
    settings = list(dict.fromkeys([*zip(paper_uaq["uaq_s"], paper_uaq["lr_factor"]), *UAQ_GRID,
                                   *zip(uaq["uaq_s"], uaq["lr_factor"])]))
    settings = [(float(s), float(f)) for s, f in settings if not math.isnan(s)]
    settings = list(dict.fromkeys(settings))
    out = pd.DataFrame({"setting": [uaq_label(s, f) for s, f in settings],
                        "uaq_s": [s for s, _ in settings], "lr_factor": [f for _, f in settings]})
    for (paper, bench, prec, meth), g in paper_uaq.groupby(["paper", "benchmark", "precision", "method"], sort=False):
        vals = {(float(s), float(f)): v for s, f, v in zip(g["uaq_s"], g["lr_factor"], g["value"])}
        out[f"{PAPER_LABEL}: {paper} {bench}, {prec} {meth} (%)"] = [vals.get(k, math.nan) for k in settings]
    # Measured columns for the (precision, method) the paper ablated, when any ran; else all.
    ablated = set(zip(paper_uaq["precision"], paper_uaq["method"]))
    same = uaq[[(p, m) in ablated for p, m in zip(uaq["precision"], uaq["method"])]]
    for key, g in (same if len(same) else uaq).groupby([*GROUP, "precision", "method"], sort=True):
        name = "/".join(key)
        vals = {(float(s), float(f)): (a, lo, hi, v, n) for s, f, a, lo, hi, v, n in
                zip(g["uaq_s"], g["lr_factor"], g["acc_pct"], g["acc_ci_low"], g["acc_ci_high"], g["visibility_pct"],
                    g["n"])}
        none = (math.nan,) * 4 + (0,)
        out[f"{MEASURED_LABEL}: {name} acc (%)"] = [vals.get(k, none)[0] for k in settings]
        out[f"{MEASURED_LABEL}: {name} CI low"] = [vals.get(k, none)[1] for k in settings]
        out[f"{MEASURED_LABEL}: {name} CI high"] = [vals.get(k, none)[2] for k in settings]
        out[f"{MEASURED_LABEL}: {name} visibility (%)"] = [vals.get(k, none)[3] for k in settings]
        out[f"{MEASURED_LABEL}: {name} n"] = [vals.get(k, none)[4] for k in settings]
    return out.sort_values(["lr_factor", "uaq_s"]).reset_index(drop=True)


def paper_vs_throughput(thr: pd.DataFrame, paper_thr: pd.DataFrame) -> pd.DataFrame:
    """Rollout speed-up: the paper's ranges (their models on H100) and ours, in one long table
    with a `source` column."""
    rows = []
    for _, p in paper_thr.iterrows():
        rows.append({"source": f"{PAPER_LABEL} ({p['paper']}, {p['hardware']})", "precision": p["precision"],
                     "model": p["model"], "speedup_pct_low": p["speedup_low_pct"], "speedup_pct_high": p["speedup_high_pct"],
                     "reference": p["baseline"].lower(), "sync_share_pct": math.nan, "n": math.nan})
    for _, m in thr.iterrows():
        if m["precision"] in FULL or math.isnan(m["speedup"]):
            continue
        pct = (m["speedup"] - 1) * 100
        rows.append({"source": f"{MEASURED_LABEL} (runs at hand)", "precision": m["precision"], "model": m["model"],
                     "speedup_pct_low": pct, "speedup_pct_high": pct, "reference": m["speedup_ref"],
                     "sync_share_pct": m["sync_share_pct"], "n": m["n"]})
    return pd.DataFrame(rows, columns=["source", "precision", "model", "speedup_pct_low", "speedup_pct_high",
                                       "reference", "sync_share_pct", "n"])


def paper_vs_kl(kl: pd.DataFrame, paper_kl: pd.DataFrame) -> pd.DataFrame:
    """KL drift: QuRL's 0.002 -> 0.025 after ~1000 steps beside each measured configuration."""
    rows = []
    for _, p in paper_kl.iterrows():
        rows.append({"source": f"{PAPER_LABEL} ({p['paper']}, {p['hardware']})", "configuration": f"{p['precision']} {p['method']}",
                     "kl_first": p["kl_start"], "kl_last": p["kl_end"], "steps": p["steps"], "n": math.nan})
    for _, m in kl.iterrows():
        s = "" if math.isnan(m["uaq_s"]) else f" s={m['uaq_s']:g}"
        rows.append({"source": f"{MEASURED_LABEL} (runs at hand)",
                     "configuration": f"{m['task']}/{m['model']}/{m['algo']} {m['precision']} {m['method']}{s}",
                     "kl_first": m["kl_first"], "kl_last": m["kl_last"], "steps": m["last_step"], "n": m["n"]})
    df = pd.DataFrame(rows, columns=["source", "configuration", "kl_first", "kl_last", "steps", "n"])
    df["kl_growth"] = [_growth(a, b) for a, b in zip(df["kl_first"], df["kl_last"])]
    return df


# ------------------------------------------------------------------------------ formatting


@dataclass
class Table:
    """A table in its three forms: numbers (CSV), text cells (Markdown, LaTeX, HTML)."""

    name: str  # file stem
    title: str
    caption: str
    data: pd.DataFrame  # numeric
    text: pd.DataFrame  # formatted cells

    def markdown(self) -> str:
        return f"### {self.title}\n\n{self.caption}\n\n{to_markdown(self.text)}\n"

    def latex(self) -> str:
        body = self.text.to_latex(index=False, escape=True, longtable=False)
        cap = _latex_escape(self.caption)
        return ("\\begin{table}[ht]\n\\centering\n\\scriptsize\n" + body
                + f"\\caption{{{_latex_escape(self.title)}. {cap}}}\n\\end{{table}}\n")

    def write(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / f"{self.name}.{ext}" for ext in ("csv", "md", "tex")]
        self.data.to_csv(paths[0], index=False)
        paths[1].write_text(self.markdown(), encoding="utf-8")
        paths[2].write_text(self.latex(), encoding="utf-8")
        return paths


def _latex_escape(s: str) -> str:
    for a, b in (("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("$", "\\$"), ("#", "\\#"), ("_", "\\_"),
                 ("{", "\\{"), ("}", "\\}"), ("~", "\\textasciitilde{}"), ("^", "\\textasciicircum{}")):
        s = s.replace(a, b)
    return s


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub Markdown table (pandas' to_markdown needs tabulate, which we do not depend on)."""
    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _num(v, fmt: str = "{:.2f}", missing: str = "—") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return missing
    return fmt.format(v)


def _acc_ci(mean, lo, hi, n) -> str:
    if not n:
        return "missing"
    if n == 1:
        return f"{mean:.1f} (1 seed, no CI)"
    return f"{mean:.1f} [{lo:.1f}, {hi:.1f}]"


def _s(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:g}"


def display_main(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "task": df["task"], "model": df["model"], "algo": df["algo"], "precision": df["precision"],
        "method": df["method"], "UAQ s": df["uaq_s"].map(_s), "n": df["n"],
        "acc % [95% CI]": [_acc_ci(*a) for a in zip(df["acc_pct"], df["acc_ci_low"], df["acc_ci_high"], df["n"])],
        "seeds": df["seeds"], "not averaged": df["not_averaged"].replace("", "—"),
    })


def display_uaq(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "task": df["task"], "model": df["model"], "algo": df["algo"], "precision": df["precision"], "method": df["method"],
        "setting": df["setting"], "n": df["n"],
        "acc % [95% CI]": [_acc_ci(*a) for a in zip(df["acc_pct"], df["acc_ci_low"], df["acc_ci_high"], df["n"])],
        "update visibility (% codes changed / step)": df["visibility_pct"].map(lambda v: _num(v, "{:.3f}")),
        "|dW| / quant. step": df["step_ratio"].map(lambda v: _num(v, "{:.3f}")),
        "not averaged": df["not_averaged"].replace("", "—"),
    })


def display_throughput(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "model": df["model"], "precision": df["precision"], "n": df["n"],
        "rollout tokens/s": df["gen_tokens_per_s"].map(lambda v: _num(v, "{:.0f}")),
        "speed-up": [f"{s:.2f}x vs {r}" if r and not math.isnan(s) else "—" for s, r in zip(df["speedup"], df["speedup_ref"])],
        "weight sync (s/step)": df["sync_s"].map(lambda v: _num(v, "{:.4f}")),
        "sync share of step (%)": df["sync_share_pct"].map(lambda v: _num(v, "{:.1f}")),
        "rollout share of step (%)": df["gen_share_pct"].map(lambda v: _num(v, "{:.1f}")),
        "not averaged": df["not_averaged"].replace("", "—"),
    })


def display_kl(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "task": df["task"], "model": df["model"], "algo": df["algo"], "precision": df["precision"], "method": df["method"],
        "UAQ s": df["uaq_s"].map(_s), "n": df["n"],
        "KL first step": df["kl_first"].map(lambda v: _num(v, "{:.2e}")),
        "KL last step": df["kl_last"].map(lambda v: _num(v, "{:.2e}")),
        "growth (x)": df["kl_growth"].map(lambda v: _num(v, "{:.1f}")),
        "last step": df["last_step"].map(lambda v: _num(v, "{:.0f}")),
        "not averaged": df["not_averaged"].replace("", "—"),
    })


def display_status(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out["uaq_s"] = out["uaq_s"].map(_s)
    out["lr"] = out["lr"].map(lambda v: _num(v, "{:g}"))
    out["last_step"] = out["last_step"].map(lambda v: _num(v, "{:.0f}"))
    out["acc_pct_latest"] = out["acc_pct_latest"].map(lambda v: _num(v, "{:.1f}"))
    out["cell"] = out["cell"].map(lambda v: "—" if v is pd.NA or v is None else str(v))
    return out.fillna("—").replace("", "—")


def display_paper_vs(df: pd.DataFrame) -> pd.DataFrame:
    """Wide paper-vs-measured frames: paper cells as plain numbers, measured as mean [95% CI]
    (or "(1 seed)"), "missing" where no finished run."""
    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        if col.startswith(f"{MEASURED_LABEL}:") and col.endswith("visibility (%)"):
            out[col] = df[col].map(lambda v: _num(v, "{:.3f}"))
        elif col.startswith(f"{MEASURED_LABEL}:") and col.endswith(" acc (%)"):
            base = col[: -len(" acc (%)")]
            n_col = f"{base} n"
            lo, hi = df[f"{base} CI low"], df[f"{base} CI high"]
            n = df[n_col]
            out[col] = ["missing" if (isinstance(a, float) and math.isnan(a)) else
                        (f"{a:.1f} (1 seed)" if k == 1 else f"{a:.1f} [{l_:.1f}, {h_:.1f}]")
                        for a, l_, h_, k in zip(df[col], lo, hi, n)]
        elif col.startswith(f"{MEASURED_LABEL}:") and (col.endswith("CI low") or col.endswith("CI high") or col.endswith(" n")):
            continue
        elif col.startswith(f"{PAPER_LABEL}:"):
            out[col] = df[col].map(lambda v: _num(v, "{:.2f}"))
        elif col in ("uaq_s", "lr_factor"):
            continue
        else:
            out[col] = df[col]
    return out


def display_paper_vs_long(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    out = df.copy()
    if kind == "throughput":
        out["rollout speed-up (%)"] = [
            _num(lo, "{:+.0f}") if lo == hi else f"+{lo:.0f} to +{hi:.0f}"
            for lo, hi in zip(df["speedup_pct_low"], df["speedup_pct_high"])]
        out["weight-sync share of step (%)"] = df["sync_share_pct"].map(lambda v: _num(v, "{:.1f}", "not reported"))
        out["n"] = df["n"].map(lambda v: _num(v, "{:.0f}"))
        return out[["source", "precision", "model", "rollout speed-up (%)", "reference", "weight-sync share of step (%)", "n"]]
    out["KL first"] = df["kl_first"].map(lambda v: _num(v, "{:.2e}"))
    out["KL last"] = df["kl_last"].map(lambda v: _num(v, "{:.2e}"))
    out["growth (x)"] = df["kl_growth"].map(lambda v: _num(v, "{:.1f}"))
    out["steps"] = df["steps"].map(lambda v: _num(v, "{:.0f}"))
    out["n"] = df["n"].map(lambda v: _num(v, "{:.0f}"))
    return out[["source", "configuration", "KL first", "KL last", "growth (x)", "steps", "n"]]


PAPER_NOTE = ("Columns or rows marked 'paper' are the published values (QuRL arXiv 2602.13953, QaRL arXiv "
              "2604.07853: their models, GPUs and benchmarks, copied from analysis/paper_*.csv); 'measured' "
              "are the runs at hand (this suite's backend, model presets and synthetic tasks). Compare gaps "
              "between methods, not absolute values.")


def build_tables(runs: pd.DataFrame, paper: dict[str, pd.DataFrame], n_resamples: int = N_RESAMPLES,
                 seed: int = CI_SEED) -> dict[str, Table]:
    """Every table of the report, keyed by file stem."""
    ci = f"{n_resamples} bootstrap resamples, seed {seed}"
    main = main_table(runs, n_resamples, seed)
    uaq = uaq_table(runs, n_resamples, seed)
    thr = throughput_table(runs)
    kl = kl_table(runs)
    status = run_status(runs)
    counts = ", ".join(f"{n} {s}" for s, n in status_counts(runs).items()) or "no runs"
    return {
        "main": Table("main", "Main table: held-out accuracy per precision x method",
                      f"Final held-out accuracy (%), mean over finished seeds with a percentile bootstrap 95% CI "
                      f"({ci}); runs at their setting's reference learning rate. 'missing' = no finished run. "
                      f"Runs: {counts}.", main, display_main(main)),
        "uaq_ablation": Table("uaq_ablation", "UAQ ablation: invariant scale s and learning-rate controls",
                              f"Low-bit runs. Accuracy (%) with bootstrap 95% CI ({ci}); weight-update visibility = "
                              "mean over RL steps of quant/update_code_changed_frac (% of quantized codes that change "
                              "per step); |dW|/step = quant/update_step_ratio.", uaq, display_uaq(uaq)),
        "throughput": Table("throughput", "Throughput: rollout tokens/s, speed-up and weight-sync cost",
                            "Means over RL steps and finished runs. Speed-up = rollout tokens/s over the same model's "
                            "BF16 (else FP32) runs; weight sync = re-quantizing the rollout copy every step "
                            "(timing_s/update_weights), as a share of timing_s/step.", thr, display_throughput(thr)),
        "kl_drift": Table("kl_drift", "KL(quantized || full precision) drift",
                          "rollout_corr/kl (nats/token) at the first and last RL step, mean over finished seeds.",
                          kl, display_kl(kl)),
        "paper_vs_main": Table("paper_vs_main", "Paper vs measured: main table",
                               PAPER_NOTE + f" Measured: acc % [bootstrap 95% CI] ({ci}).",
                               pvm := paper_vs_main(main, paper["main"]), display_paper_vs(pvm)),
        "paper_vs_uaq": Table("paper_vs_uaq", "Paper vs measured: UAQ ablation", PAPER_NOTE,
                              pvu := paper_vs_uaq(uaq, paper["uaq"]), display_paper_vs(pvu)),
        "paper_vs_throughput": Table("paper_vs_throughput", "Paper vs measured: rollout speed-up", PAPER_NOTE,
                                     pvt := paper_vs_throughput(thr, paper["throughput"]),
                                     display_paper_vs_long(pvt, "throughput")),
        "paper_vs_kl": Table("paper_vs_kl", "Paper vs measured: KL drift", PAPER_NOTE,
                             pvk := paper_vs_kl(kl, paper["kl"]), display_paper_vs_long(pvk, "kl")),
        "runs_not_averaged": Table("runs_not_averaged", "Runs not averaged",
                                   "Failed, killed or still-running runs, and expected sweep cells with no run "
                                   f"({MISSING}); none of them enters any mean above.", status, display_status(status)),
    }
