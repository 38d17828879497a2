"""The papers' published values (analysis/paper_*.csv) and their pairing with measured rows.

Every published row carries its full identity as config values: precision, fp8_granularity,
correction, uaq_s, aligned_forward, algo (and for the UAQ ablation lr_factor and
uaq_group_lr_s). QuRL's "QuRL" column is correction acr with UAQ s = 1.5, its "FlashRL" column
tis at s = 1 (FlashRL has no UAQ), "BF16" a bf16 rollout with the stock pipeline (correction
naive, s = 1); analysis/README.md gives the mapping for every row. A measured row pairs with
a published one only when it matches all of that identity and runs at its setting's reference
learning rate; `algo = unstated` (the paper does not say) pairs every algo, each measured row
showing its own. A value that is not a config value stops the report (PaperDataError), naming
the file, the line and the key.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from suite.report.cells import describe_row, uaq_label
from suite.report.identity import ALGOS, CORRECTIONS, FP8_GRANULARITIES, PRECISIONS, method_label

PAPER_LABEL = "paper"  # column prefix of published values (their models, GPUs, benchmarks)
MEASURED_LABEL = "measured"  # column prefix of values from the runs at hand
UNSTATED = "unstated"  # an identity value the paper does not state
NAMES = ("main", "uaq", "throughput", "kl")
MAIN_IDENTITY = ("precision", "fp8_granularity", "correction", "aligned_forward", "uaq_s", "algo")
UAQ_IDENTITY = (*MAIN_IDENTITY, "lr_factor", "uaq_group_lr_s")
# Columns each file must have; the identity ones are checked against the config's values.
REQUIRED = {
    "main": ("paper", "benchmark", "label", *MAIN_IDENTITY, "value", "source"),
    "uaq": ("paper", "benchmark", "label", *UAQ_IDENTITY, "value", "source"),
    "throughput": ("paper", "precision", "model", "speedup_low_pct", "speedup_high_pct", "baseline", "hardware",
                   "source"),
    "kl": ("paper", "precision", "correction", "kl_start", "kl_end", "steps", "hardware", "source"),
}


class PaperDataError(ValueError):
    """A published-values CSV with a row that names no config value (file, line and key in the message)."""


def analysis_dir() -> Path:
    """`analysis/` of the source tree: the papers' published values, kept as data."""
    return Path(__file__).resolve().parents[2] / "analysis"


def _choice(allowed):
    def parse(raw: str, row: dict):
        if raw not in allowed:
            raise ValueError(", ".join(repr(a) for a in allowed))
        return raw
    return parse


def _number(raw: str, row: dict) -> float:
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise ValueError("a finite number")
    return v


def _positive(raw: str, row: dict) -> float:
    try:
        v = _number(raw, row)
    except ValueError:
        v = math.nan
    if not v > 0:
        raise ValueError("a number > 0")
    return v


def _steps(raw: str, row: dict) -> int:
    if not raw.isdigit():
        raise ValueError("a whole number of steps")
    return int(raw)


def _granularity(raw: str, row: dict) -> str:
    allowed = FP8_GRANULARITIES if row.get("precision") == "fp8" else ("",)
    if raw not in allowed:
        raise ValueError(", ".join(repr(a) for a in allowed) + f" (for precision {row.get('precision')!r})")
    return raw


def _aligned(raw: str, row: dict) -> bool:
    if raw not in ("true", "false"):
        raise ValueError("'true', 'false'")
    return raw == "true"


def _baseline(raw: str, row: dict) -> str:
    if raw.lower() not in PRECISIONS:
        raise ValueError(", ".join(p.upper() for p in PRECISIONS))
    return raw


PARSERS = {
    "precision": _choice(PRECISIONS),
    "fp8_granularity": _granularity,
    "correction": _choice(CORRECTIONS),
    "aligned_forward": _aligned,
    "uaq_s": _positive,
    "lr_factor": _positive,
    "uaq_group_lr_s": _positive,
    "algo": _choice((*ALGOS, UNSTATED)),
    "value": _number,
    "speedup_low_pct": _number,
    "speedup_high_pct": _number,
    "kl_start": _number,
    "kl_end": _number,
    "steps": _steps,
    "baseline": _baseline,
}
# Per file, parsers that differ: QuRL does not say under which correction its KL drift was measured.
FILE_PARSERS = {"kl": {"correction": _choice((*CORRECTIONS, UNSTATED))}}


def _read_csv(path: Path) -> pd.DataFrame:
    """Every cell as text; a row with another number of fields than the header, text that is not
    UTF-8 or CSV that does not parse is refused naming the file and line (pandas would pad a short
    row, or fail with its own traceback)."""
    import csv

    try:
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh, strict=True)
            header = next(reader, None)
            if not header:
                raise PaperDataError(f"{path}: empty file (needs a header line)")
            rows = []
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise PaperDataError(f"{path}: line {reader.line_num}: {len(row)} fields, the header has "
                                         f"{len(header)}")
                rows.append(row)
    except UnicodeDecodeError as e:
        raise PaperDataError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except csv.Error as e:
        raise PaperDataError(f"{path}: line {reader.line_num}: not valid CSV ({e})") from None
    except OSError as e:
        raise PaperDataError(f"{path}: cannot read: {e.strerror or e}") from None
    return pd.DataFrame(rows, columns=header, dtype=str)


def read_paper_csv(path: Path, name: str) -> pd.DataFrame:
    """One published-values CSV, every identity value checked and parsed (PaperDataError if not)."""
    raw = _read_csv(path)
    missing = [c for c in REQUIRED[name] if c not in raw.columns]
    if missing:
        raise PaperDataError(f"{path}: column {missing[0]!r} missing (needs: {', '.join(REQUIRED[name])})")
    parsers = {**PARSERS, **FILE_PARSERS.get(name, {})}
    rows = []
    for i, r in enumerate(raw.to_dict("records")):
        out = dict(r)
        for col in REQUIRED[name]:
            if col not in parsers:
                continue
            try:
                out[col] = parsers[col](r[col].strip(), r)
            except ValueError as e:
                what = " ".join(str(r.get(c, "")) for c in ("paper", "benchmark", "label") if r.get(c))
                raise PaperDataError(f"{path}: line {i + 2} ({what}): {col}={r[col]!r} matches no config value; "
                                     f"allowed: {e}") from None
        rows.append(out)
    return pd.DataFrame(rows, columns=list(raw.columns))


def load_paper(directory: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """The four published-values tables (main, uaq, throughput, kl) of `directory` (default analysis/)."""
    d = Path(directory) if directory else analysis_dir()
    missing = [n for n in NAMES if not (d / f"paper_{n}.csv").exists()]
    if missing:
        raise PaperDataError(f"{d}: published values paper_{missing[0]}.csv not found (analysis/ of the suite source)")
    return {n: read_paper_csv(d / f"paper_{n}.csv", n) for n in NAMES}


# ------------------------------------------------------------------------------ pairing


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and not pd.isna(a) and not pd.isna(b) and math.isclose(
            float(a), float(b), rel_tol=1e-9)
    return a == b


def matches(measured: dict, ident: dict) -> bool:
    """Whether a measured row has the published row's identity (`algo = unstated` matches any)."""
    for k, v in ident.items():
        if k == "algo" and v == UNSTATED:
            continue
        if not _same(measured[k], v):
            return False
    return True


MEASURED_FIELDS = ("task", "model", "algo", "backend", "steps", "lr", "trainer_dtype", "kernels", "bf16_kernels",
                   "variant", "group_key", "n", "seeds", "values")


def _measured(m: dict | None, stat_cols: dict) -> dict:
    out = {f"{MEASURED_LABEL}: {k}": (m.get(k) if m else (0 if k == "n" else "")) for k in MEASURED_FIELDS}
    out[f"{MEASURED_LABEL}: configuration"] = describe_row(m) if m else "no measured run with this identity"
    for label, col in stat_cols.items():
        out[f"{MEASURED_LABEL}: {label}"] = m.get(col, math.nan) if m else math.nan
    out[f"{MEASURED_LABEL}: not averaged"] = m.get("not_averaged", "") if m else ""
    return out


def _paired(paper_rows: pd.DataFrame, measured: pd.DataFrame, ident_cols, stat_cols: dict, base: dict,
            grid: list[dict] = ()) -> pd.DataFrame:
    """One row per published identity x measured row of that identity (or one row, n = 0, when
    none): the identity, a `paper: <paper> <benchmark> (%)` column per published benchmark, and
    the measured row's identity, n, per-seed values and statistics."""
    bench = list(dict.fromkeys(zip(paper_rows["paper"], paper_rows["benchmark"])))
    real = measured[(measured["group_key"] != "")].to_dict("records")
    real = [m for m in real if all(_same(m[k], v) for k, v in base.items())]
    idents = []
    for key, g in paper_rows.groupby(["paper", "label", *ident_cols], sort=False, dropna=False):
        vals = {(p, b): v for p, b, v in zip(g["paper"], g["benchmark"], g["value"])}
        idents.append((dict(zip(["paper", "label", *ident_cols], key)), vals))
    idents += [(g, {}) for g in grid]
    rows = []
    for ident, vals in idents:
        head = {"paper": ident["paper"], "label": ident["label"],
                "method": method_label(ident["correction"], ident["aligned_forward"]),
                **{k: ident[k] for k in ident_cols}}
        head.update({f"{PAPER_LABEL}: {p} {b} (%)": vals.get((p, b), math.nan) for p, b in bench})
        found = [m for m in real if matches(m, {k: ident[k] for k in ident_cols})]
        rows += [{**head, **_measured(m, stat_cols)} for m in (found or [None])]
    return pd.DataFrame(rows)


def paper_vs_main(main: pd.DataFrame, paper_main: pd.DataFrame) -> pd.DataFrame:
    """The papers' main tables beside ours, matched on the full identity (MAIN_IDENTITY) at the
    reference learning rate with no per-group LR control. Published values are from the papers'
    own models, GPUs and benchmarks; measured ones from the runs at hand."""
    return _paired(paper_main, main, MAIN_IDENTITY,
                   {"acc (%)": "acc_pct", "CI low": "acc_ci_low", "CI high": "acc_ci_high", "CI method": "ci_method"},
                   {"lr_factor": 1.0, "uaq_group_lr_s": 1.0})


def paper_vs_uaq(uaq: pd.DataFrame, paper_uaq: pd.DataFrame, grid=()) -> pd.DataFrame:
    """QuRL's UAQ ablation beside ours, matched on UAQ_IDENTITY (s, LR factor and per-group LR
    control included). `grid`: (s, lr_factor, group_lr_s) settings the paper did not run, added
    for its ablated identity with no published value (e.g. the per-group LR control)."""
    extra = []
    ablated = ["paper", "precision", "fp8_granularity", "correction", "aligned_forward", "algo"]
    for key, g in paper_uaq.groupby(ablated, sort=False):
        base = dict(zip(ablated, key))
        have = {(float(s), float(f), float(q)) for s, f, q in zip(g["uaq_s"], g["lr_factor"], g["uaq_group_lr_s"])}
        extra += [{**base, "label": f"{uaq_label(s, f, q)} (not in the paper)", "uaq_s": s, "lr_factor": f,
                   "uaq_group_lr_s": q} for s, f, q in grid if (s, f, q) not in have]
    return _paired(paper_uaq, uaq, UAQ_IDENTITY,
                   {"acc (%)": "acc_pct", "CI low": "acc_ci_low", "CI high": "acc_ci_high", "CI method": "ci_method",
                    "visibility (%)": "visibility_pct"}, {}, extra)


def paper_vs_throughput(thr: pd.DataFrame, paper_thr: pd.DataFrame) -> pd.DataFrame:
    """Rollout speed-up: the paper's ranges (their models on H100) and ours, one configuration a
    row, in one long table with a `source` column."""
    rows = []
    for _, p in paper_thr.iterrows():
        rows.append({"source": f"{PAPER_LABEL} ({p['paper']}, {p['hardware']})", "precision": p["precision"],
                     "model": p["model"], "configuration": f"{p['precision']} vs {p['baseline']}",
                     "speedup_pct_low": p["speedup_low_pct"], "speedup_pct_high": p["speedup_high_pct"],
                     "reference": p["baseline"].lower(), "sync_share_pct": math.nan, "n": math.nan})
    for m in thr.to_dict("records"):
        if m["precision"] in ("bf16", "fp32") or pd.isna(m["speedup"]):
            continue
        pct = (m["speedup"] - 1) * 100
        rows.append({"source": f"{MEASURED_LABEL} (runs at hand)", "precision": m["precision"], "model": m["model"],
                     "configuration": describe_row(m), "speedup_pct_low": pct, "speedup_pct_high": pct,
                     "reference": m["speedup_ref"], "sync_share_pct": m["sync_share_pct"], "n": m["n"]})
    return pd.DataFrame(rows, columns=["source", "precision", "model", "configuration", "speedup_pct_low",
                                       "speedup_pct_high", "reference", "sync_share_pct", "n"])


def growth(first: float, last: float) -> float:
    """last / first when both are positive; the k1 estimate of a tiny KL can be negative, and a
    ratio with a negative end says nothing about drift."""
    return last / first if first > 0 and last > 0 else math.nan


def paper_vs_kl(kl: pd.DataFrame, paper_kl: pd.DataFrame) -> pd.DataFrame:
    """KL drift: QuRL's 0.002 -> 0.025 after ~1000 steps beside each measured configuration."""
    rows = []
    for _, p in paper_kl.iterrows():
        corr = "correction unstated" if p["correction"] == UNSTATED else p["correction"]
        rows.append({"source": f"{PAPER_LABEL} ({p['paper']}, {p['hardware']})",
                     "configuration": f"{p['precision']}, {corr}", "kl_first": p["kl_start"], "kl_last": p["kl_end"],
                     "steps": p["steps"], "n": math.nan})
    for m in kl.to_dict("records"):
        rows.append({"source": f"{MEASURED_LABEL} (runs at hand)", "configuration": describe_row(m),
                     "kl_first": m["kl_first"], "kl_last": m["kl_last"], "steps": m["last_step"], "n": m["n"]})
    df = pd.DataFrame(rows, columns=["source", "configuration", "kl_first", "kl_last", "steps", "n"])
    df["kl_growth"] = [growth(a, b) for a, b in zip(df["kl_first"], df["kl_last"])]
    return df
