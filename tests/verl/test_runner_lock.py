"""One run id, one writer, for verl runs too: node 0 holds the run dir's lock (the embedded
runs' `run.lock`) from before the MLflow run is made until the summary is written, so a second
run of the same id, in another process, is refused naming the holder and touches nothing.

verl needs GPUs, so the launch itself is the runner's `execute` stand-in (as in
test_runner.py); the lock, the other processes and the MLflow store are real."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from suite.config import compose_config, run_id
from suite.tracking.lock import LOCK_FILE, RunLockedError
from suite.verl.runner import run

HOLD = textwrap.dedent("""
    import sys, time
    from suite.tracking.lock import run_lock
    with run_lock(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.readline()
""")
TRY = textwrap.dedent("""
    import sys
    from suite.tracking.lock import RunLockedError, run_lock
    try:
        with run_lock(sys.argv[1]):
            print("free")
    except RunLockedError as exc:
        print("busy:", exc)
""")


def _overrides(tiny_qwen2, tmp_path):
    return ["backend=verl", f"backend.model_path={tiny_qwen2}", f"backend.train_files={tmp_path / 'train.parquet'}",
            f"backend.val_files={tmp_path / 'val.parquet'}", f"out_dir={tmp_path / 'runs'}",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "tracking.experiment=verl-lock",
            "quant=bf16", "uaq.s=1.0"]


@pytest.fixture
def holder(tmp_path):
    """Another process holding a run dir's lock until the test ends."""
    procs = []

    def start(run_dir):
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.communicate("\n", timeout=30)


@pytest.mark.slow
def test_a_verl_run_of_a_run_dir_another_process_writes_is_refused(tiny_qwen2, tmp_path, holder):
    overrides = _overrides(tiny_qwen2, tmp_path)
    cfg = compose_config(overrides)
    run_dir = tmp_path / "runs" / run_id(cfg)
    p = holder(run_dir)
    with pytest.raises(RunLockedError, match=f"pid {p.pid} on host {socket.gethostname()}"):
        run(cfg, str(run_dir), env={}, execute=lambda *a: pytest.fail("must not launch verl"))
    assert sorted(os.listdir(run_dir)) == [LOCK_FILE]  # no MLflow record, no script, no summary
    assert not (tmp_path / "mlflow.db").exists()  # no MLflow run was made
    # the command: exit 2 naming the holder, no traceback. `suite run` first looks up verl and vLLM for
    # backend.python; this environment has no vLLM, so an empty stand-in package is put on its path: it is
    # found, never imported (the lock refuses before verl would start)
    stand_in = tmp_path / "site"
    (stand_in / "vllm").mkdir(parents=True)
    (stand_in / "vllm" / "__init__.py").write_text("raise ImportError('a stand-in: only found, never imported')\n")
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(stand_in), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-m", "suite.cli", "run", *overrides], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "run dir busy" in out.stderr and f"pid {p.pid}" in out.stderr and "Traceback" not in out.stderr
    assert sorted(os.listdir(run_dir)) == [LOCK_FILE] and not (tmp_path / "mlflow.db").exists()


def test_the_lock_is_held_while_verl_runs_and_released_after(tiny_qwen2, tmp_path):
    import mlflow

    cfg = compose_config(_overrides(tiny_qwen2, tmp_path))
    run_dir = tmp_path / "runs" / run_id(cfg)
    seen = {}

    def fake_verl(argv, log_path, env):  # a second process tries the lock while "verl" runs
        seen["during"] = subprocess.run([sys.executable, "-c", TRY, str(run_dir)], capture_output=True,
                                        text=True, timeout=120).stdout
        mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
        with mlflow.start_run(run_id=env["MLFLOW_RUN_ID"]):
            mlflow.log_metric("val-core/gsm8k/acc/mean_at_1", 0.5, step=0)
        return 0

    summary = run(cfg, str(run_dir), env={}, execute=fake_verl)
    assert seen["during"].startswith("busy:") and f"pid {os.getpid()}" in seen["during"], seen
    assert summary["already_finished"] is False
    after = subprocess.run([sys.executable, "-c", TRY, str(run_dir)], capture_output=True, text=True, timeout=120)
    assert after.stdout.strip() == "free"
    assert json.loads((run_dir / "summary.json").read_text())["final_acc"] == 0.5
