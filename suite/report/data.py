"""The data contract: MLflow runs -> one tidy DataFrame per run and one per run x step.

    data = load_runs("sqlite:///mlflow.db", experiment="suite")
    data.runs      # one row per MLflow run: RUN_COLUMNS (ids, status, axes, lr) + per-run summaries
    data.history   # one row per run x step: mlflow_run_id, step, the axes, one column per metric

Every table of `suite.report.tables` is a pure function of these two frames; plotting
(`suite.report.plots`) is separate. Runs are read with MLflow's paged batch search
(`MlflowClient.search_runs`, up to 50,000 runs a request) and metric histories through
MLflow's public client on 8 threads, or one SQL query for all keys on the MLflow versions whose
tables that query is tested against (`suite.report.history`).

Runs of every status are kept; the tables average only FINISHED runs and list the others
(`tables.run_status`). Axis values come from the run's tags (`suite.config.axes`); the identity
columns (trainer dtype, FP8 granularity, kernel paths, per-group LR control, group key) from
their tags too, falling back to the run's params (`suite.report.identity`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from suite.report.identity import (  # noqa: F401 (SUPERSEDED: a status of the frame, with FINISHED and MISSING)
    IDENTITY_DEFAULTS,
    SUPERSEDED,
    fill_group_keys,
    from_tags_and_params,
    logged_before_rename,
    method_label,
    supersede,
)
from suite.report.history import read_history
from suite.tracking.values import held_out_keys
from suite.report.summaries import ACC, ACC_ROLLOUT, summarize  # noqa: F401 (summarize: part of this module's API)

log = logging.getLogger(__name__)

# The tags every run carries (suite.config.axes), in table order.
AXES = ("backend", "precision", "correction", "uaq_s", "algo", "task", "model", "aligned_forward", "seed")
# Columns of `RunData.runs` that identify and describe a run (before the per-run summaries).
# `group_key` is equal for runs whose semantic configs differ only by the seed, `config` holds those
# params as JSON (suite.report.identity).
RUN_COLUMNS = (
    "mlflow_run_id", "run_name", "experiment_id", "status", "start_time", "end_time",
    "parent_run_id", "sweep", "cell", "run_id", *AXES, "trainer_dtype", "fp8_granularity", "kernels",
    "bf16_kernels", "kernels_executed", "uaq_group_lr_s", "lr", "steps", "method", "group_key", "config",
    "acc_metric", "recipe", "recipe_deviations", "evals",
)
# Identity columns the step-by-step history carries beside the axes.
HISTORY_IDENTITY = ("trainer_dtype", "fp8_granularity", "kernels", "bf16_kernels", "uaq_group_lr_s", "steps",
                    "group_key")
# Text columns of the run frame (read back from runs.csv as text, never as numbers).
TEXT_COLUMNS = ("mlflow_run_id", "run_name", "experiment_id", "status", "parent_run_id", "sweep", "run_id", "backend",
                "precision", "correction", "algo", "task", "model", "trainer_dtype", "fp8_granularity", "kernels",
                "bf16_kernels", "kernels_executed", "method", "group_key", "config", "acc_metric", "recipe",
                "recipe_deviations", "evals")
# Metrics read step by step into `RunData.history` (MLflow names: docs/metrics.md, with `@`
# sanitized to `_at_`). Held-out accuracy is task specific; `load_runs` adds its keys.
HISTORY_KEYS = (
    "critic/score/mean",
    "train/acc",
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_max",
    "rollout_corr/rollout_is_ratio_fraction_high",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_high_bound",
    "actor/pg_clipfrac_low_bound",
    "quant/update_code_changed_frac",
    "quant/update_step_ratio",
    "perf/gen_tokens_per_s",
    "timing_s/update_weights",
    "timing_s/gen",
    "timing_s/step",
    "response/error_ratio",
    "actor/acr_relaxed_frac",
    "actor/acr_tightened_frac",
    # the mechanism (docs/metrics.md): how far r = pi_prox / pi_behav strays, how often the clip binds,
    # how far the update moves (PPO KL, R's upper tail), entropy, gradient norm, error tokens, ACR's inversions
    "rollout_corr/ratio_p1",
    "rollout_corr/ratio_p99",
    "rollout_corr/ratio_frac_below_0.5",
    "rollout_corr/ratio_frac_above_2",
    "actor/ppo_kl",
    "actor/ratio_p99",
    "actor/entropy",
    "actor/grad_norm",
    "response/rep4_rate/mean",
    "actor/acr_inverted_frac",
    # the paired gradient probe (train.grad_probe_every): naive vs TIS gradient on one batch
    "actor/grad_probe_cos",
    "actor/grad_probe_norm_ratio",
)
FINISHED = "FINISHED"
MISSING = "MISSING"  # an expected sweep cell with no MLflow run

SEARCH_PAGE = 50_000  # runs per search request (mlflow's SEARCH_MAX_RESULTS_THRESHOLD)


def acc_key(task: str) -> str:
    """MLflow key of held-out accuracy for `task` (docs/metrics.md; `@1` sanitized to `_at_1`)."""
    return f"val-core/{task}/acc/mean_at_1"


def rollout_acc_key(task: str) -> str:
    """MLflow key of the quantized rollout copy's held-out accuracy (task.eval_rollout_copy)."""
    return f"val-aux/{task}/rollout_acc/mean_at_1"


@dataclass
class RunData:
    """What `load_runs` read: the two tidy frames and where they came from."""

    runs: pd.DataFrame  # one row per run (RUN_COLUMNS + summaries)
    history: pd.DataFrame  # one row per run x step (mlflow_run_id, step, axes, metric columns)
    source: dict = field(default_factory=dict)  # tracking_uri, experiments, filter, parent_run_id, sweep
    timings_s: dict = field(default_factory=dict)  # search / history / summarise seconds


def _progress(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"suite report: {msg}", file=sys.stderr, flush=True)


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def experiment_ids(client, experiment: str | None) -> list[str]:
    """Ids of experiment `experiment` (by name, else by id), or of every active experiment."""
    if experiment is None:
        ids, token = [], None
        while True:
            page = client.search_experiments(max_results=1000, page_token=token)
            ids += [e.experiment_id for e in page]
            token = page.token
            if not token:
                return ids
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        try:
            exp = client.get_experiment(experiment)
        except Exception:  # noqa: BLE001 - not an id either
            exp = None
    if exp is None:
        names = sorted(e.name for e in client.search_experiments(max_results=1000))
        raise ValueError(f"--experiment {experiment!r}: no such MLflow experiment; "
                         f"known: {', '.join(names) or '(none)'}")
    return [exp.experiment_id]


def search_runs(client, exp_ids: list[str], filter_string: str = "") -> list:
    """Every run matching `filter_string` in `exp_ids`, in pages of SEARCH_PAGE runs."""
    from mlflow.entities import ViewType

    runs, token = [], None
    while True:
        page = client.search_runs(exp_ids, filter_string=filter_string, run_view_type=ViewType.ACTIVE_ONLY,
                                  max_results=SEARCH_PAGE, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def _float(value, default=float("nan")) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _int_or_na(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return pd.NA


# verl's names for the learning rate and the step count among the params its MLflow logger records
VERL_LR_PARAM = "actor_rollout_ref/actor/optim/lr"
VERL_STEPS_PARAM = "trainer/total_training_steps"


def _identity(row: dict, tags: dict, params: dict, before_rename: bool) -> dict:
    """Fill the axes and identity columns of `row` from a run's tags, falling back to its params."""
    for axis in AXES:
        row[axis] = str(tags.get(axis, ""))
    if row["seed"] == "":
        row["seed"] = params.get("seed", "")
    row.update(from_tags_and_params(tags, params, row["precision"], before_rename))
    row["uaq_s"] = _float(row["uaq_s"])
    row["aligned_forward"] = str(row["aligned_forward"]).lower() == "true"
    row["seed"] = _int_or_na(row["seed"])
    # a verl run's params are verl's own config (its MLflow logger flattens it with "/")
    # the learning rate the actor trained at: train.lr x train.lr_factor (verl's param already is that product)
    lr = _float(params.get("train.lr"))
    row["lr"] = lr * row["lr_factor"] if "train.lr" in params else _float(params.get(VERL_LR_PARAM))
    row["steps"] = _int_or_na(params.get("steps", params.get(VERL_STEPS_PARAM)))
    return row


def _run_row(run) -> dict:
    tags, params = run.data.tags, run.data.params
    info = run.info
    row = {
        "mlflow_run_id": info.run_id,
        "run_name": info.run_name,
        "experiment_id": info.experiment_id,
        "status": info.status,
        "start_time": pd.to_datetime(info.start_time, unit="ms", utc=True) if info.start_time else pd.NaT,
        "end_time": pd.to_datetime(info.end_time, unit="ms", utc=True) if info.end_time else pd.NaT,
        "parent_run_id": tags.get("mlflow.parentRunId", ""),
        "sweep": tags.get("sweep", ""),
        "cell": _int_or_na(tags.get("cell")),
        "run_id": tags.get("run_id", ""),
        # the rollout GEMM path that ran (suite.hardware.executed_kernels); "" = not recorded
        "kernels_executed": tags.get("kernels_executed", ""),
    }
    _identity(row, tags, params, logged_before_rename(tags))
    # Latest value of every metric (MLflow: the value at the largest step), for the tables' "final".
    # A verl run's data sources are its parquet's (e.g. openai/gsm8k), and its validation may be
    # mean@N (QuRL's Avg@32): the largest N it logged, mean over its data sources.
    metrics = run.data.metrics
    keys = [acc_key(row["task"])] if acc_key(row["task"]) in metrics else held_out_keys(metrics)[1]
    row["acc_metric"] = ";".join(keys) or acc_key(row["task"])  # the keys `acc` averages
    row[ACC] = sum(metrics[k] for k in keys) / len(keys) if keys else _float(None)
    row["evals"] = evals_json(metrics, {m.key: m.step for m in getattr(run.data, "_metric_objs", ())})
    return row


_EVAL_KEY = re.compile(r"^eval/(?P<benchmark>.+)/(?P<engine>[^/]+)/acc/(?P<agg>mean|pass)_at_(?P<k>\d+)$")


def evals_json(metrics: dict, steps: dict | None = None) -> str:
    """A run's `suite eval` scores (MLflow keys eval/<benchmark>/<engine>/acc/mean_at_<k> and pass_at_<k>, latest
    value: the one at the largest checkpoint step scored) as JSON {"<benchmark>|<engine>|<k>": {"acc": accuracy,
    "step": the checkpoint's step}} for mean@k, "<benchmark>|<engine>|pass<k>" for pass@k: the runs frame's `evals`
    column ("" when none). `steps`: each key's step (MLflow keeps it beside the latest value)."""
    found = {}
    for key, value in metrics.items():
        m = _EVAL_KEY.match(key)
        if m:
            step = (steps or {}).get(key)
            found[f"{m['benchmark']}|{m['engine']}|{'pass' if m['agg'] == 'pass' else ''}{m['k']}"] = {
                "acc": float(value), "step": None if step is None else int(step)}
    return json.dumps(found, sort_keys=True) if found else ""


def eval_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run x scored (benchmark, engine, k, agg) from the runs frame's `evals` column: the run's
    columns, then benchmark, engine, k, agg (mean: mean@k; pass: pass@k, any of k right), acc (a fraction) and
    eval_step, the RL step of the checkpoint scored (-1 where a frame written before the step was kept lacks it)."""
    rows = []
    for _, r in runs.iterrows():
        if not isinstance(r.get("evals"), str) or not r["evals"]:
            continue
        for key, score in json.loads(r["evals"]).items():
            benchmark, engine, k = key.rsplit("|", 2)
            agg = "pass" if k.startswith("pass") else "mean"
            acc, step = (score["acc"], score.get("step")) if isinstance(score, dict) else (score, None)
            rows.append({**r.to_dict(), "benchmark": benchmark, "engine": engine, "k": int(k.removeprefix("pass")),
                         "agg": agg, "eval_acc": acc, "eval_step": -1 if step is None else int(step)})
    return pd.DataFrame(rows, columns=[*runs.columns, "benchmark", "engine", "k", "agg", "eval_acc", "eval_step"])


def runs_frame(runs: list) -> pd.DataFrame:
    """MLflow `Run` entities -> the tidy one-row-per-run frame (RUN_COLUMNS + `acc`).

    When one configuration and seed finished more than once (the same suite `run_id` tag, or the
    same group key and seed), only the latest finished run counts; the earlier ones get status
    SUPERSEDED (`suite.report.identity.supersede`), so no seed is averaged twice.
    """
    rows = [_run_row(r) for r in runs]
    return supersede(coerce_runs(pd.DataFrame(rows, columns=[*RUN_COLUMNS, ACC])), FINISHED)


def coerce_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Give the run frame its dtypes (also after a CSV round trip, as the notebook does), the
    identity columns a frame lacks (IDENTITY_DEFAULTS), a group key on every row and `method`."""
    df = df.copy()
    for col, default in {**IDENTITY_DEFAULTS, "kernels_executed": ""}.items():
        if col not in df.columns:
            df[col] = default
    df["kernels_executed"] = df["kernels_executed"].fillna("").astype(str)
    for col in ("cell", "seed", "steps"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    for col in ("uaq_s", "lr", ACC):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df["uaq_group_lr_s"] = pd.to_numeric(df["uaq_group_lr_s"], errors="coerce").fillna(1.0).astype(float)
    df["lr_factor"] = pd.to_numeric(df["lr_factor"], errors="coerce").fillna(1.0).astype(float)
    df["aligned_forward"] = df["aligned_forward"].map(
        lambda v: v if isinstance(v, bool) else str(v).lower() == "true").astype(bool)
    for col in ("start_time", "end_time"):
        df[col] = pd.to_datetime(df[col], utc=True, errors="coerce")
    for col in ("acc_metric", "evals"):  # frames and runs.csv files written before the column existed
        if col not in df:
            df[col] = ""
    for col in TEXT_COLUMNS:
        if col == "method":
            continue
        df[col] = df[col].fillna("").astype(str)
    df["method"] = [method_label(c, a) for c, a in zip(df["correction"], df["aligned_forward"])]
    return fill_group_keys(df)


def history_frame(long: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Long (run, step, key, value) -> one row per run x step, a column per metric, the axes
    as columns, `acc` = the run's own task's held-out accuracy and `acc_rollout` = its quantized
    rollout copy's (NaN between evaluations, and where the run did not score its copy)."""
    cols = ["mlflow_run_id", "step"]
    if long.empty:
        wide = pd.DataFrame(columns=cols)
    else:
        # (run, step, key) is unique after `read_history`; pivot keeps NaN values (pivot_table drops them).
        wide = long.pivot(index=cols, columns="key", values="value").reset_index()
        wide.columns.name = None
    meta = runs[["mlflow_run_id", "status", "method", "lr", *AXES, *HISTORY_IDENTITY]]
    wide = wide.merge(meta, on="mlflow_run_id", how="left")
    acc = np.full(len(wide), np.nan)
    # the keys each run's `acc` averages (its own task's mean@1 where the column is empty)
    metric_of = {r: m or acc_key(t) for r, m, t in zip(runs["mlflow_run_id"], runs["acc_metric"], runs["task"])}
    run_metric = wide["mlflow_run_id"].map(metric_of).fillna("")
    for metric in run_metric.unique():
        keys = [k for k in str(metric).split(";") if k]
        if keys and all(k in wide.columns for k in keys):
            sel = (run_metric == metric).to_numpy()
            acc[sel] = wide.loc[sel, keys].to_numpy(dtype=float).mean(axis=1)
    wide[ACC] = acc
    acc = np.full(len(wide), np.nan)
    for task in runs["task"].unique():
        key = rollout_acc_key(task)
        if key in wide.columns:
            sel = (wide["task"] == task).to_numpy()
            acc[sel] = wide.loc[sel, key].to_numpy(dtype=float)
    wide[ACC_ROLLOUT] = acc
    wide["step"] = wide["step"].astype(int)
    lead = ["mlflow_run_id", "step", "status", "method", "lr", *AXES, *HISTORY_IDENTITY, ACC, ACC_ROLLOUT]
    rest = sorted(c for c in wide.columns if c not in lead)
    return wide[lead + rest].sort_values(["mlflow_run_id", "step"]).reset_index(drop=True)


# ------------------------------------------------------------------------------ entry point


def load_runs(
    tracking_uri: str,
    *,
    experiment: str | None = None,
    filter_string: str = "",
    parent_run_id: str | None = None,
    history_keys=HISTORY_KEYS,
    history_source: str = "auto",
    quiet: bool = True,
) -> RunData:
    """Read runs from MLflow into the tidy frames.

    tracking_uri: any MLflow tracking URI (sqlite:///..., http://host:port, ...).
    experiment: experiment name (or id); None = every active experiment.
    filter_string: an MLflow search filter (``tags.precision = 'int8' and params.seed = '0'``).
    parent_run_id: only the children of this run (a sweep's or a study's parent run).
    history_keys: metric keys read step by step (held-out accuracy keys are always added).
    history_source: auto | client | sql: how they are read (suite.report.history).
    """
    t0 = time.perf_counter()
    client = _client(tracking_uri)
    exp_ids = experiment_ids(client, experiment)
    flt = filter_string.strip()
    if parent_run_id:
        parent_flt = f"tags.`mlflow.parentRunId` = '{parent_run_id}'"
        flt = f"{flt} and {parent_flt}" if flt else parent_flt
    try:
        mruns = search_runs(client, exp_ids, flt) if exp_ids else []
    except Exception as e:  # an MLflow filter syntax error: say which option it came from
        from mlflow.exceptions import MlflowException

        if isinstance(e, MlflowException):
            raise ValueError(f"--runs {filter_string!r}: MLflow rejected the filter: {e.message}") from e
        raise
    # The sweep's own parent run (suite.kind=sweep) is bookkeeping, not a cell.
    mruns = [r for r in mruns if r.data.tags.get("suite.kind") != "sweep"]
    t_search = time.perf_counter() - t0
    _progress(f"{len(mruns)} runs found in {t_search:.1f} s ({tracking_uri})", quiet)
    runs = runs_frame(mruns)
    tasks = [t for t in runs["task"].unique() if t]
    # each run's held-out keys (its acc_metric: its task's mean@1, or the mean@N verl logged)
    acc_keys = {k for m in runs["acc_metric"] for k in str(m).split(";") if k}
    keys = list(history_keys) + sorted(acc_keys | {rollout_acc_key(t) for t in tasks})
    t1 = time.perf_counter()
    long, used = read_history(client, runs["mlflow_run_id"].tolist(), keys, source=history_source)
    t_hist = time.perf_counter() - t1
    t2 = time.perf_counter()
    history = history_frame(long, runs)
    runs = summarize(runs, history)
    t_sum = time.perf_counter() - t2
    _progress(f"{len(long)} metric values read in {t_hist:.1f} s ({used})", quiet)
    source = {"tracking_uri": tracking_uri, "experiment": experiment, "experiment_ids": exp_ids,
              "filter": filter_string, "parent_run_id": parent_run_id or "", "history_source": used}
    return RunData(runs=runs, history=history, source=source,
                   timings_s={"search": t_search, "history": t_hist, "summarize": t_sum})


def add_missing(runs: pd.DataFrame, expected: list[dict]) -> pd.DataFrame:
    """Rows with status MISSING for expected cells that no loaded run carries (matched on the
    suite `run_id` tag, else on `cell`). A cell is a dict with `run_id`, `cell`, `lr`, the axes
    (`suite.config.axes`) and, ideally, `params`: its config flattened as MLflow params
    (`config_params`). With params, a missing cell joins the row of the loaded runs whose
    semantic config equals its own (it takes their group key and what they resolved at run
    time: trainer dtype, kernel paths); without, it keys on its axes."""
    have_ids = set(runs["run_id"])
    have_cells = set(runs["cell"].dropna().astype(int))
    # What a run resolves at run time (trainer dtype, kernel paths) a missing cell takes from its siblings.
    resolved = ["group_key", "trainer_dtype", "kernels", "bf16_kernels", "fp8_granularity"]
    by_config = {c: dict(zip(resolved, v)) for c, *v in zip(runs["config"], *(runs[k] for k in resolved)) if c}
    rows = []
    for cell in expected:
        if cell.get("run_id") in have_ids:
            continue
        if not cell.get("run_id") and cell.get("cell") in have_cells:
            continue
        row = {c: "" for c in RUN_COLUMNS}
        row.update({k: v for k, v in cell.items() if k in RUN_COLUMNS})
        params = {str(k): str(v) for k, v in (cell.get("params") or {}).items()}
        tags = {k: str(v) for k, v in cell.items() if k in AXES or k in IDENTITY_DEFAULTS}
        _identity(row, tags, params, before_rename=False)
        row["status"] = MISSING
        row["mlflow_run_id"] = ""
        if not params:
            row["lr"] = _float(cell.get("lr"))
            row["steps"] = _int_or_na(cell.get("steps"))
        if row["config"] in by_config:
            row.update(by_config[row["config"]])
        rows.append(row)
    if not rows:
        return runs
    extra = coerce_runs(pd.DataFrame(rows).reindex(columns=[*RUN_COLUMNS, ACC]))
    return pd.concat([runs, extra], ignore_index=True)


def config_params(cfg) -> dict[str, str]:
    """A run config as the MLflow params its run logs (its semantic config flattened, stringified,
    cut to MLflow's value limit, as `suite.tracking.loggers.MlflowLogger.log_params` does)."""
    from suite.identity import semantic_config
    from suite.tracking.loggers import MAX_PARAM_VAL_LENGTH, flatten_params

    flat = flatten_params(semantic_config(cfg))
    return {str(k): str(v)[:MAX_PARAM_VAL_LENGTH] for k, v in flat.items()}
