"""`suite bench rollout`: the --json schema, the arithmetic of its ratios, its MLflow run."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest
import torch

from suite.cli import main

REQUIRED = ("precision", "model", "batch", "new_tokens", "tokens_per_s", "ratio_vs_fp32", "sync_ms")


@pytest.mark.slow  # a subprocess (torch + MLflow imports), 10 engines, a profile: ~30 s on 2 quiet cores
def test_rollout_json_rows_and_mlflow_run(tmp_path):
    db = tmp_path / "mlflow.db"
    cmd = [sys.executable, "-m", "suite.cli", "bench", "rollout", "--json", "--models", "tiny", "--batch", "2,3",
           "--new-tokens", "4", "--prompt-len", "5", "--repeats", "1", "--warmup", "0", "--threads", "1", "--profile",
           "--unfused", "--python-loop", "--int8-gemms", "packed,float32", "--tracking-uri", f"sqlite:///{db}",
           "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "# suite bench rollout" in proc.stderr and "avx2" in proc.stderr  # the machine header
    assert "USDT:" not in proc.stderr and "profiler_st" not in proc.stderr  # kineto's lines are silenced
    rows = json.loads(proc.stdout)  # stdout is the JSON rows and nothing else
    from suite.hardware import cpu_features

    from suite.embedded import fused

    # int8 runs fused where the extension builds (suite.embedded.fused); --unfused adds its unfused twin;
    # --python-loop a twin of each precision whose decode step runs the C++ layer loop
    twin = fused.available()
    by = {(r["batch"], r["precision"]): r for r in rows}
    from suite.core.quant import PRECISIONS

    base = PRECISIONS  # the quantizer registry's order: fp32, bf16, int8, fp8, w4a16, wa16
    loops = [p for p in base if by[(2, p)]["path"].endswith("+cpp-loop")]
    assert "fp8" not in loops  # its linears are not plain, nor fused W8A8
    assert ("fp32" in loops) == (shutil.which("g++") is not None)  # plain + float32 attention: wherever it builds
    gemms = ("int8/packed", "int8/float32") if twin else ()  # --int8-gemms (packed needs the extension)
    variants = base + gemms + (("int8/unfused",) if twin else ()) + tuple(f"{p}/python-loop" for p in loops)
    assert [(r["batch"], r["precision"]) for r in rows] == [(b, p) for b in (2, 3) for p in variants]
    for p in loops:
        assert by[(2, f"{p}/python-loop")]["path"] == by[(2, p)]["path"].removesuffix("+cpp-loop")
    for r in rows:
        assert all(k in r for k in REQUIRED), r
        assert r["model"] == "tiny" and r["new_tokens"] == 4
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * 4 / r["gen_s"], rel=1e-12)
        fp32 = by[(r["batch"], "fp32")]
        assert r["ratio_vs_fp32"] == pytest.approx(r["tokens_per_s"] / fp32["tokens_per_s"], rel=1e-12)
        assert r["sync_ms"] > 0 and r["kernels"] in ("native", "emulated")
        path = r["path"].removesuffix("+cpp-loop").removesuffix("+fused")
        assert path in ("native", "emulated", "native:int_mm", "native:packed", "native:float32", "emulated:float32")
        assert r["cpu_flags"] == cpu_features().label()
    # int8 resolves native on every CPU with AVX2; its GEMM is named (suite.embedded.qlinear.INT8_GEMMS)
    from suite.embedded.qlinear import int8_gemm_for

    kernels = "native:" + int8_gemm_for(True, torch.device("cpu"))
    assert by[(2, "int8")]["path"].removesuffix("+cpp-loop") == (f"{kernels}+fused" if twin else kernels)
    if twin:
        assert by[(2, "int8/unfused")]["path"] == kernels  # unfused: the C++ loop does not apply either
        # bf16 outside the integer GEMM as the int8 row has it, so the C++ loop where that row has it
        loop = by[(2, "int8")]["path"].endswith("+cpp-loop")
        assert by[(2, "int8/packed")]["path"] == "native:packed+fused" + "+cpp-loop" * loop
        assert by[(2, "int8/float32")]["path"] == "emulated:float32+fused" + "+cpp-loop" * loop
    assert by[(2, "fp32")]["ratio_vs_fp32"] == 1.0
    # the table files and the profile (shares of one generate call) were written
    md = (tmp_path / "out" / "rollout.md").read_text()
    assert "tokens_per_s" in md and "ratio_vs_fp32" in md
    assert "profile" in md and "gemm" in md
    saved = json.loads((tmp_path / "out" / "rollout.json").read_text())
    assert saved["rows"] == rows and saved["machine"]["avx2"] in (True, False)
    assert saved["machine"]["cpu_flags"] == cpu_features().label()
    # one MLflow run in the real sqlite store, tagged, with the table as artifacts
    with sqlite3.connect(db) as con:
        runs = con.execute("select r.run_uuid, r.status, r.artifact_uri from runs r "
                           "join tags t on t.run_uuid = r.run_uuid "
                           "where t.key = 'bench' and t.value = 'rollout'").fetchall()
        assert len(runs) == 1 and runs[0][1] == "FINISHED"
        n_metrics = con.execute("select count(*) from latest_metrics where run_uuid = ?", (runs[0][0],)).fetchone()[0]
    assert n_metrics == 3 * len(rows)  # tokens_per_s, ratio_vs_fp32, sync_ms per row
    art = runs[0][2].removeprefix("file://")
    assert sorted(os.listdir(art if os.path.isabs(art) else tmp_path / art)) == ["rollout.json", "rollout.md"]


@pytest.mark.parametrize("argv, message", [
    (["--precisions", "fp32,int9"],
     "--precisions='int9' is not allowed; choose from: fp32, bf16, int8, fp8, w4a16, wa16"),
    (["--models", "huge"], "--models='huge' is not allowed; choose from: tiny, small, base, large, wide"),
    (["--new-tokens", "300"], "max_seq_len 256 of model small"),
    (["--kernels", "fast"], "--kernels='fast' is not allowed; choose from: auto, native, emulated"),
    (["--int8-gemms", "packed,vnni"], "--int8-gemms='vnni' is not allowed; choose from: int_mm, packed, float32"),
])
def test_bad_options_are_rejected_before_anything_runs(argv, message, capsys, tmp_path):
    assert main(["bench", "rollout", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written
