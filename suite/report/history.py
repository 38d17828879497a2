"""Metric histories for the report: every value of some keys for many runs.

Two sources, one result (columns mlflow_run_id, step, key, value; a step logged twice keeps the
later timestamp):

- `client`: MLflow's public `MlflowClient.get_metric_history`, one call per run and key, on
  `THREADS` threads. Works on every store (sqlite, PostgreSQL, a tracking server, Databricks)
  and every MLflow version the suite installs with.
- `sql`: one SELECT per 5,000 runs on MLflow's own `metrics` table (`SqlMetric`), for SQL stores.
  It reads MLflow internals (the client's store, its table model), so it is used only on the
  MLflow versions `SQL_FAST_PATH` names, where tests/report/test_report_history.py checks it
  returns exactly what `client` returns. Elsewhere `auto` picks `client`.

Speed on a 200-run store (docs/reports.md, "Speed"; benchmarks/report_history.py).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

HISTORY_SOURCES = ("auto", "client", "sql")
THREADS = 8  # concurrent get_metric_history calls (a server or SQL store answers each in ms)
# MLflow versions whose `metrics` table model the SQL path reads (checked against `client` by test)
SQL_FAST_PATH = ">=3.17,<3.18"
_SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
COLUMNS = ["mlflow_run_id", "step", "timestamp", "key", "value"]


def sql_fast_path_ok(tracking_uri: str) -> bool:
    """The SQL path applies: a database URI and an MLflow version in `SQL_FAST_PATH`."""
    import mlflow
    from packaging.specifiers import SpecifierSet

    scheme = tracking_uri.split(":", 1)[0].split("+", 1)[0].lower()
    return scheme in _SQL_SCHEMES and mlflow.__version__ in SpecifierSet(SQL_FAST_PATH)


def resolve_source(source: str, tracking_uri: str) -> str:
    if source not in HISTORY_SOURCES:
        raise ValueError(f"history source {source!r}; allowed: {', '.join(HISTORY_SOURCES)}")
    if source == "sql" and not sql_fast_path_ok(tracking_uri):
        import mlflow

        raise ValueError(f"history source 'sql' needs a database tracking URI ({', '.join(_SQL_SCHEMES)}) and "
                         f"mlflow{SQL_FAST_PATH} (installed: {mlflow.__version__}, URI {tracking_uri}); use 'client'")
    if source == "auto":
        return "sql" if sql_fast_path_ok(tracking_uri) else "client"
    return source


def _history_client(client, run_ids: list[str], keys: list[str], threads: int = THREADS) -> pd.DataFrame:
    def one(job):
        rid, key = job
        return [(rid, m.step, m.timestamp, key, m.value) for m in client.get_metric_history(rid, key)]

    jobs = [(rid, key) for rid in run_ids for key in keys]
    rows = []
    with ThreadPoolExecutor(max_workers=max(1, threads)) as ex:
        for part in ex.map(one, jobs):
            rows += part
    return pd.DataFrame(rows, columns=COLUMNS)


def _history_sql(client, run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    """The one-query read. The store's own `get_metric_history_bulk` (one key a call) builds an
    ORM object per value, which made it several times slower than this Core query on the same
    machine (docs/reports.md; docs/bench.md, "Measurements behind the code")."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlMetric

    store = client._tracking_client.store  # MLflow internals: only on SQL_FAST_PATH versions
    t = SqlMetric.__table__
    names = ["mlflow_run_id", "step", "timestamp", "key", "value", "is_nan"]
    frames = []
    with store.ManagedSessionMaker() as session:
        for i in range(0, len(run_ids), 5000):  # well under SQLite's bound-parameter limit
            q = sa.select(t.c.run_uuid, t.c.step, t.c.timestamp, t.c.key, t.c.value, t.c.is_nan).where(
                t.c.key.in_(keys), t.c.run_uuid.in_(run_ids[i : i + 5000]))
            rows = session.execute(q).all()
            # Columns via zip: handing SQLAlchemy Row objects to pandas costs two failed
            # attribute lookups per row (profiled: most of the read's CPU time).
            cols = list(zip(*rows)) if rows else [()] * len(names)
            frames.append(pd.DataFrame({n: list(c) for n, c in zip(names, cols)}))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=names)
    # MLflow stores NaN as value 0 with is_nan set (SqlMetric.to_mlflow_entity reads it back the same way).
    df["value"] = df["value"].astype(float).where(~df["is_nan"].astype(bool), np.nan)
    return df.drop(columns="is_nan")


def dedupe_steps(df: pd.DataFrame) -> pd.DataFrame:
    df = df.sort_values(["mlflow_run_id", "key", "step", "timestamp"], kind="stable")
    df = df.drop_duplicates(["mlflow_run_id", "key", "step"], keep="last")
    return df.drop(columns="timestamp").reset_index(drop=True)


def read_history(client, run_ids: list[str], keys, *, source: str = "auto") -> tuple[pd.DataFrame, str]:
    """(per-step values of `keys` for `run_ids`: columns mlflow_run_id, step, key, value; the
    source used). `source`: auto | client | sql (module docstring)."""
    keys = list(dict.fromkeys(keys))
    used = resolve_source(source, client.tracking_uri)
    if not run_ids or not keys:
        return dedupe_steps(pd.DataFrame(columns=COLUMNS)), used
    df = _history_sql(client, run_ids, keys) if used == "sql" else _history_client(client, run_ids, keys)
    df["step"] = df["step"].astype(int)
    df["value"] = df["value"].astype(float)
    return dedupe_steps(df), used
