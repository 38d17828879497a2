"""`suite bench step`: one RL step split into its phases, per precision."""

from __future__ import annotations

import json

import pytest

from suite.cli import main


def test_step_rows_split_the_step(tiny_run, tmp_path, capsys):
    rc = main(["bench", "step", *tiny_run, "--precisions", "fp32,int8", "--repeats", "2", "--warmup", "0", "--json",
               "--no-mlflow", "--out", str(tmp_path / "out")])
    assert rc == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert [r["precision"] for r in rows] == ["fp32", "int8"]
    # the trainer in the dtype train.autocast=auto picks on this machine, named in the notes
    from suite.hardware import resolve_autocast

    assert f"trainer_dtype={resolve_autocast('auto')}" in out.err and "bound: with a free INT8 rollout" in out.err
    for r in rows:
        assert r["steps_timed"] == 2
        parts = r["sync_s"] + r["gen_s"] + r["prox_s"] + r["train_s"]
        assert 0 < parts <= r["step_s"] and r["other_s"] == pytest.approx(r["step_s"] - parts, rel=1e-9)
        assert r["rollout_share"] == pytest.approx(r["gen_s"] / r["step_s"], rel=1e-12)
        assert r["sync_share"] == pytest.approx(r["sync_s"] / r["step_s"], rel=1e-12)
        assert 0 < r["sync_share"] < r["rollout_share"] < 1
        assert r["gen_tokens_per_s"] > 0 and 1 <= r["response_len"] <= 16
    fp32, int8 = rows
    assert fp32["step_speedup_vs_fp32"] == 1.0 and fp32["gen_ratio_vs_fp32"] == 1.0
    assert int8["step_speedup_vs_fp32"] == pytest.approx(fp32["step_s"] / int8["step_s"], rel=1e-12)
    assert int8["gen_ratio_vs_fp32"] == pytest.approx(int8["gen_tokens_per_s"] / fp32["gen_tokens_per_s"], rel=1e-12)


@pytest.mark.parametrize("argv, message", [
    (["quant=int8"], "override 'quant=int8': the precision is the benchmark's axis; use --precisions"),
    (["--precisions", "int4"], "--precisions='int4' is not allowed"),
    (["algo=sgd"], "quant=fp32 algo=sgd"),
])
def test_bad_input_is_rejected_before_anything_runs(argv, message, capsys):
    assert main(["bench", "step", *argv, "--no-mlflow"]) == 2
    assert message in capsys.readouterr().err


def test_an_autocast_override_wins_over_auto(tiny_run, tmp_path, capsys):
    rc = main(["bench", "step", *tiny_run, "train.autocast=fp32", "--precisions", "fp32", "--repeats", "1",
               "--warmup", "0", "--json", "--no-mlflow", "--out", str(tmp_path / "out")])
    assert rc == 0
    assert "autocast=fp32, trainer_dtype=fp32" in capsys.readouterr().err
