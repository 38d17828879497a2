"""Figures of the report, drawn from the tidy frames (`suite.report.data`); no computing here
beyond averaging seeds for a line. Each function returns a matplotlib Figure (Agg backend);
`save` writes it as PNG and SVG. Only FINISHED runs are drawn.

Lines are means over seeds; the shaded band spans the seeds' min..max (not a confidence
interval: with a handful of seeds it shows the spread honestly), or the 25-75% quantiles
when more than BAND_MINMAX_MAX_RUNS runs make up a line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from suite.report.data import ACC, FINISHED
from suite.report.cells import uaq_label
from suite.report.tables import FULL, GROUP, with_lr_factor

# QuRL's drift of KL(quantized || full precision): 0.002 early, 0.025 after ~1000 steps (arXiv 2602.13953, ACR section).
PAPER_KL = (0.002, 0.025)
DPI = 130


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 8,
                         "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": DPI, "svg.fonttype": "none"})
    return plt


def save(fig, directory: Path, name: str) -> list[Path]:
    """Write `fig` as directory/name.png and .svg; close it."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{name}.png", directory / f"{name}.svg"]
    for p in paths:
        fig.savefig(p, bbox_inches="tight", dpi=DPI)
    _plt().close(fig)
    return paths


BAND_MINMAX_MAX_RUNS = 5  # up to this many runs per line the band is min..max, above it the 25-75% quantiles
MAX_LINES = 12  # more configurations than this in one panel: average over the minor axes
# Identity columns a line's label names when they vary (suite.report.cells.ROW_AXES, minus the few
# that follow from these): lines never silently mix step counts, trainer dtypes or kernel paths.
LINE_AXES = (*GROUP, "backend", "fp8_granularity", "uaq_s", "uaq_group_lr_s", "lr", "steps", "trainer_dtype",
             "kernels", "bf16_kernels")


def _label_cols(h: pd.DataFrame) -> list[str]:
    """Axes that vary in `h` (and so must appear in a line's label), in reading order. With
    more than MAX_LINES configurations, lines average over the axes other than precision and
    method (the title says so through `_averaged`)."""
    vary = [c for c in LINE_AXES if c in h.columns and h[c].nunique(dropna=False) > 1]
    cols = ["precision", "method", *vary]
    if vary and len(h.drop_duplicates(cols)) > MAX_LINES:
        return ["precision", "method"]
    # configurations alike on every axis above but of different configs (another clip range, say):
    # each its own line, named by its group key
    if "group_key" in h.columns and len(h.drop_duplicates([*cols, "group_key"])) > len(h.drop_duplicates(cols)):
        cols.append("group_key")
    return cols


def _averaged(h: pd.DataFrame, cols: list[str]) -> str:
    over = [c for c in LINE_AXES if c in h.columns and c not in cols and h[c].nunique(dropna=False) > 1]
    return f"\n(lines: mean over {', '.join('UAQ s' if c == 'uaq_s' else c for c in over)})" if over else ""


def _label(row: dict, cols: list[str]) -> str:
    parts = []
    for c in cols:
        v = row[c]
        if c == "uaq_s":
            parts.append(f"s={v:g}")
        elif c == "group_key":
            parts.append(f"[config {v}]")
        elif c in ("lr", "uaq_group_lr_s", "steps"):
            name = "group LR x" if c == "uaq_group_lr_s" else f"{c}="
            parts.append(f"{name}{'?' if pd.isna(v) else format(float(v), 'g')}")
        else:
            parts.append(str(v))
    return " ".join(parts)


def _lines(h: pd.DataFrame, key: str, cols: list[str]):
    """(label, steps, mean, min, max) per configuration, averaging finished seeds."""
    h = h[h["status"] == FINISHED].dropna(subset=[key])
    for cfg, g in h.groupby(cols, sort=True, dropna=False):
        row = dict(zip(cols, cfg if isinstance(cfg, tuple) else (cfg,)))
        by = g.groupby("step")[key]
        s = by.agg(["mean", "min", "max", "count"]).sort_index()
        if s["count"].max() > BAND_MINMAX_MAX_RUNS:  # many runs per line: the 25-75% band, not min..max
            q = by.quantile([0.25, 0.75]).unstack().sort_index()
            s["min"], s["max"] = q[0.25], q[0.75]
        yield _label(row, cols), s.index.to_numpy(), s["mean"].to_numpy(), s["min"].to_numpy(), s["max"].to_numpy()


def _axes_style(ax, integer_x: bool = True) -> None:
    from matplotlib.ticker import MaxNLocator

    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.ticklabel_format(axis="y", useOffset=False)


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no finished run logged {what}", ha="center", va="center", transform=ax.transAxes, color="0.4")


def _legend(ax, n: int) -> None:
    if n:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def kl_vs_step(history: pd.DataFrame):
    """KL(quantized || full precision) vs RL step per configuration, with QuRL's drift marked."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    key = "rollout_corr/kl"
    h = history[history["step"] >= 1]
    n = 0
    note = ""
    if key in h.columns:
        cols = _label_cols(h)
        note = _averaged(h[h["status"] == FINISHED], cols)
        for label, x, y, lo, hi in _lines(h, key, cols):
            (line,) = ax.plot(x, y, marker="o", ms=3, label=label)
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
            n += 1
    if not n:
        _empty(ax, key)
    for v, txt in zip(PAPER_KL, ("start", "after ~1000 steps")):
        ax.axhline(v, color="0.35", ls=":", lw=1.2)
        ax.annotate(f"paper (QuRL): {v} {txt}", xy=(0.0, v), xycoords=("axes fraction", "data"), xytext=(4, 3),
                    textcoords="offset points", fontsize=8, color="0.3")
    _axes_style(ax)
    ax.set_xlabel("RL step")
    ax.set_ylabel("KL(π_behav ‖ π_prox)  (nats / token)")
    ax.set_title("Rollout mismatch: KL(quantized ‖ full precision) vs step  (rollout_corr/kl)" + note)
    _legend(ax, n)
    return fig


def reward_vs_step(history: pd.DataFrame):
    """Training reward vs step for naive / TIS / ACR (one panel per low-bit precision, with the
    full-precision baseline drawn in each): the collapse of naive quantized RL shows here."""
    plt = _plt()
    key = "critic/score/mean"
    h = history[(history["step"] >= 1) & (history["status"] == FINISHED)]
    precs = sorted(p for p in h["precision"].unique() if p not in FULL) or ["(none)"]
    fig, axes = plt.subplots(1, len(precs), figsize=(4.6 * len(precs) + 1.8, 3.8), sharey=True, squeeze=False)
    base = h[h["precision"].isin(FULL)]
    cols_all = [c for c in _label_cols(h) if c != "precision"] or ["method"]
    for ax, prec in zip(axes[0], precs):
        sub = pd.concat([base, h[h["precision"] == prec]])
        n = 0
        if key in sub.columns and not sub.empty:
            cols = ["precision", *cols_all] if len(sub["precision"].unique()) > 1 else cols_all
            for label, x, y, lo, hi in _lines(sub, key, cols):
                (line,) = ax.plot(x, y, marker="o", ms=3, label=label, ls="--" if label.split()[0] in FULL else "-")
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
                n += 1
        if not n:
            _empty(ax, key)
        _axes_style(ax)
        ax.set_title(f"rollout precision: {prec}")
        ax.set_xlabel("RL step")
        _legend(ax, n) if ax is axes[0][-1] else (ax.legend(frameon=False) if n else None)
    axes[0][0].set_ylabel("mean reward (verifier score, 0–1)")
    fig.suptitle("Training reward vs step (critic/score/mean): naive vs TIS vs ACR"
                 + _averaged(h, ["precision", *cols_all]), y=1.02)
    return fig


CLIP_IS_PANELS = (
    ("actor/pg_clipfrac", "clipped tokens (fraction)"),
    ("rollout_corr/rollout_is_mean", "IS weight min(r, C), mean"),
    ("rollout_corr/rollout_is_max", "IS weight min(r, C), max"),
    ("rollout_corr/rollout_is_ratio_fraction_high", "truncated IS weights (fraction, r > C)"),
)


def clip_is_vs_step(history: pd.DataFrame):
    """Clip fraction and importance-weight statistics vs step per configuration."""
    plt = _plt()
    h = history[history["step"] >= 1]
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharex=True)
    cols = _label_cols(h) if not h.empty else ["precision", "method"]
    n_any = 0
    for ax, (key, ylabel) in zip(axes.flat, CLIP_IS_PANELS):
        n = 0
        if key in h.columns:
            for label, x, y, lo, hi in _lines(h, key, cols):
                (line,) = ax.plot(x, y, marker="o", ms=3, label=label)
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
                n += 1
        if not n:
            _empty(ax, key)
        _axes_style(ax)
        ax.set_title(key, fontsize=9)
        ax.set_ylabel(ylabel)
        n_any = max(n_any, n)
    for ax in axes[1]:
        ax.set_xlabel("RL step")
    handles, labels = next(((a.get_legend_handles_labels()) for a in axes.flat if a.get_legend_handles_labels()[0]),
                           ([], []))
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.suptitle("Clipping and importance-sampling weights vs step" + _averaged(h[h["status"] == FINISHED], cols),
                 y=1.0)
    fig.tight_layout()
    return fig


def visibility_vs_s(runs: pd.DataFrame):
    """Weight-update visibility (quantized codes changed per step, %) vs UAQ scale s, one series
    per configuration: the UAQ ablation's LR and per-group LR controls are series of their own
    (a point at s = 1), never pooled with the runs they control. Error bars: min..max over seeds."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    r = with_lr_factor(runs)
    r = r[(r["status"] == FINISHED) & ~r["precision"].isin(FULL) & r["visibility"].notna()]
    n = 0
    # the controls split always; the other axes where they vary
    group_cols = [c for c in (*GROUP, "backend", "precision", "fp8_granularity", "method", "steps", "trainer_dtype",
                              "kernels", "bf16_kernels") if r[c].nunique() > 1] or ["precision"]
    point = [*group_cols, "lr_factor", "uaq_group_lr_s", "uaq_s"]
    if len(r.drop_duplicates([*point, "group_key"])) > len(r.drop_duplicates(point)):
        group_cols.append("group_key")  # alike on every axis, different configs: a series each
    for key, g in r.groupby([*group_cols, "lr_factor", "uaq_group_lr_s"], sort=True, dropna=False):
        *key, factor, group_lr = key
        s = g.groupby("uaq_s")["visibility"].agg(["mean", "min", "max"]).sort_index() * 100
        control = [uaq_label(1.0, factor, group_lr).replace(" (s=1)", "")] if (factor, group_lr) != (1.0, 1.0) else []
        ax.errorbar(s.index, s["mean"], yerr=[s["mean"] - s["min"], s["max"] - s["mean"]], marker="o" if not control
                    else "s", capsize=3, label=" ".join([_label(dict(zip(group_cols, key)), group_cols), *control]))
        n += 1
    if not n:
        _empty(ax, "quant/update_code_changed_frac")
    ax.set_xlabel("UAQ invariant scale s  (1 = no UAQ)")
    ax.set_ylabel("quantized codes changed per step (%)")
    ax.set_title("Weight-update visibility vs UAQ scale (quant/update_code_changed_frac)")
    _legend(ax, n)
    return fig


def _bar_labels(thr: pd.DataFrame) -> list[str]:
    """One legend label per throughput row: precision (with FP8 granularity) plus every identity
    axis that varies between rows of one model, so two configurations never share a bar."""
    cols = [c for c in ("method", "uaq_s", "uaq_group_lr_s", "lr", "steps", "trainer_dtype", "kernels",
                        "kernels_executed", "bf16_kernels",
                        "task", "algo", "backend", "variant") if thr[c].nunique(dropna=False) > 1]
    labels = []
    for _, r in thr.iterrows():
        prec = f"fp8 {r['fp8_granularity']}" if r["precision"] == "fp8" else r["precision"]
        labels.append(" ".join([prec, _label(r.to_dict(), [c for c in cols if c != "variant"]),
                                str(r["variant"]) if "variant" in cols else ""]).strip())
    dup = pd.Series(list(zip(thr["model"], labels))).duplicated(keep=False).to_numpy()
    labels = [f"{lab} [{k}]" if d else lab for lab, k, d in zip(labels, thr["group_key"], dup)]
    # one configuration measured at several workloads (its rows of the throughput table): name each
    dup = pd.Series(list(zip(thr["model"], labels))).duplicated(keep=False).to_numpy()
    return [f"{lab} {w}" if d else lab for lab, w, d in zip(labels, thr.get("workload", thr["group_key"]), dup)]


def throughput_bars(thr: pd.DataFrame):
    """Rollout tokens/s per configuration, grouped by model size, with the speed-up over BF16/FP32."""
    plt = _plt()
    models = list(dict.fromkeys(thr["model"])) or ["(none)"]
    thr = thr.assign(_label=_bar_labels(thr)) if len(thr) else thr.assign(_label=[])
    series = list(dict.fromkeys(thr["_label"]))
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(models) * max(1, len(series)) / 2 + 3), 4))
    width = 0.8 / max(1, len(series))
    for i, label in enumerate(series):
        sub = thr[thr["_label"] == label].set_index("model").reindex(models)
        xs = np.arange(len(models)) + (i - (len(series) - 1) / 2) * width
        bars = ax.bar(xs, sub["gen_tokens_per_s"].fillna(0), width, label=label)
        for b, sp, ref, n in zip(bars, sub["speedup"], sub["speedup_ref"], sub["n"]):
            if pd.isna(n):
                continue
            if not n:
                ax.annotate(f"{label}: no finished run", (b.get_x() + b.get_width() / 2, 0), ha="center",
                            va="bottom", fontsize=8, rotation=90, xytext=(0, 4), textcoords="offset points",
                            color="0.35")
            elif isinstance(ref, str) and ref and not np.isnan(sp):
                ax.annotate(f"{sp:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                            fontsize=8, xytext=(0, 2), textcoords="offset points")
    if thr.empty:
        _empty(ax, "perf/gen_tokens_per_s")
    ax.set_xticks(np.arange(len(models)), [f"model: {m}" for m in models])
    ax.set_ylabel("rollout throughput (generated tokens / s)")
    ax.set_title("Rollout throughput (perf/gen_tokens_per_s); labels: speed-up vs BF16 (else FP32)")
    ax.legend(title="rollout configuration", frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def accuracy_vs_step(history: pd.DataFrame):
    """Held-out accuracy (%) vs step per configuration (step 0 = after the warm start)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    h = history.dropna(subset=[ACC]).assign(acc_pct=lambda d: d[ACC] * 100)
    n = 0
    note = ""
    if not h.empty:
        cols = _label_cols(h)
        note = _averaged(h[h["status"] == FINISHED], cols)
        for label, x, y, lo, hi in _lines(h, "acc_pct", cols):
            (line,) = ax.plot(x, y, marker="o", ms=3, label=label)
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
            n += 1
    if not n:
        _empty(ax, "held-out accuracy")
    _axes_style(ax)
    ax.set_xlabel("RL step (0 = after warm start)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title("Held-out accuracy vs step (val-core/<task>/acc/mean@1)" + note)
    _legend(ax, n)
    return fig


def build_figures(runs: pd.DataFrame, history: pd.DataFrame, thr: pd.DataFrame) -> dict:
    """Every figure of the report, keyed by file stem."""
    return {
        "kl_vs_step": kl_vs_step(history),
        "reward_vs_step": reward_vs_step(history),
        "clip_is_vs_step": clip_is_vs_step(history),
        "visibility_vs_s": visibility_vs_s(runs),
        "throughput": throughput_bars(thr),
        "accuracy_vs_step": accuracy_vs_step(history),
    }
