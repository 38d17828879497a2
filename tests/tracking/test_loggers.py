"""Metric loggers against real MLflow stores: a sqlite file and a real `mlflow server`."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import socket
import time
from dataclasses import dataclass

import pytest
from mlflow.tracking import MlflowClient

from suite.tracking import (
    ConsoleLogger,
    JsonlLogger,
    MetricLogger,
    MlflowLogger,
    MultiLogger,
    flatten_params,
    read_jsonl,
    resync,
    resync_cli,
)
from suite.tracking.loggers import LIVE_HTTP_ENV, SYNC_FILE, mlflow_metric_key, resolve_tracking_uri

# mlflow 3.17.2's sqlalchemy store triggers this on its own; nothing to do with us.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port_uri() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused


@pytest.fixture(autouse=True)
def patient_live_calls(monkeypatch):
    """These tests are about what reaches a store that is up, so a slow answer must not count as an
    outage: the logger's live calls wait up to 60 s here (a variable the user sets is left alone,
    suite.tracking.outage). On a loaded CI machine the real server once took over the product's 2 s
    for a 1000-metric batch and the batch was (rightly) kept for the next flush, failing an
    assertion about one flush. A stopped server or a closed port refuses at once either way; the
    2 s bound itself is tested by test_hung_server_costs_one_timeout_per_flush, which unsets this."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")


@pytest.fixture(scope="module")
def sqlite_uri(tmp_path_factory) -> str:
    # One sqlite store per module: creating its tables takes seconds.
    return f"sqlite:///{tmp_path_factory.mktemp('sqlite_store') / 'mlflow.db'}"


# --------------------------------------------------------------------------- JSONL


def test_jsonl_appends_one_object_per_call(tmp_path):
    lg = JsonlLogger(tmp_path)
    lg.log_metrics({"a": 1, "b": 2.5}, step=0, timestamp=100.25)
    lg.log_metrics({"a": float("nan"), "c": float("-inf")}, step=1)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()  # readable before flush
    assert len(lines) == 2
    assert json.loads(lines[0]) == {"step": 0, "time": 100.25, "metrics": {"a": 1.0, "b": 2.5}}
    e = read_jsonl(tmp_path / "metrics.jsonl")[1]
    assert e["step"] == 1 and math.isnan(e["metrics"]["a"]) and e["metrics"]["c"] == -math.inf
    assert abs(e["time"] - time.time()) < 60
    lg.close()


def test_jsonl_truncate_after_keeps_steps_up_to_and_appends_after(tmp_path):
    lg = JsonlLogger(tmp_path)
    for s in range(10):
        lg.log_metrics({"x": s}, s)
    assert lg.truncate_after(4) == 5
    lg.log_metrics({"x": 50}, 5)
    lg.close()
    assert [(e["step"], e["metrics"]["x"]) for e in read_jsonl(tmp_path / "metrics.jsonl")] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 50.0)
    ]
    assert not list(tmp_path.glob(".*tmp*"))


def test_jsonl_drops_a_line_cut_by_a_crash(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step":0,"time":1,"metrics":{"x":0}}\n{"step":1,"ti')
    assert [e["step"] for e in read_jsonl(path)] == [0]  # reader tolerates it
    lg = JsonlLogger(tmp_path)  # writer repairs it before appending
    lg.log_metrics({"x": 1}, 1)
    lg.close()
    assert [e["step"] for e in read_jsonl(path)] == [0, 1]
    assert path.read_text().count("\n") == 2


def test_jsonl_records_params_tags_artifacts(tmp_path):
    lg = JsonlLogger(tmp_path)
    lg.log_params({"optim": {"lr": 1e-3}, "seed": 1})
    lg.log_params({"quant": {"precision": "int8"}})
    lg.set_tags({"algo": "grpo"})
    (tmp_path / "cfg.yaml").write_text("a: 1\n")
    lg.log_artifact(tmp_path / "cfg.yaml")
    lg.log_artifact(tmp_path / "cfg.yaml")
    lg.close()
    assert json.loads((tmp_path / "params.json").read_text()) == {
        "optim.lr": "0.001", "seed": "1", "quant.precision": "int8"
    }
    assert json.loads((tmp_path / "tags.json").read_text()) == {"algo": "grpo"}
    assert json.loads((tmp_path / "artifacts.json").read_text()) == [str((tmp_path / "cfg.yaml").resolve())]


def test_flatten_params_nested_dataclass_and_leaves():
    @dataclass
    class Optim:
        lr: float = 0.1
        betas: tuple = (0.9, 0.95)

    assert flatten_params({"a": {"b": {"c": 1}}, "optim": Optim(), "empty": {}, "x": None}) == {
        "a.b.c": 1, "optim.lr": 0.1, "optim.betas": (0.9, 0.95), "empty": "{}", "x": None
    }


def test_console_logger_prints_selected_keys_every_n(capsys):
    lg = ConsoleLogger(every=2, keys=["reward", "acc", "missing"])
    for s in range(4):
        lg.log_metrics({"acc": 0.5 + s, "reward": 1 / 3, "other": 7}, s)
    err = capsys.readouterr().err.splitlines()
    assert err == ["step 0 | reward 0.3333 | acc 0.5", "step 2 | reward 0.3333 | acc 2.5"]


def test_multi_logger_fans_out_with_one_timestamp(tmp_path):
    out = io.StringIO()
    a, b = JsonlLogger(tmp_path / "a"), JsonlLogger(tmp_path / "b")
    multi = MultiLogger([a, b, ConsoleLogger(every=1, stream=out)])
    for lg in (a, b, multi, multi.loggers[2]):
        assert isinstance(lg, MetricLogger)
    multi.log_metrics({"x": 1.0}, 3)
    multi.close()
    ea, eb = read_jsonl(tmp_path / "a/metrics.jsonl"), read_jsonl(tmp_path / "b/metrics.jsonl")
    assert ea == eb and ea[0]["step"] == 3
    assert out.getvalue() == "step 3 | x 1\n"


def test_relative_sqlite_uri_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(None) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert resolve_tracking_uri("http://h:5000") == "http://h:5000"


# --------------------------------------------------------------------------- MLflow, sqlite


def test_mlflow_sqlite_buffers_until_flush_then_resumes_same_run(tmp_path, sqlite_uri):
    run_dir = tmp_path / "run"
    lg = MlflowLogger.for_run_dir(run_dir, sqlite_uri, "sqlite-exp", tags={"algo": "grpo"})
    run_id = lg.run_id
    client = MlflowClient(sqlite_uri)
    lg.log_params({"optim": {"lr": 3e-4, "betas": [0.9, 0.95]}, "seed": 1, "long": "v" * 7000})
    for s in range(5):
        lg.log_metrics({"actor/loss": s / 10, "odd": [float("nan"), math.inf][s % 2]}, s)
    assert history(client, run_id, "actor/loss") == []  # buffered, not sent
    lg.flush()
    assert history(client, run_id, "actor/loss") == [(s, s / 10) for s in range(5)]
    odd = history(client, run_id, "odd")
    assert math.isnan(odd[0][1]) and odd[1] == (1, 1.7976931348623157e308)  # SQL stores clamp inf
    run = client.get_run(run_id)
    assert run.data.params["optim.lr"] == "0.0003"
    assert run.data.params["optim.betas"] == "[0.9, 0.95]"
    assert len(run.data.params["long"]) == 6000
    assert run.data.tags["algo"] == "grpo" and run.info.run_name == "run"
    lg.close()
    assert client.get_run(run_id).info.status == "FINISHED"
    assert json.loads((run_dir / SYNC_FILE).read_text())["synced_step"] == 4

    # a restarted process resumes the same run, RUNNING again, and adds steps after 4
    lg2 = MlflowLogger.for_run_dir(run_dir, sqlite_uri, "sqlite-exp")
    assert lg2.run_id == run_id
    assert client.get_run(run_id).info.status == "RUNNING"
    lg2.log_params({"seed": 1, "optim": {"lr": 1.0}})  # same value: skipped; changed: kept
    for s in range(5, 8):
        lg2.log_metrics({"actor/loss": s / 10}, s)
    lg2.close("KILLED")
    assert history(client, run_id, "actor/loss") == [(s, s / 10) for s in range(8)]
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.params["optim.lr"] == "0.0003"


def test_mlflow_invalid_metric_key_is_dropped_not_raised(tmp_path, sqlite_uri, caplog):
    lg = MlflowLogger(sqlite_uri, "sqlite-exp", "bad-key", run_dir=tmp_path)
    lg.log_metrics({"ok": 1.0, "../escape": 2.0}, 0)
    lg.flush()
    assert history(MlflowClient(sqlite_uri), lg.run_id, "ok") == [(0, 1.0)]
    assert "../escape" in caplog.text
    lg.close()


@pytest.mark.verl
@pytest.mark.parametrize("key", ["val-core/arith/acc/mean@1", "a//b", "x(y)", "actor/pg_loss", "k@2/v w"])
def test_mlflow_key_sanitized_like_verl(key, tmp_path, sqlite_uri):
    from verl.utils.tracking import _MlflowLoggingAdapter

    assert mlflow_metric_key(key) == _MlflowLoggingAdapter()._sanitize_key(key)
    lg = MlflowLogger(sqlite_uri, "sqlite-exp", "verl-keys", run_dir=tmp_path)
    lg.log_metrics({key: 0.5}, 3)
    lg.flush()
    assert history(MlflowClient(sqlite_uri), lg.run_id, mlflow_metric_key(key)) == [(3, 0.5)]
    lg.close()


# --------------------------------------------------------------------------- MLflow server


def test_server_log_batch_chunks_and_params(tmp_path, mlflow_server_uri):
    lg = MlflowLogger.for_run_dir(tmp_path, mlflow_server_uri, "server-exp", "chunks")
    params = {f"group{g}": {f"p{i}": i for i in range(30)} for g in range(5)}  # 150 params
    lg.log_params(params)
    n_keys, n_steps = 60, 25  # 1500 metrics: two log_batch requests, step 16 split across them
    for s in range(n_steps):
        lg.log_metrics({f"k{k:02d}": s * 100 + k for k in range(n_keys)}, s)
    lg.flush()
    assert lg.pending_metrics == 0 and lg.synced_step == n_steps - 1
    client = MlflowClient(mlflow_server_uri)
    for k in (0, 41, 59):
        assert history(client, lg.run_id, f"k{k:02d}") == [(s, float(s * 100 + k)) for s in range(n_steps)]
    got = client.get_run(lg.run_id).data.params
    assert len(got) == 150 and got["group4.p29"] == "29"
    (tmp_path / "config.yaml").write_text("seed: 1\n")
    lg.log_artifact(tmp_path / "config.yaml")
    assert [a.path for a in client.list_artifacts(lg.run_id)] == ["config.yaml"]
    lg.close()


def test_offline_run_never_raises_then_resync_sends_each_step_once(tmp_path, mlflow_server_uri, caplog):
    """Server unreachable for the whole run: training goes on, JSONL keeps everything,
    `resync` creates the run later and is idempotent."""
    run_dir = tmp_path / "run"
    jsonl = JsonlLogger(run_dir)
    t0 = time.monotonic()
    mlf = MlflowLogger.for_run_dir(run_dir, closed_port_uri(), "offline-exp", tags={"axis": "int8"})
    logger = MultiLogger([jsonl, mlf])
    logger.log_params({"algo": {"name": "grpo"}})
    logger.set_tags({"seed": 0})
    for s in range(12):
        logger.log_metrics({"reward": s / 12, "len": 30 + s}, s)
        if s % 4 == 3:
            logger.flush()  # "checkpoint commit"
    logger.close()
    assert time.monotonic() - t0 < 20  # refused connections fail fast (measured: ~0.02 s each)
    assert mlf.run_id is None and mlf.pending_metrics == 24
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1
    assert [e["step"] for e in read_jsonl(run_dir / "metrics.jsonl")] == list(range(12))

    r = resync(run_dir, tracking_uri=mlflow_server_uri)
    assert (r.steps_sent, r.metrics_sent, r.synced_step) == (12, 24, 11)
    client = MlflowClient(mlflow_server_uri)
    assert history(client, r.run_id, "reward") == [(s, s / 12) for s in range(12)]
    run = client.get_run(r.run_id)
    assert run.data.params == {"algo.name": "grpo"} and run.data.tags["seed"] == "0"
    assert run.data.tags["axis"] == "int8"  # given only to the offline logger's constructor
    assert run.info.status == "FINISHED"  # the status close() could not send
    assert resync(run_dir).metrics_sent == 0  # the run dir now records the server's URI
    assert history(client, r.run_id, "len") == [(s, 30.0 + s) for s in range(12)]


@pytest.mark.slow
def test_outage_mid_run_with_server_restart(tmp_path, mlflow_server, caplog):
    """The server dies mid-run and comes back on the same store: no exception, the buffer is
    retried at the next flush, and every step is in MLflow exactly once."""
    uri = mlflow_server.uri
    run_dir = tmp_path / "run"
    logger = MultiLogger([JsonlLogger(run_dir), MlflowLogger.for_run_dir(run_dir, uri, "outage-exp")])
    mlf = logger.loggers[1]
    for s in range(5):
        logger.log_metrics({"x": s}, s)
    logger.flush()
    assert mlf.synced_step == 4
    mlflow_server.stop()
    try:
        for s in range(5, 10):
            logger.log_metrics({"x": s}, s)
        t0 = time.monotonic()
        logger.flush()  # no exception
        assert time.monotonic() - t0 < 5
        logger.flush()
        assert mlf.pending_metrics == 5 and mlf.synced_step == 4
    finally:
        mlflow_server.start()
    for s in range(10, 12):
        logger.log_metrics({"x": s}, s)
    logger.flush()
    assert mlf.pending_metrics == 0 and mlf.synced_step == 11
    client = MlflowClient(uri)
    assert history(client, mlf.run_id, "x") == [(s, float(s)) for s in range(12)]
    assert resync(run_dir).metrics_sent == 0
    logger.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in m for m in messages) == 1
    assert sum("reachable again" in m for m in messages) == 1


def test_resume_after_kill_neither_duplicates_nor_loses_steps(tmp_path, mlflow_server_uri):
    """The trainer's resume protocol: cut the JSONL back to the checkpoint, reopen the run
    dir's logger (which queues JSONL steps MLflow has not got), recompute the rest."""
    run_dir = tmp_path / "run"
    client = MlflowClient(mlflow_server_uri)

    def open_logger():
        return MultiLogger([JsonlLogger(run_dir), MlflowLogger.for_run_dir(run_dir, mlflow_server_uri, "resume-exp")])

    # first life: checkpoint+flush at step 3, checkpoint at 7 but killed before its flush,
    # and steps 8-9 logged after it
    lg = open_logger()
    for s in range(10):
        lg.log_metrics({"x": s}, s)
        if s == 3:
            lg.flush()
    lg.loggers[0].flush()  # what the OS keeps of a killed process's JSONL writes
    run_id = lg.loggers[1].run_id
    del lg  # kill -9: no flush, no close

    # second life: resumes from checkpoint 7
    jsonl = JsonlLogger(run_dir)
    assert jsonl.truncate_after(7) == 2
    jsonl.close()
    lg = open_logger()
    assert lg.loggers[1].run_id == run_id and lg.loggers[1].pending_metrics == 4  # steps 4-7
    for s in range(8, 12):
        lg.log_metrics({"x": s}, s)
    lg.close()
    assert history(client, run_id, "x") == [(s, float(s)) for s in range(12)]
    assert [e["step"] for e in read_jsonl(run_dir / "metrics.jsonl")] == list(range(12))


def test_resume_behind_the_sync_marker_does_not_resend(tmp_path, mlflow_server_uri, caplog):
    """Flushed through step 5 but the newest checkpoint is step 3: steps 4-5 are recomputed
    after the restart and must not reach MLflow a second time."""
    caplog.set_level(logging.INFO, logger="suite.tracking.mlflow_logger")
    run_dir = tmp_path / "run"
    lg = MultiLogger([JsonlLogger(run_dir), MlflowLogger.for_run_dir(run_dir, mlflow_server_uri, "behind-exp")])
    for s in range(6):
        lg.log_metrics({"x": s}, s)
    lg.flush()
    run_id = lg.loggers[1].run_id
    del lg

    JsonlLogger(run_dir).truncate_after(3)
    lg = MultiLogger([JsonlLogger(run_dir), MlflowLogger.for_run_dir(run_dir, mlflow_server_uri, "behind-exp")])
    assert lg.loggers[1].pending_metrics == 0
    for s in range(4, 8):
        lg.log_metrics({"x": s}, s)
    lg.close()
    assert history(MlflowClient(mlflow_server_uri), run_id, "x") == [(s, float(s)) for s in range(8)]
    assert "not resending 2 metrics of steps <= 5" in caplog.text


@pytest.mark.slow
def test_hung_server_costs_one_timeout_per_flush(tmp_path, monkeypatch):
    """A server that accepts connections and never answers (the worst outage): each flush
    costs one HTTP timeout (MLFLOW_HTTP_REQUEST_TIMEOUT=2 s, no retries), not minutes."""
    for var in LIVE_HTTP_ENV:
        monkeypatch.delenv(var, raising=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # the kernel completes handshakes; nobody ever reads or answers
    try:
        uri = f"http://127.0.0.1:{sock.getsockname()[1]}"
        t0 = time.monotonic()
        lg = MlflowLogger.for_run_dir(tmp_path, uri, "hung-exp")
        first = time.monotonic() - t0
        lg.log_params({"a": 1})  # skipped while failing: free
        lg.log_metrics({"x": 1.0}, 0)
        t1 = time.monotonic()
        lg.flush()
        second = time.monotonic() - t1
        limit = int(LIVE_HTTP_ENV["MLFLOW_HTTP_REQUEST_TIMEOUT"])
        assert limit <= first < limit + 3 and limit <= second < limit + 3, (first, second)
        assert lg.pending_metrics == 1
        assert not set(LIVE_HTTP_ENV) & set(os.environ)  # set only around our own calls
    finally:
        sock.close()


def test_resync_cli_reports_and_fails_cleanly(tmp_path, capsys, mlflow_server_uri):
    # a missing run dir, and a directory the suite never logged, are bad input (exit 2, named)
    assert resync_cli(tmp_path / "nothing") == 2
    assert "no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert resync_cli(tmp_path / "empty") == 2
    assert "mlflow_run.json: not found" in capsys.readouterr().err
    lg = MlflowLogger.for_run_dir(tmp_path / "r", mlflow_server_uri, "cli-exp")
    JsonlLogger(tmp_path / "r").log_metrics({"x": 1}, 0)
    assert resync_cli(tmp_path / "r") == 0
    out = capsys.readouterr().out
    assert f"run {lg.run_id}" in out and "sent 1 metrics over 1 steps" in out
