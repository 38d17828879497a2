"""The papers' published values (analysis/paper_*.csv) and their pairing with measured scores.

Every published accuracy is one cell of a paper's table: its `table`, `row` and `column` (where it
sits, so the report can redraw the table in the paper's layout), the `benchmark` (`benchmark_id`: the
data source `suite data prepare` writes, or `mean:a+b+...` for an average the paper takes), the
metric (`k` samples per prompt: 1 for greedy pass@1, 32 for Avg@32), and the trained policy's full
identity as config values: precision, fp8_granularity, correction, uaq_s, aligned_forward, algo (and
for the UAQ ablation lr_factor and uaq_group_lr_s), the paper `recipe` (suite.recipes) and the model
(`model_id`, matched within the run's model name). QuRL's "QuRL" column is correction acr (UAQ s =
1.5 where the paper uses UAQ), "FlashRL" tis at s = 1, "BF16" a bf16 rollout with the stock pipeline
(naive, s = 1), "RL (naive)" QuRL's uncorrected run (bypass; docs/math.md); an untrained model's row
has correction `base` and pairs with `suite eval --model` scores of that model (runs tagged correction
base). A measured value pairs with a published one only when
all of that matches: the scores `suite eval` logged for that benchmark at that k (bf16, the papers'
engine; the rollout engine beside it), never a run's in-training validation and never a mean over
benchmarks the paper did not average. A value that is not a config value stops the report
(PaperDataError), naming the file, the line and the key.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from suite.report.cells import cell_stats, describe_row, empty_stats, uaq_label
from suite.report.identity import ALGOS, CORRECTIONS, FP8_GRANULARITIES, PRECISIONS, method_label

PAPER_LABEL = "paper"  # column prefix of published values (their models, GPUs, benchmarks)
MEASURED_LABEL = "measured"  # column prefix of values from the runs at hand
UNSTATED = "unstated"  # an identity value the paper does not state
NAMES = ("main", "uaq", "throughput", "kl")
MAIN_IDENTITY = ("precision", "fp8_granularity", "correction", "aligned_forward", "uaq_s", "algo")
UAQ_IDENTITY = (*MAIN_IDENTITY, "lr_factor", "uaq_group_lr_s")
BASE = "base"  # the correction of an untrained model's row (a paper's "base" line): `suite eval --model` runs
PLACE = ("paper", "table", "row", "column", "benchmark", "benchmark_id", "metric", "k", "label")
# Columns each file must have; the identity ones are checked against the config's values.
REQUIRED = {
    "main": (*PLACE, *MAIN_IDENTITY, "recipe", "model_id", "value", "source"),
    "uaq": (*PLACE, *UAQ_IDENTITY, "recipe", "model_id", "value", "source"),
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


def _samples(raw: str, row: dict) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError("a whole number of samples per prompt >= 1")
    return int(raw)


def _recipe(raw: str, row: dict) -> str:
    from suite.recipes import DEFAULT_RECIPE, RECIPES

    allowed = [n for n in RECIPES if n != DEFAULT_RECIPE]
    if raw not in allowed:
        raise ValueError(", ".join(repr(a) for a in allowed))
    return raw


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
    "k": _samples,
    "recipe": _recipe,
}
# Per file, parsers that differ: QuRL does not say under which correction its KL drift was measured;
# a main-table row may be an untrained model's.
FILE_PARSERS = {"kl": {"correction": _choice((*CORRECTIONS, UNSTATED))},
                "main": {"correction": _choice((*CORRECTIONS, BASE))}}


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
    place = ("paper", "table", "row", "column")
    if all(c in raw.columns for c in place):
        first: dict[tuple, int] = {}
        for i, r in enumerate(rows):
            at = tuple(r[c] for c in place)
            if at in first:  # one cell of a paper's table holds one published value
                raise PaperDataError(f"{path}: line {i + 2}: {', '.join(at)} is already the cell of line {first[at]}")
            first[at] = i + 2
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


def _model_matches(model: str, model_id: str) -> bool:
    """A published model (`model_id`, e.g. Qwen2.5-Math-7B, or a size such as 7B) within the run's model
    name (its checkpoint directory's name), case and separators aside."""
    def norm(x: str) -> str:
        return "".join(ch for ch in str(x).lower() if ch.isalnum())

    return bool(model_id) and norm(model_id) in norm(model)


MEASURED_FIELDS = ("task", "model", "algo", "backend", "steps", "lr", "trainer_dtype", "recipe", "group_key")
ENGINES = ("bf16", "rollout")  # the papers' engine, and the run's rollout engine beside it


def aggregate(metric: str, k: int) -> str:
    """How a published value aggregates its k samples: "pass" (pass@k: any of k right) where its metric says
    pass@k for k > 1, else "mean" (mean@k / Avg@k; greedy pass@1 is mean@1)."""
    return "pass" if k > 1 and f"pass@{k}" in str(metric) else "mean"


def _per_run(evals: pd.DataFrame, benchmark_id: str, k: int, engine: str, agg: str = "mean") -> pd.DataFrame:
    """One value per run (accuracy in %) of `benchmark_id` at k samples (`agg`: mean@k or pass@k) by `engine`:
    the benchmark's score, or for `mean:a+b+..` the mean of its parts where the run has every part."""
    e = evals[(evals["engine"] == engine) & (evals["k"] == k) & (evals["agg"] == agg)]
    parts = benchmark_id[len("mean:"):].split("+") if benchmark_id.startswith("mean:") else [benchmark_id]
    e = e[e["benchmark"].isin(parts)]
    rows = []
    for _, g in e.groupby("mlflow_run_id", sort=False):
        if set(g["benchmark"]) == set(parts):
            rows.append({**g.iloc[0].to_dict(), "value_pct": 100.0 * float(g["eval_acc"].mean())})
    return pd.DataFrame(rows, columns=[*evals.columns, "value_pct"])


def paired_scores(paper_rows: pd.DataFrame, evals: pd.DataFrame, ident_cols) -> pd.DataFrame:
    """One row per published value x measured configuration of its identity (one row with n = 0 when
    none): where the value sits (paper, table, row, column), the benchmark and metric, the identity,
    the published value and its source, then per engine (bf16, rollout) the measured n, mean, 95% CI
    and per-seed values of `suite eval`'s scores, and rollout - bf16."""
    out = []
    for _, p in paper_rows.iterrows():
        head = {c: p[c] for c in (*PLACE, *ident_cols, "recipe", "model_id")}
        head["method"] = "base model" if p["correction"] == BASE else method_label(p["correction"],
                                                                                  p["aligned_forward"])
        head[f"{PAPER_LABEL} (%)"] = p["value"]
        head["source"] = p["source"]
        found = pd.DataFrame()
        if len(evals):
            ident = {k: p[k] for k in ident_cols}
            bid = p["benchmark_id"]
            parts = bid[len("mean:"):].split("+") if bid.startswith("mean:") else [bid]
            # the scores of this benchmark (or of its parts) at this k, by runs of this identity, recipe and model
            agg = aggregate(p["metric"], int(p["k"]))
            found = evals[[r["benchmark"] in parts and r["k"] == p["k"] and r["agg"] == agg and matches(r, ident)
                           and r["recipe"] == p["recipe"] and _model_matches(r["model"], p["model_id"])
                           for r in evals.to_dict("records")]]
        # one row per configuration and scored checkpoint step: scores of different steps are never pooled
        configs = list(dict.fromkeys(zip(found["group_key"], found["eval_step"]))) if len(found) else [None]
        for key in configs:
            rows = found[(found["group_key"] == key[0]) & (found["eval_step"] == key[1])] if key is not None else found
            row = dict(head)
            first = rows.iloc[0].to_dict() if len(rows) else {}
            for f in MEASURED_FIELDS:
                row[f"{MEASURED_LABEL}: {f}"] = first.get(f, "")
            step = first.get("eval_step", -1)
            row[f"{MEASURED_LABEL}: step"] = "" if not first else ("?" if int(step) < 0 else int(step))
            row[f"{MEASURED_LABEL}: configuration"] = describe_row(first) if first else \
                "no measured run of this benchmark and identity"
            means = {}
            for engine in ENGINES:
                per = _per_run(rows, p["benchmark_id"], int(p["k"]), engine, aggregate(p["metric"], int(p["k"]))) \
                    if len(rows) else pd.DataFrame()
                stats = cell_stats(per, "value_pct") if len(per) else empty_stats()
                means[engine] = stats["mean"]
                for stat, value in stats.items():
                    row[f"{MEASURED_LABEL} {engine}: {stat}"] = value
            row[f"{MEASURED_LABEL}: rollout - bf16"] = means["rollout"] - means["bf16"]
            out.append(row)
    return pd.DataFrame(out)


def paper_vs_main(evals: pd.DataFrame, paper_main: pd.DataFrame) -> pd.DataFrame:
    """Every published value of the papers' main tables beside `suite eval`'s scores of the same
    benchmark, metric, identity, recipe and model (`paired_scores`), at the reference learning rate
    with no per-group LR control."""
    ref = evals[(evals["lr_factor"] == 1.0) & (evals["uaq_group_lr_s"] == 1.0)] if len(evals) else evals
    return paired_scores(paper_main, ref, MAIN_IDENTITY)


def paper_vs_uaq(evals: pd.DataFrame, paper_uaq: pd.DataFrame, grid=()) -> pd.DataFrame:
    """QuRL's UAQ ablation beside the measured scores, matched on UAQ_IDENTITY (s, LR factor and
    per-group LR control included). `grid`: (s, lr_factor, group_lr_s) settings the paper did not
    run but the runs did (the per-group LR control), added with no published value."""
    extra = []
    for key, g in paper_uaq.groupby(["paper", "table", "benchmark", "benchmark_id", "metric", "k", "precision",
                                     "fp8_granularity", "correction", "aligned_forward", "algo", "recipe", "model_id"],
                                    sort=False):
        have = {(float(s), float(f), float(q)) for s, f, q in zip(g["uaq_s"], g["lr_factor"], g["uaq_group_lr_s"])}
        base = g.iloc[0].to_dict()
        for s, f, q in grid:
            if (s, f, q) not in have:
                label = f"{uaq_label(s, f, q)} (not in the paper)"
                extra.append({**base, "row": label, "label": label, "uaq_s": s, "lr_factor": f, "uaq_group_lr_s": q,
                              "value": math.nan, "source": "ours: the control the paper does not run"})
    rows = pd.concat([paper_uaq, pd.DataFrame(extra)], ignore_index=True) if extra else paper_uaq
    return paired_scores(rows, evals, UAQ_IDENTITY)


def layout(pvs: pd.DataFrame, paper: str, table: str) -> pd.DataFrame:
    """One paper table in its own layout: its rows and columns in the paper's order, each cell the
    published value, then ours (bf16, mean over seeds, n) where a run of that cell was scored."""
    sel = pvs[(pvs["paper"] == paper) & (pvs["table"] == table)]
    rows = list(dict.fromkeys(sel["row"]))
    cols = list(dict.fromkeys(sel["column"]))
    out = []
    for r in rows:
        line = {"": r}
        for c in cols:
            cell = sel[(sel["row"] == r) & (sel["column"] == c)]
            line[c] = _cell(cell) if len(cell) else ""
        out.append(line)
    return pd.DataFrame(out, columns=["", *cols])


def _cell(cell: pd.DataFrame) -> str:
    first = cell.iloc[0]
    value = first[f"{PAPER_LABEL} (%)"]
    text = "—" if pd.isna(value) else f"{float(value):.2f}"
    ours = [f"{m:.1f} (n={int(n)})" for m, n in zip(cell[f"{MEASURED_LABEL} bf16: mean"],
                                                     cell[f"{MEASURED_LABEL} bf16: n"]) if n]
    return text + (" | ours " + ", ".join(ours) if ours else "")


# The papers' tables the report redraws: (paper, table) -> title.
LAYOUTS = {("QuRL", "table1"): "QuRL Table 1: GSM8K accuracy (PPO)",
           ("QuRL", "table2"): "QuRL Table 2: AIME 2024 (DAPO)",
           ("QuRL", "table3"): "QuRL Table 3: DeepScaleR, five benchmarks Avg@32",
           ("QuRL", "uaq"): "QuRL UAQ ablation: AIME 2024 Avg@32 (INT8, DAPO)",
           ("QaRL", "table1"): "QaRL Table 1: in- and out-of-distribution benchmarks",
           ("QaRL", "table3"): "QaRL Table 3: Qwen3-8B-Base, GRPO vs TBPO"}


# `suite bench vllm` rows as the report reads them (suite/bench/vllm_bench.py writes <out>/vllm.json)
BENCH_COLUMNS = ("rollout", "precision", "model", "shape", "kernels", "device", "gpu", "vllm", "prompts",
                 "prompt_len", "response_len", "rollout_tok_s", "speedup_vs_bf16", "sync_share_pct")
_BENCH_PRECISION = {"bf16": "bf16", "int8": "int8", "fp8_per_channel": "fp8", "w4a16": "w4a16"}


def load_bench(paths) -> pd.DataFrame:
    """The measured rows of `suite bench vllm` result files (its ``vllm.json``, schema
    suite.schemas.BenchVllmFile), one row per precision that ran; a file that is not one raises
    :class:`PaperDataError` naming it and the field."""
    from suite.schemas import BenchVllmFile, SchemaError, read_json

    rows = []
    for path in paths or ():
        try:
            doc = read_json(BenchVllmFile, path)
            measured = doc.measured(path)
        except FileNotFoundError:
            raise PaperDataError(f"--bench {path}: no such file") from None
        except OSError as exc:
            raise PaperDataError(f"--bench {path}: cannot read it ({exc.strerror or exc})") from None
        except SchemaError as exc:
            raise PaperDataError(f"--bench {exc} (a `suite bench vllm` result, its <out>/vllm.json)") from None
        for r in measured:
            rows.append({**{c: getattr(r, c) for c in BENCH_COLUMNS if c != "precision"},
                         "precision": _BENCH_PRECISION[r.rollout]})
    return pd.DataFrame(rows, columns=list(BENCH_COLUMNS))


def paper_vs_throughput(thr: pd.DataFrame, paper_thr: pd.DataFrame, bench: pd.DataFrame | None = None) -> pd.DataFrame:
    """Rollout speed-up: the paper's ranges (their models on H100), ours from the runs at hand, and
    vLLM's serving kernels measured by `suite bench vllm` (``bench``, :func:`load_bench`), one
    configuration a row, in one long table with a `source` column."""
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
    for b in ([] if bench is None else bench.to_dict("records")):
        if b["rollout"] == "bf16" or pd.isna(b["speedup_vs_bf16"]):
            continue
        pct = (b["speedup_vs_bf16"] - 1) * 100
        where = b["gpu"] if isinstance(b["gpu"], str) and b["gpu"] else "vLLM CPU build"
        rows.append({"source": f"{MEASURED_LABEL} (suite bench vllm, {where}, vLLM {b['vllm']})",
                     "precision": b["precision"], "model": b["model"],
                     "configuration": f"{b['rollout']} on {b['kernels']}, {b['shape']} dummy weights, "
                                      f"{int(b['prompts'])} x ({int(b['prompt_len'])} + "
                                      f"{int(b['response_len'])}) tokens",
                     "speedup_pct_low": pct, "speedup_pct_high": pct, "reference": "bf16",
                     "sync_share_pct": b["sync_share_pct"], "n": 1})
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
