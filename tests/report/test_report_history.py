"""The report's two metric-history sources return the same values: MLflow's public client
(threaded) and the SQL fast path, which reads MLflow's tables and so runs only on the MLflow
versions `SQL_FAST_PATH` names (this test is what covers them)."""

from __future__ import annotations

import math

import mlflow
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from packaging.specifiers import SpecifierSet

from suite.report import history as H

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('hist') / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("h")
    ids = []
    for i in range(12):
        rid = client.create_run(exp, run_name=f"r{i}").info.run_id
        ms = [Metric("a", float(s * 10 + i), 1000 + s, s) for s in range(30)]
        ms += [Metric("b", float("nan") if s == 3 else -s / 7, 1000 + s, s) for s in range(0, 30, 3)]
        ms.append(Metric("a", 0.125, 5000, 4))  # step 4 logged again later: the later value wins
        client.log_batch(rid, metrics=ms)
        ids.append(rid)
    return client, ids


def _by_key(df):
    return {(r, s, k): v for r, s, k, v in df[["mlflow_run_id", "step", "key", "value"]].itertuples(index=False)}


def test_the_sql_path_returns_what_the_public_client_returns(store):
    client, ids = store
    if mlflow.__version__ not in SpecifierSet(H.SQL_FAST_PATH):
        pytest.skip(f"mlflow {mlflow.__version__} is outside the SQL fast path's range {H.SQL_FAST_PATH}")
    sql, used_sql = H.read_history(client, ids, ["a", "b", "absent"], source="sql")
    pub, used_pub = H.read_history(client, ids, ["a", "b", "absent"], source="client")
    assert (used_sql, used_pub) == ("sql", "client")
    assert len(sql) == len(pub) == 12 * (30 + 10)
    a, b = _by_key(sql), _by_key(pub)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])), k
    assert a[(ids[0], 4, "a")] == 0.125 and a[(ids[5], 7, "a")] == 75.0 and math.isnan(a[(ids[2], 3, "b")])
    assert H.read_history(client, ids, ["a"], source="auto")[1] == "sql"


def test_outside_the_tested_versions_auto_uses_the_client_and_sql_is_refused(store, monkeypatch):
    client, ids = store
    monkeypatch.setattr(mlflow, "__version__", "3.99.0")
    df, used = H.read_history(client, ids[:2], ["a"], source="auto")
    assert used == "client" and len(df) == 2 * 30
    with pytest.raises(ValueError, match=r"mlflow>=3.17,<3.18 \(installed: 3.99.0"):
        H.read_history(client, ids[:2], ["a"], source="sql")
    with pytest.raises(ValueError, match="allowed: auto, client, sql"):
        H.read_history(client, ids[:2], ["a"], source="ajax")


def test_a_server_uri_never_takes_the_sql_path():
    assert not H.sql_fast_path_ok("http://127.0.0.1:5000") and not H.sql_fast_path_ok("databricks")
    assert H.resolve_source("auto", "https://mlflow.example") == "client"
