"""`load_runs` on a sqlite store: the one-query bulk read of metric histories."""

from __future__ import annotations

import numpy as np
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from suite.report import data as D


def test_sql_history_nan_and_relogged_step(tmp_path):
    """NaN comes back as NaN (MLflow stores 0 + is_nan) and keeps its step; a step logged
    twice keeps the later value; only the requested runs are read."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("report-sql-edge")
    rid = client.create_run(exp, run_name="edge", tags={"task": "arith", "precision": "int8"}).info.run_id
    client.log_batch(rid, metrics=[Metric("rollout_corr/kl", float("nan"), 1000, 1),
                                   Metric("rollout_corr/kl", 0.25, 1000, 2),
                                   Metric("rollout_corr/kl", 0.75, 2000, 2),
                                   Metric(D.acc_key("arith"), 0.5, 1000, 2)])
    client.set_terminated(rid, "FINISHED")
    other = client.create_experiment("elsewhere")
    oid = client.create_run(other, run_name="other", tags={"task": "arith"}).info.run_id
    client.log_batch(oid, metrics=[Metric("rollout_corr/kl", 9.0, 1000, 1)])
    data = D.load_runs(uri, experiment="report-sql-edge")
    assert list(data.runs["mlflow_run_id"]) == [rid]
    h = data.history.set_index("step")
    assert list(h.index) == [1, 2] and set(data.history["mlflow_run_id"]) == {rid}
    assert np.isnan(h.loc[1, "rollout_corr/kl"]) and h.loc[2, "rollout_corr/kl"] == 0.75
    assert h.loc[2, "acc"] == 0.5 and data.runs.loc[0, "acc"] == 0.5
    assert data.runs.loc[0, "kl_last"] == 0.75 and data.runs.loc[0, "kl_first"] == 0.75  # NaN skipped
