"""What a run is: its identity columns, read from MLflow tags with fallbacks to its params.

Two runs may be averaged into one table cell only when their semantic configurations are
equal except for the seed (docs/reports.md, "How rows are formed"). The run's `group_key` tag
says so directly (a hash of the config without the seed); runs logged before that tag existed
get a key derived here from their MLflow params (the flattened config) without `seed` and
without the params that do not change results (NON_SEMANTIC). The identity columns that a
reader needs to see (steps, lr, trainer dtype, kernel paths, FP8 granularity, ...) are columns
of their own, so rows that differ in them are told apart on the page too.
"""

from __future__ import annotations

import hashlib
import json
import math

import pandas as pd

from suite import config as _config
from suite import identity as _identity
from suite.core.losses import CORRECTIONS as _CORRECTION_REGISTRY

# Display label of each correction mode, in registry order (suite.core.losses.CORRECTIONS;
# docs/math.md). `naive` is the papers' uncorrected stock baseline (PPO ratio against the
# recomputed full-precision pi_prox), `bypass` is verl's behaviour-anchored PPO.
CORRECTION_LABELS = {name: c.label for name, c in _CORRECTION_REGISTRY.items()}
CORRECTIONS = tuple(CORRECTION_LABELS)
PRECISIONS = tuple(_config.PRECISIONS)
FP8_GRANULARITIES = tuple(_config.FP8_GRANULARITIES)
ALGOS = tuple(_config.ALGOS)
KERNEL_PATHS = ("native", "emulated")

# Params that never change a run's results: the list `suite.config.run_id` leaves out of its hash
# (a key is dropped with everything under it). Runs logged before it was left out of the params too
# still carry them.
NON_SEMANTIC = _identity.NON_SEMANTIC
SEED_PARAM = "seed"
# A run without this tag was logged before the correction modes were renamed: its `naive` was
# PPO anchored on pi_behav, i.e. today's `bypass`.
RENAME_MARKER = "group_key"

# Identity columns beyond the axes tags (suite.config.axes), with the value a run lacking them gets.
IDENTITY_DEFAULTS = {
    "trainer_dtype": "",  # bf16 | fp32 (trainer forward/backward); "" = not recorded
    "fp8_granularity": "",  # per_tensor | per_channel | block for fp8 runs, "" otherwise
    "kernels": "",  # native | emulated: low-precision rollout GEMM path; "" = not recorded
    "bf16_kernels": "",  # native | emulated: the rollout's bf16 GEMM path; "" = not recorded
    "uaq_group_lr_s": 1.0,  # per-group learning-rate control that mimics UAQ s (1 = off)
    "lr_factor": 1.0,  # a learning-rate control's declared multiplier (train.lr_factor; 1 = not a control)
    "group_key": "",  # equal for runs whose configs differ only by the seed
    "config": "",  # the semantic params as sorted JSON (what `group_key` is derived from)
    "recipe": "",  # the paper recipe a verl run was composed with ("" = none)
    "recipe_deviations": "",  # where it departs from the recipe: "key=value (recipe: value); ..."
}
# Columns whose equality the explicit fallback key requires when a run has no params at all.
KEY_COLUMNS = ("backend", "precision", "fp8_granularity", "correction", "uaq_s", "uaq_group_lr_s", "lr_factor", "algo",
               "task",
               "model", "aligned_forward", "trainer_dtype", "kernels", "bf16_kernels", "lr", "steps")


def method_label(correction: str, aligned_forward: bool) -> str:
    """The method as the papers name it (naive / bypass / TIS / ACR / TBPO), `aligned+` for QaRL's
    rollout-aligned forward. The precision is a column of its own: the papers' BF16 baseline is
    precision bf16 with method naive (the stock pipeline), and a bf16 ACR run is not that row."""
    name = CORRECTION_LABELS.get(correction, correction)
    return f"aligned+{name}" if aligned_forward else name


def _dropped(key: str) -> bool:
    return key == SEED_PARAM or any(key == p or key.startswith(p + ".") for p in NON_SEMANTIC)


def semantic_params(params: dict) -> dict[str, str]:
    """The params that define a run's results, without the seed (stringified, as MLflow keeps them)."""
    return {str(k): str(v) for k, v in params.items() if not _dropped(str(k))}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


def config_json(semantic: dict[str, str]) -> str:
    return json.dumps(semantic, sort_keys=True, separators=(",", ":")) if semantic else ""


def _column_values(row) -> list:
    vals = []
    for c in KEY_COLUMNS:
        v = row[c] if c in row else ""
        if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            v = None
        vals.append(v if isinstance(v, (str, bool, type(None))) else float(v))
    return vals


def derived_key(row) -> str:
    """The group key of a run without a group_key tag: a hash of its semantic params (`config`)
    and its identity columns (KEY_COLUMNS), or of the identity columns alone when it has no
    params. The columns are in the hash so that a run with few params (one that logged only
    some) is still never grouped with runs whose tags say otherwise."""
    vals = _column_values(row)
    config = row["config"] if "config" in row else ""
    if config:
        return f"cfg-{_digest([json.loads(config), vals])}"
    return f"ax-{_digest(vals)}"


def _float_or(value, default: float) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(f) else f


def logged_before_rename(tags: dict) -> bool:
    """Whether an MLflow run predates the correction rename (it lacks the RENAME_MARKER tag)."""
    return RENAME_MARKER not in tags


def from_tags_and_params(tags: dict, params: dict, precision: str, before_rename: bool = False) -> dict:
    """The identity columns of one run: each from its tag when present, else from its params
    (`quant.fp8_granularity`, `train.autocast`), else IDENTITY_DEFAULTS. Also returns the
    correction (a `naive` run logged before the rename is `bypass`) and `config`."""
    params = dict(params)
    correction = tags.get("correction", params.get("correction.mode", ""))
    if before_rename and correction == "naive":
        correction = "bypass"
        if "correction.mode" in params:
            params["correction.mode"] = "bypass"
    out = dict(IDENTITY_DEFAULTS, correction=correction)
    if "trainer_dtype" in tags:
        out["trainer_dtype"] = tags["trainer_dtype"]
    elif params.get("train.autocast") in ("bf16", "fp32"):
        out["trainer_dtype"] = params["train.autocast"]
    if "fp8_granularity" in tags:
        out["fp8_granularity"] = tags["fp8_granularity"]
    elif precision == "fp8":
        out["fp8_granularity"] = params.get("quant.fp8_granularity", "")
    for k in ("kernels", "bf16_kernels"):
        out[k] = tags.get(k, "")
    out["uaq_group_lr_s"] = _float_or(tags.get("uaq_group_lr_s"), 1.0)
    out["lr_factor"] = _float_or(tags.get("lr_factor", params.get("train.lr_factor")), 1.0)
    out["recipe"] = tags.get("recipe", "")
    out["recipe_deviations"] = tags.get("recipe_deviations", "")
    out["config"] = config_json(semantic_params(params))
    out["group_key"] = tags.get("group_key", "")  # empty: derived from the whole row (`derived_key`)
    return out


def fill_group_keys(df: pd.DataFrame) -> pd.DataFrame:
    """Every row gets a group key: its own (the tag), else `derived_key`."""
    df = df.copy()
    empty = df["group_key"] == ""
    if empty.any():
        df.loc[empty, "group_key"] = [derived_key(r) for _, r in df[empty].iterrows()]
    return df


SUPERSEDED = "SUPERSEDED"  # a FINISHED run of a configuration and seed that finished again later


def supersede(df: pd.DataFrame, finished: str = "FINISHED") -> pd.DataFrame:
    """When one configuration and seed finished more than once (the same suite `run_id` tag, or
    the same group key and seed) with the same identity columns, only the latest finished run
    counts; the earlier ones get status SUPERSEDED, so no seed is ever averaged twice into a cell.
    Runs that differ in an identity column (e.g. a trainer dtype resolved differently on another
    machine) are rows of their own and are both kept."""
    df = df.copy()
    ident = [c for c in KEY_COLUMNS if c in df.columns]
    for cols in (["run_id", *ident], ["group_key", "seed", *ident]):
        done = df[df["status"] == finished]
        done = done[(done["run_id"] != "") if cols[0] == "run_id" else done["seed"].notna()]
        done = done.sort_values("end_time", kind="stable", na_position="first")
        older = done.index[done.duplicated(cols, keep="last")]
        df.loc[older, "status"] = SUPERSEDED
    return df
