"""`load_runs` over a real MLflow tracking server: the bulk-history route (100 runs and
25,000 values a request, split when full) returns exactly what was logged."""

from __future__ import annotations

import numpy as np
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from suite.report import data as D


def test_load_runs_over_http_matches_logged_values(mlflow_server_uri):
    client = MlflowClient(tracking_uri=mlflow_server_uri)
    exp = client.create_experiment("report-http")
    rng = np.random.default_rng(3)
    logged = {}
    parent = client.create_run(exp, run_name="sweep-http", tags={"suite.kind": "sweep", "sweep": "http"}).info.run_id
    for i, (prec, status) in enumerate([("bf16", "FINISHED"), ("int8", "FINISHED"), ("int8", "FAILED")]):
        tags = {"precision": prec, "correction": "acr", "uaq_s": "1.5", "algo": "grpo", "task": "arith",
                "model": "tiny", "aligned_forward": "false", "seed": str(i), "backend": "embedded",
                "mlflow.parentRunId": parent}
        rid = client.create_run(exp, run_name=f"r{i}", tags=tags).info.run_id
        vals = rng.random((4, 2))  # [step, key]
        metrics = [Metric("rollout_corr/kl", float(vals[s, 0]), 1000 + s, s) for s in range(1, 4)]
        metrics += [Metric(D.acc_key("arith"), float(vals[s, 1]), 1000 + s, s) for s in (0, 3)]
        # a step logged twice (a resumed run re-logging): the later timestamp wins
        metrics.append(Metric("rollout_corr/kl", 0.5, 2000, 3))
        client.log_batch(rid, metrics=metrics, params=[Param("train.lr", "3e-05")])
        client.set_terminated(rid, status)
        logged[rid] = vals
    data = D.load_runs(mlflow_server_uri, experiment="report-http", parent_run_id=parent)
    assert sorted(data.runs["mlflow_run_id"]) == sorted(logged)  # the parent itself is not a run of the report
    assert sorted(data.runs["status"]) == ["FAILED", "FINISHED", "FINISHED"]
    for rid, vals in logged.items():
        h = data.history[data.history["mlflow_run_id"] == rid].set_index("step")
        assert list(h.index) == [0, 1, 2, 3]
        assert h.loc[1, "rollout_corr/kl"] == vals[1, 0] and h.loc[2, "rollout_corr/kl"] == vals[2, 0]
        assert h.loc[3, "rollout_corr/kl"] == 0.5
        assert h.loc[0, "acc"] == vals[0, 1] and h.loc[3, "acc"] == vals[3, 1]
        row = data.runs.set_index("mlflow_run_id").loc[rid]
        assert row["acc"] == vals[3, 1] and row["acc0"] == vals[0, 1] and row["lr"] == 3e-05
        assert row["kl_first"] == vals[1, 0] and row["kl_last"] == 0.5
    assert data.source["history_source"] == "client"  # a server: MLflow's public client, never a UI route
