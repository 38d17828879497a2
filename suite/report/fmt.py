"""Formatting of the tables: numbers (CSV) to text cells (Markdown, LaTeX, HTML).

Every accuracy cell shows the mean with its 95% CI (`suite.report.stats`), n, and the
per-seed values; a cell of one seed has no interval; a sweep cell with no run says "missing".
Every row shows each identity column (suite.report.cells.ROW_AXES), so two rows never look alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from suite.report.cells import precision_label, uaq_label
from suite.report.paper import MEASURED_LABEL, PAPER_LABEL


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


def _na(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def num(v, fmt: str = "{:.2f}", missing: str = "—") -> str:
    return missing if _na(v) or v == "" else fmt.format(v)


def acc_ci(mean, lo, hi, n) -> str:
    """'55.4 [51.3, 59.6]', '30.0 (1 seed, no CI)' or 'missing'."""
    if not n or _na(mean):
        return "missing"
    if n == 1 or _na(lo):
        return f"{mean:.1f} (1 seed, no CI)"
    return f"{mean:.1f} [{lo:.1f}, {hi:.1f}]"


def per_seed(seeds: str, values: str, fmt: str = "{:.1f}") -> str:
    """'0: 55.1, 1: 53.9, 2: 57.2' from the space-separated `seeds` and `values` columns."""
    if _na(seeds) or not str(seeds).strip():
        return "—"
    return ", ".join(f"{s}: {fmt.format(float(v))}" for s, v in zip(str(seeds).split(), str(values).split()))


def _text(v) -> str:
    return "—" if _na(v) or v == "" else str(v)


def _identity_cells(df: pd.DataFrame) -> dict:
    """The columns that say which configuration a row is (ROW_AXES, as text)."""
    kernels = [f"{_text(a)}/{_text(b)}" if (a or b) else "—" for a, b in zip(df["kernels"], df["bf16_kernels"])]
    return {
        "task": df["task"], "model": df["model"], "algo": df["algo"], "backend": df["backend"].map(_text),
        "precision": [precision_label(p, g) for p, g in zip(df["precision"], df["fp8_granularity"])],
        "method": df["method"], "UAQ s": df["uaq_s"].map(lambda v: num(v, "{:g}")),
        "steps": df["steps"].map(lambda v: num(v, "{:.0f}")), "lr": df["lr"].map(lambda v: num(v, "{:g}")),
        "trainer": df["trainer_dtype"].map(_text), "kernels (low-bit/bf16)": kernels,
        # the UAQ ablation's controls: global LR x f, or UAQ's per-group rates without the rescaling
        "LR": [lr_control(f, q) for f, q in zip(df["lr_factor"], df["uaq_group_lr_s"])],
        "recipe": df["recipe"].map(_text) if "recipe" in df else "—",
        "variant": df["variant"].map(_text),
    }


def lr_control(lr_factor, group_lr_s) -> str:
    """'ref' (the setting's reference learning rate), 'LR x1.5' or 'group LR x1.5'."""
    if _na(lr_factor) or _na(group_lr_s):
        return "—"
    if lr_factor == 1.0 and group_lr_s == 1.0:
        return "ref"
    return uaq_label(1.0, lr_factor, group_lr_s).replace(" (s=1)", "")


def display_main(df: pd.DataFrame) -> pd.DataFrame:
    cells = _identity_cells(df)
    return pd.DataFrame({
        **cells, "n": df["n"],
        # mean@1 or Avg@N (QuRL's AIME column is Avg@32): how the held-out accuracy was sampled
        "held-out": df["acc_at"].map(_text) if "acc_at" in df else "",
        "acc % [95% CI]": [acc_ci(*a) for a in zip(df["acc_pct"], df["acc_ci_low"], df["acc_ci_high"], df["n"])],
        "CI": df["ci_method"].map(_text), "acc % per seed": [per_seed(s, v) for s, v in zip(df["seeds"], df["values"])],
        "not averaged": df["not_averaged"].map(_text),
    })


def display_uaq(df: pd.DataFrame) -> pd.DataFrame:
    cells = _identity_cells(df)
    cells.pop("UAQ s")
    cells.pop("LR")  # the setting says it
    return pd.DataFrame({
        **{k: cells[k] for k in ("task", "model", "algo", "backend", "precision", "method")}, "setting": df["setting"],
        **{k: cells[k] for k in ("steps", "lr", "trainer", "kernels (low-bit/bf16)", "recipe", "variant")},
        "n": df["n"],
        "acc % [95% CI]": [acc_ci(*a) for a in zip(df["acc_pct"], df["acc_ci_low"], df["acc_ci_high"], df["n"])],
        "CI": df["ci_method"].map(_text), "acc % per seed": [per_seed(s, v) for s, v in zip(df["seeds"], df["values"])],
        "update visibility (% codes changed / step)": df["visibility_pct"].map(lambda v: num(v, "{:.3f}")),
        "|dW| / quant. step": df["step_ratio"].map(lambda v: num(v, "{:.3f}")),
        "not averaged": df["not_averaged"].map(_text),
    })


def display_throughput(df: pd.DataFrame) -> pd.DataFrame:
    cells = _identity_cells(df)
    return pd.DataFrame({
        **cells, "n": df["n"],
        "rollout tokens/s": df["gen_tokens_per_s"].map(lambda v: num(v, "{:.0f}")),
        "speed-up": [f"{s:.2f}x vs {r}" if r and not _na(s) else "—" for s, r in zip(df["speedup"], df["speedup_ref"])],
        "weight sync (s/step)": df["sync_s"].map(lambda v: num(v, "{:.4f}")),
        "sync share of step (%)": df["sync_share_pct"].map(lambda v: num(v, "{:.1f}")),
        "rollout share of step (%)": df["gen_share_pct"].map(lambda v: num(v, "{:.1f}")),
        "not averaged": df["not_averaged"].map(_text),
    })


def display_kl(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        **_identity_cells(df), "n": df["n"],
        "KL first step": df["kl_first"].map(lambda v: num(v, "{:.2e}")),
        "KL last step": df["kl_last"].map(lambda v: num(v, "{:.2e}")),
        "KL last, per seed": [per_seed(s, v, "{:.2e}") for s, v in zip(df["seeds"], df["values"])],
        "growth (x)": df["kl_growth"].map(lambda v: num(v, "{:.1f}")),
        "last step": df["last_step"].map(lambda v: num(v, "{:.0f}")),
        "not averaged": df["not_averaged"].map(_text),
    })


def display_status(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out["precision"] = [precision_label(p, g) for p, g in zip(df["precision"], df["fp8_granularity"])]
    out = out.drop(columns=["fp8_granularity"])
    out["uaq_s"] = out["uaq_s"].map(lambda v: num(v, "{:g}"))
    out["lr"] = out["lr"].map(lambda v: num(v, "{:g}"))
    for col in ("steps", "last_step"):
        out[col] = out[col].map(lambda v: num(v, "{:.0f}"))
    out["acc_pct_latest"] = out["acc_pct_latest"].map(lambda v: num(v, "{:.1f}"))
    out["cell"] = out["cell"].map(lambda v: "—" if _na(v) else str(v))
    return out.astype(object).fillna("—").replace("", "—")


def display_paper_vs(df: pd.DataFrame) -> pd.DataFrame:
    """Published values beside measured scores (suite.report.paper.paired_scores): where the value
    sits, the benchmark and metric, the identity, the published value and its source, then the
    measured configuration, bf16 and rollout acc % [95% CI] with n, and rollout - bf16."""
    m = MEASURED_LABEL
    out = pd.DataFrame(index=df.index)
    for col in ("paper", "table", "row", "column", "benchmark", "metric"):
        out[col] = df[col].map(_text)
    out["precision"] = [precision_label(p, g) for p, g in zip(df["precision"], df["fp8_granularity"])]
    out["method"] = df["method"]
    for col, name in (("uaq_s", "UAQ s"), ("lr_factor", "LR x"), ("uaq_group_lr_s", "group LR x")):
        if col in df.columns:
            out[name] = df[col].map(lambda v: num(v, "{:g}"))
    out["algo"] = df["algo"]
    out["recipe"] = df["recipe"].map(_text)
    out[f"{PAPER_LABEL}: published (%)"] = df[f"{PAPER_LABEL} (%)"].map(lambda v: num(v, "{:.2f}"))
    out[f"{PAPER_LABEL}: source"] = df["source"].map(_text)
    out[f"{m}: configuration"] = df[f"{m}: configuration"]
    if f"{m}: step" in df.columns:
        out[f"{m}: step"] = df[f"{m}: step"].map(_text)
    for engine in ("bf16", "rollout"):
        p = f"{m} {engine}: "
        out[f"{m}: {engine} acc % [95% CI]"] = [acc_ci(*a) for a in zip(df[p + "mean"], df[p + "ci_low"],
                                                                          df[p + "ci_high"], df[p + "n"])]
        out[f"{m}: {engine} n"] = df[p + "n"]
    out[f"{m}: rollout - bf16"] = df[f"{m}: rollout - bf16"].map(lambda v: num(v, "{:+.1f}"))
    return out


def display_eval(df: pd.DataFrame) -> pd.DataFrame:
    """Per-benchmark scores (tables.eval_table): the configuration, the benchmark, engine and metric,
    acc % [95% CI], per seed, and the rollout engine's difference to bf16 (else fp32)."""
    if df.empty:
        return pd.DataFrame(columns=["configuration", "benchmark", "metric", "step", "engine", "n", "acc % [95% CI]"])
    cells = _identity_cells(df)
    return pd.DataFrame({
        **{k: cells[k] for k in ("task", "model", "algo", "backend", "precision", "method", "UAQ s", "LR", "steps",
                                 "recipe", "variant")},
        "benchmark": df["benchmark"], "metric": [f"{a}@{int(k)}" for k, a in zip(df["k"], df["agg"])],
        "step": df["eval_step"].map(lambda v: "?" if int(v) < 0 else str(int(v))),
        "engine": df["engine"],
        "n": df["n"],
        "acc % [95% CI]": [acc_ci(*a) for a in zip(df["acc_pct"], df["acc_ci_low"], df["acc_ci_high"], df["n"])],
        "acc % per seed": [per_seed(s, v) for s, v in zip(df["seeds"], df["values"])],
        "rollout - ref": df["rollout_minus_ref"].map(lambda v: num(v, "{:+.1f}")),
        "not averaged": df["not_averaged"].map(_text),
    })


def display_paper_vs_long(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    out = df.copy()
    out["n"] = df["n"].map(lambda v: num(v, "{:.0f}"))
    if kind == "throughput":
        out["rollout speed-up (%)"] = [
            num(lo, "{:+.0f}") if lo == hi else f"+{lo:.0f} to +{hi:.0f}"
            for lo, hi in zip(df["speedup_pct_low"], df["speedup_pct_high"])]
        out["weight-sync share of step (%)"] = df["sync_share_pct"].map(lambda v: num(v, "{:.1f}", "not reported"))
        return out[["source", "precision", "model", "configuration", "rollout speed-up (%)", "reference",
                    "weight-sync share of step (%)", "n"]]
    out["KL first"] = df["kl_first"].map(lambda v: num(v, "{:.2e}"))
    out["KL last"] = df["kl_last"].map(lambda v: num(v, "{:.2e}"))
    out["growth (x)"] = df["kl_growth"].map(lambda v: num(v, "{:.1f}"))
    out["steps"] = df["steps"].map(lambda v: num(v, "{:.0f}"))
    return out[["source", "configuration", "KL first", "KL last", "growth (x)", "steps", "n"]]
