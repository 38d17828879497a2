"""The file system under a run: a read-only output or store is refused before anything is
created, and a disk that fills mid-run stops the run with one line and no traceback; once
there is space again the same command resumes from the last complete checkpoint with every
step once in metrics.jsonl and in MLflow.

The faults are real: a size-limited tmpfs and a read-only bind mount, made by the tests (the
project's machines run them as root; elsewhere they are skipped, saying why)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

TINY = ["model=tiny", "steps=4", "eval_every=2", "ckpt_every=2", "task.n_eval=16", "rollout.prompts_per_step=2",
        "algo.group_size=4", "rollout.max_new_tokens=16", "warm_start.steps=0", "threads=1"]


def _mount(*argv: str) -> None:
    proc = subprocess.run(["mount", *argv], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here (needs root with CAP_SYS_ADMIN): {proc.stderr.strip()}")


@pytest.fixture
def mounts():
    made: list[Path] = []

    def tmpfs(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
        made.append(path)
        return path

    def read_only(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        _mount("--bind", str(path), str(path))
        made.append(path)
        _mount("-o", "remount,bind,ro", str(path))
        return path

    yield tmpfs, read_only
    for path in reversed(made):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=60)


def _suite(argv: list[str], cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(SUITE_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "suite.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_read_only_out_dir_is_refused_before_anything_is_created(tmp_path, mounts):
    _, read_only = mounts
    ro = read_only(tmp_path / "ro")
    work = tmp_path / "work"
    work.mkdir()
    proc = _suite(["run", "--no-progress", *TINY, f"out_dir={ro / 'runs'}"], work, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "out_dir" in proc.stderr and "read-only file system" in proc.stderr and str(ro) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert os.listdir(work) == [] and not (tmp_path / "cache").exists()  # no mlflow.db, no cache


def test_a_read_only_store_directory_is_refused_naming_the_store(tmp_path, mounts):
    _, read_only = mounts
    work = read_only(tmp_path / "work")  # the default store, sqlite:///mlflow.db, lands in the working directory
    proc = _suite(["run", "--no-progress", *TINY, f"out_dir={tmp_path / 'runs'}"], work, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "tracking.tracking_uri=sqlite:///" in proc.stderr and "read-only" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_a_disk_full_mid_run_stops_in_one_line_and_the_same_command_resumes(tmp_path, mounts):
    tmpfs, _ = mounts
    # a tiny run's checkpoint is ~10.5 MB: the first fits in 16 MB, the second does not
    out = tmpfs(tmp_path / "small", "16m")
    work = tmp_path / "work"
    work.mkdir()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["run", "--no-progress", *TINY, f"out_dir={out / 'runs'}", f"tracking.tracking_uri={uri}"]
    proc = _suite(argv, work, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("suite run: stopped: ") and "the disk is full (ENOSPC)" in line, proc.stderr
    assert "resumes from the last complete checkpoint (step 2)" in line, line
    assert "could not mark" not in proc.stderr
    (run_dir,) = list((out / "runs").iterdir())
    assert not (run_dir / "summary.json").exists()
    rid = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    assert MlflowClient(uri).get_run(rid).info.status == "FAILED"

    ckpt2 = run_dir / "checkpoints" / "step_00000002.pt"
    written = ckpt2.stat().st_mtime_ns
    subprocess.run(["mount", "-o", "remount,size=64m", str(out)], check=True, timeout=60)  # the fault is fixed
    again = _suite(argv, work, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert ckpt2.stat().st_mtime_ns == written  # resumed from step 2, not started again
    steps = [json.loads(ln)["step"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]
    client = MlflowClient(uri)
    run = client.get_run(rid)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(rid, "train/acc")] == [1, 2, 3, 4]


def test_an_export_to_a_full_disk_stops_in_one_line_and_leaves_nothing(tmp_path, mounts):
    tmpfs, _ = mounts
    out = tmpfs(tmp_path / "small", "1m")  # the tiny model's float32 safetensors alone is ~10 MB
    proc = _suite(["export", *TINY, f"warm_start.cache_dir={tmp_path / 'warm'}", "--out", str(out / "exported")],
                  tmp_path, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("suite export: stopped: ") and "the disk is full (ENOSPC)" in line, proc.stderr
    assert os.listdir(out) == []  # no half export, no temporary directory
