"""`kill -9` at each phase of a run, then re-run: every step exactly once in metrics.jsonl and
MLflow, with the values of an uninterrupted run; a corrupt metrics line is refused, not dropped.

Each kill waits for an event (a file appearing, a step logged), never for a guessed time."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from mlflow.tracking import MlflowClient

from suite.config import compose_config, run_id
from suite.tracking.loggers import mlflow_metric_key, read_jsonl
from test_run import TINY

pytestmark = pytest.mark.long  # the long tier (pyproject.toml, markers)

# steps=6, checkpoints at 4 and 6: the baseline (step 0) and steps 1-3 come before the first one.
PHASED = [*TINY, "steps=6", "ckpt_every=4", "eval_every=3"]
# wall-clock measurements differ between any two runs; everything else must be equal
_TIMED = ("timing_s/", "perf/", "warm_start/sft_seconds")


def _overrides(root, cache):
    return PHASED + [f"out_dir={root / 'runs'}", f"warm_start.cache_dir={cache}",
                     f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}"]


def _start(over):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "suite.cli", "run", "--no-progress", *over],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _kill_when(proc, event, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.time() + timeout_s
    while not event():
        assert proc.poll() is None, f"the run ended before {what}: {proc.stdout.read()}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _steps(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    return [e["step"] for e in read_jsonl(path)] if os.path.exists(path) else []


def _ckpts(run_dir):
    return sorted(glob.glob(os.path.join(run_dir, "checkpoints", "step_*.pt")))


def _torn(run_dir, step):
    """What a kill during a checkpoint write leaves: a partial temporary file (atomic_write)."""
    d = os.path.join(run_dir, "checkpoints")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f".step_{step:08d}.pt.tmp.999999"), "wb") as f:
        f.write(b"PK\x03\x04 partial torch.save")


def _finish(over):
    out = subprocess.run([sys.executable, "-m", "suite.cli", "run", "--no-progress", *over],
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_kill_at_every_phase_loses_and_duplicates_nothing(tmp_path):
    cache = tmp_path / "cache"  # private: the warm start really runs, and can be killed
    over = _overrides(tmp_path / "a", cache)
    cfg = compose_config(over)
    run_dir = os.path.join(cfg.out_dir, run_id(cfg))

    # 1. during the warm start: its lock file is held while it trains
    proc = _start(over)
    _kill_when(proc, lambda: bool(glob.glob(str(cache / "*.pt.lock"))), "the warm start")
    assert not glob.glob(str(cache / "*.pt")) and _steps(run_dir) == []

    # 2. after the baseline evaluation (step 0 logged), before the first checkpoint
    proc = _start(over)
    _kill_when(proc, lambda: 0 in _steps(run_dir), "the baseline evaluation")
    assert _ckpts(run_dir) == [], "killed too late: the first checkpoint was written"
    # 3. ... and a first checkpoint torn by a kill mid-write
    _torn(run_dir, 4)

    # 4. mid-run, after the first checkpoint and a later step
    proc = _start(over)
    _kill_when(proc, lambda: 5 in _steps(run_dir), "step 5")
    assert [os.path.basename(p) for p in _ckpts(run_dir)] == ["step_00000004.pt"]
    # 5. ... and a later checkpoint torn mid-write
    _torn(run_dir, 6)

    _finish(over)
    resumed = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    assert [e["step"] for e in resumed] == list(range(7))

    # an uninterrupted run of the same config (the warm start from the same cache)
    over_b = _overrides(tmp_path / "b", cache)
    _finish(over_b)
    cfg_b = compose_config(over_b)
    straight = read_jsonl(os.path.join(cfg_b.out_dir, run_id(cfg_b), "metrics.jsonl"))
    assert [e["step"] for e in straight] == list(range(7))
    for a, b in zip(resumed, straight):
        ka = {k for k in a["metrics"] if not k.startswith(_TIMED)}
        assert ka == {k for k in b["metrics"] if not k.startswith(_TIMED)}, a["step"]
        for k in ka:
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-6, abs=1e-9, nan_ok=True), (a["step"], k)

    # MLflow: one run for the run id, every (key, step) exactly once, with the JSONL's values
    client = MlflowClient(cfg.tracking.tracking_uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert runs[0].info.run_id == summary["mlflow_run_id"]
    for key in ("val-core/arith/acc/mean@1", "train/acc", "actor/pg_loss"):
        hist = client.get_metric_history(summary["mlflow_run_id"], mlflow_metric_key(key))
        counts = Counter(m.step for m in hist)
        want = [e["step"] for e in resumed if key in e["metrics"]]
        assert sorted(counts) == want and set(counts.values()) == {1}, (key, counts)
        by_step = {m.step: m.value for m in hist}
        for e in resumed:
            if key in e["metrics"]:
                assert by_step[e["step"]] == pytest.approx(e["metrics"][key], rel=1e-6), (key, e["step"])


@pytest.mark.slow  # ~15 s quiet: real runs killed and resumed
def test_a_corrupt_metrics_line_is_refused_unless_asked(tmp_path, warmstart_cache):
    over = _overrides(tmp_path / "a", warmstart_cache) + ["steps=2", "ckpt_every=2", "eval_every=2"]
    cfg = compose_config(over)
    run_dir = os.path.join(cfg.out_dir, run_id(cfg))
    proc = _start(over)
    _kill_when(proc, lambda: 1 in _steps(run_dir), "step 1")
    path = os.path.join(run_dir, "metrics.jsonl")
    lines = open(path).read().splitlines(keepends=True)
    lines.insert(1, '{"step": 1, "metr\n')  # a damaged line in the middle
    open(path, "w").write("".join(lines))
    before = open(path).read()

    out = subprocess.run([sys.executable, "-m", "suite.cli", "run", "--no-progress", *over],
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{path}: line(s) 2" in out.stderr and "tracking.drop_corrupt_metrics=true" in out.stderr
    assert "Traceback" not in out.stderr
    assert open(path).read() == before, "nothing deleted"

    _finish(over + ["tracking.drop_corrupt_metrics=true"])
    assert _steps(run_dir) == [0, 1, 2]
