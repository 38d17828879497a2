"""How table rows are formed: one row per configuration, averaging its seeds and nothing else.

A row of every table is one `group_key` (suite.report.identity): runs whose semantic configs are
equal except for the seed. The row also shows the identity columns ROW_AXES, so two rows that
differ in steps, learning rate, trainer dtype, kernel path or FP8 granularity say so; two rows
equal in all of them but of different configs get a `variant` naming the params that differ.
Only FINISHED runs are averaged; the others are counted in `not_averaged` with their status.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from suite.core.quant import LOW_BIT_PRECISIONS, PRECISIONS
from suite.report.data import FINISHED, coerce_runs
from suite.report.identity import CORRECTION_LABELS, supersede
from suite.report.stats import CI_SEED, N_RESAMPLES, mean_ci

GROUP = ("task", "model", "algo")  # a measured "setting": the papers compare methods within one
LOW_BIT = LOW_BIT_PRECISIONS  # suite.core.quant: int8, fp8, w4a16
FULL = ("bf16", "fp32")  # the 16/32-bit references, in the order a speed-up prefers them
# The columns every table row carries, in reading order; with `group_key` they identify a row.
ROW_AXES = ("task", "model", "algo", "backend", "precision", "fp8_granularity", "method", "correction",
            "aligned_forward", "uaq_s", "uaq_group_lr_s", "lr_factor", "lr", "steps", "trainer_dtype", "kernels",
            "bf16_kernels")
STAT_COLUMNS = ("n", "mean", "ci_low", "ci_high", "ci_method", "seeds", "values", "not_averaged")
PRECISION_ORDER = PRECISIONS  # registry order (suite.core.quant.QUANTIZERS)
# registry order (suite.core.losses.CORRECTIONS), then the same with QaRL's aligned forward
METHOD_ORDER = tuple(CORRECTION_LABELS.values()) + tuple(f"aligned+{m}" for m in CORRECTION_LABELS.values())


def with_lr_factor(runs: pd.DataFrame) -> pd.DataFrame:
    """`lr_factor`: the learning-rate control each run declares (train.lr_factor; 1 where a run has none), never
    inferred from which learning rate most runs share."""
    out = runs.copy()
    factor = out["lr_factor"] if "lr_factor" in out else pd.Series(1.0, index=out.index)
    out["lr_factor"] = pd.to_numeric(factor, errors="coerce").fillna(1.0).astype(float)
    return out


PREPARED = "suite.prepared"  # the DataFrame.attrs flag `prepare` sets


def prepare(runs: pd.DataFrame) -> pd.DataFrame:
    """The run frame as every table reads it: dtypes and group keys (`coerce_runs`), duplicate
    finished runs of one configuration and seed superseded, and `lr_factor`. Flagged in
    `attrs`, so the tables of one report (`build_tables`) prepare it once."""
    out = with_lr_factor(supersede(coerce_runs(runs), FINISHED))
    out.attrs[PREPARED] = True
    return out


def ensure_prepared(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` itself if `prepare` made it (a copy, so a table's columns stay its own), else prepared."""
    return runs.copy() if runs.attrs.get(PREPARED) else prepare(runs)


def _others(group: pd.DataFrame) -> str:
    """'1 FAILED, 2 RUNNING' for the runs of a cell that are not averaged."""
    counts = group.loc[group["status"] != FINISHED, "status"].value_counts()
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def _fmt_value(v: float) -> str:
    return f"{v:.10g}"


def cell_stats(group: pd.DataFrame, col: str, scale: float = 1.0, n_resamples: int = N_RESAMPLES,
               seed: int = CI_SEED) -> dict:
    """n, mean, 95% CI (`suite.report.stats.mean_ci`) and the per-seed values of `col` x `scale`
    over the finished runs of one configuration, in seed order (`seeds` and `values`, space
    separated). Raises if a seed repeats: `prepare` supersedes duplicates first."""
    done = group[(group["status"] == FINISHED) & group[col].notna()].sort_values("seed", kind="stable")
    seeds = done["seed"].dropna().astype(int).tolist()
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {seeds} repeat within one configuration (group_key "
                         f"{group['group_key'].iloc[0]}); supersede duplicates before averaging")
    vals = done[col].to_numpy(dtype=float) * scale
    mean, lo, hi, method = mean_ci(vals, n_resamples, seed)
    return {"n": int(vals.size), "mean": mean, "ci_low": lo, "ci_high": hi, "ci_method": method,
            "seeds": " ".join(str(s) for s in seeds), "values": " ".join(_fmt_value(v) for v in vals),
            "not_averaged": _others(group)}


def empty_stats() -> dict:
    return {"n": 0, "mean": math.nan, "ci_low": math.nan, "ci_high": math.nan, "ci_method": "", "seeds": "",
            "values": "", "not_averaged": ""}


def pool(runs: pd.DataFrame, axes=ROW_AXES):
    """(row identity, runs) per configuration: `runs` grouped by `axes` and `group_key`."""
    keys = [*axes, "group_key"]
    for key, g in runs.groupby(keys, dropna=False, sort=True):
        yield dict(zip(keys, key)), g


def _config_of(group: pd.DataFrame) -> dict:
    for c in group["config"]:
        if c:
            return json.loads(c)
    return {}


def variants(rows: list[dict], configs: list[dict], axes=ROW_AXES) -> list[str]:
    """A `variant` per row: empty unless another row has the same `axes` but another group key;
    then the params in which those rows' configs differ (`key=value, ...`), or the group key
    when the configs are unknown."""
    out = [""] * len(rows)
    by_axes: dict = {}
    for i, r in enumerate(rows):
        by_axes.setdefault(tuple(_hashable(r.get(a)) for a in axes), []).append(i)
    for idx in by_axes.values():
        if len({rows[i]["group_key"] for i in idx}) < 2:
            continue
        known = [i for i in idx if configs[i]]
        keys = sorted({k for i in known for k in configs[i]})
        differ = [k for k in keys if len({configs[i].get(k) for i in known}) > 1]
        for i in idx:
            if configs[i] and differ:
                out[i] = ", ".join(f"{k}={configs[i].get(k, '(unset)')}" for k in differ)
            else:
                out[i] = f"config {rows[i]['group_key']}"
    return out


def _hashable(v):
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def pooled_frame(runs: pd.DataFrame, col: str, scale: float = 1.0, n_resamples: int = N_RESAMPLES,
                 seed: int = CI_SEED, extra: dict | None = None, axes=ROW_AXES) -> pd.DataFrame:
    """One row per configuration of `runs`: the identity (`axes`, `group_key`, `variant`),
    `cell_stats` of `col`, and a column per `extra` item `name: f(finished runs) -> value`."""
    extra = extra or {}
    rows, configs = [], []
    for key, g in pool(runs, axes):
        done = g[g["status"] == FINISHED]
        rows.append({**key, **cell_stats(g, col, scale, n_resamples, seed), **{k: f(done) for k, f in extra.items()},
                     "recipe": recipe_label(g)})
        configs.append(_config_of(g))
    df = pd.DataFrame(rows, columns=[*axes, "group_key", *STAT_COLUMNS, *extra, "recipe"])
    df.insert(len(axes) + 1, "variant", variants(rows, configs, axes))
    return df


def recipe_label(group: pd.DataFrame) -> str:
    """The paper recipe a configuration's runs were composed with, and where they depart from it:
    'qurl-gsm8k (off-recipe: uaq.s=1.5 (recipe: 1.0))'; '' without one."""
    if "recipe" not in group:
        return ""
    labels = []
    for recipe, off in zip(group["recipe"], group.get("recipe_deviations", [""] * len(group))):
        if recipe:
            labels.append(f"{recipe} (off-recipe: {off})" if off else str(recipe))
    return " / ".join(dict.fromkeys(labels))


def sort_rows(df: pd.DataFrame, lead=GROUP) -> pd.DataFrame:
    """Rows in reading order: setting, precision (fp32, bf16, int8, fp8, w4a16), method, then s."""
    p = df["precision"].map({v: i for i, v in enumerate(PRECISION_ORDER)}).fillna(len(PRECISION_ORDER))
    m = df["method"].map({v: i for i, v in enumerate(METHOD_ORDER)}).fillna(len(METHOD_ORDER))
    keys = [*lead, "_p", "fp8_granularity", "_m", "uaq_s", "lr_factor", "uaq_group_lr_s", "steps", "lr",
            "trainer_dtype", "kernels", "bf16_kernels", "variant"]
    keys = [k for k in keys if k in df.columns or k in ("_p", "_m")]
    out = df.assign(_p=p, _m=m).sort_values(keys, kind="stable", na_position="last")
    return out.drop(columns=["_p", "_m"]).reset_index(drop=True)


def finished_mean(done: pd.DataFrame, col: str, scale: float = 1.0) -> float:
    """Mean of `col` over finished runs (nan when none)."""
    v = done[col].to_numpy(dtype=float)
    v = v[~np.isnan(v)]
    return float(v.mean() * scale) if v.size else math.nan


def uaq_label(s: float, lr_factor: float = 1.0, group_lr_s: float = 1.0) -> str:
    """'no UAQ (s=1)', 's=1.5', 'LR x2 (s=1)', 'group LR x1.5 (s=1)': a UAQ ablation setting."""
    if s is None or pd.isna(s):
        return "?"
    name = "no UAQ (s=1)" if s == 1.0 else f"s={s:g}"
    controls = [f"LR x{lr_factor:g}"] if lr_factor != 1.0 else []
    # per-group learning rate x s on the tensors UAQ rescales, x 1/s on the norm gains (docs/math.md)
    controls += [f"group LR x{group_lr_s:g}"] if group_lr_s != 1.0 else []
    if controls:
        return f"{', '.join(controls)} ({'s=1' if s == 1.0 else name})"
    return name


def _g(v, fmt: str = "{:g}") -> str:
    return "?" if v is None or v is pd.NA or v == "" or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def precision_label(precision: str, fp8_granularity: str) -> str:
    """'fp8 per_channel': FP8 always with its weight-scale granularity, other precisions as is."""
    return f"{precision} {fp8_granularity or '?'}" if precision == "fp8" else precision


def describe_row(row: dict) -> str:
    """A configuration in one line: 'arith/tiny/grpo int8 ACR s=1.5, 200 steps, lr 3e-05, trainer
    fp32, kernels native/native' (kernels: low-precision / bf16 GEMM path), then its variant."""
    head = (f"{row.get('task')}/{row.get('model')}/{row.get('algo')} "
            f"{precision_label(row.get('precision'), row.get('fp8_granularity', ''))} {row.get('method')} "
            f"{uaq_label(row.get('uaq_s'), row.get('lr_factor', 1.0), row.get('uaq_group_lr_s', 1.0))}")
    parts = [head, f"{_g(row.get('steps'))} steps", f"lr {_g(row.get('lr'))}",
             f"trainer {row.get('trainer_dtype') or '?'}",
             f"kernels {row.get('kernels') or '?'}/{row.get('bf16_kernels') or '?'}"]
    if row.get("backend") not in (None, "", "embedded"):
        parts.insert(1, f"backend {row['backend']}")
    if row.get("variant"):
        parts.append(row["variant"])
    return ", ".join(parts)
