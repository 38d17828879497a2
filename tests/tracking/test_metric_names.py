"""The suite's own check of MLflow's metric-name rules (suite.tracking.mlflow_logger
`metric_name_problem`) agrees with what MLflow's public client accepts and refuses on a real
SQLite store: a key the check passes is stored, a key it refuses MLflow refuses too."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from suite.tracking.mlflow_logger import MAX_KEY_LENGTH, metric_name_problem

GOOD = ["loss", "val-core/arith/acc/mean_at_1", "actor/pg_clipfrac", "a b", "time:step", "a.b-c_d/e",
        "x" * MAX_KEY_LENGTH, "a..b", "ü"]
BAD = ["", ".", "..a", "a//b", "a/./b", "a/../b", "../a", "/a", "a/", "a?b", "a@b", "a,b", "a\nb",
       "x" * (MAX_KEY_LENGTH + 1), "a\\b", "a#b"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    client = MlflowClient(f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}")
    exp = client.create_experiment("names")
    return client, client.create_run(exp).info.run_id


@pytest.mark.parametrize("name", GOOD + BAD)
def test_the_check_is_what_mlflow_accepts(run, name):
    client, rid = run
    try:
        client.log_metric(rid, name, 1.0, step=0)
        accepted = True
    except MlflowException:
        accepted = False
    assert (metric_name_problem(name) is None) == accepted == (name in GOOD), metric_name_problem(name)
    if accepted:
        assert [m.value for m in client.get_metric_history(rid, name)] == [1.0]


def test_the_problem_is_named():
    assert "relative path" in metric_name_problem("a//b") and "'a/b'" in metric_name_problem("a//b")
    assert "alphanumerics" in metric_name_problem("a?b")
    assert f"longer than {MAX_KEY_LENGTH}" in metric_name_problem("x" * 300)
