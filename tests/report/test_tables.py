"""The table functions on small hand-made run frames, against hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from suite.report import data as D
from suite.report import tables as T


def frame(rows: list[dict]) -> pd.DataFrame:
    """A run frame as load_runs returns it, from the few fields a test cares about."""
    base = {"mlflow_run_id": "", "run_name": "", "experiment_id": "1", "status": "FINISHED", "start_time": None,
            "end_time": None, "parent_run_id": "", "sweep": "", "cell": None, "run_id": "", "backend": "embedded",
            "precision": "int8", "correction": "acr", "uaq_s": 1.5, "algo": "grpo", "task": "arith", "model": "tiny",
            "aligned_forward": False, "seed": 0, "trainer_dtype": "fp32", "lr": 3e-5, "steps": 10, "acc": math.nan,
            "acc0": math.nan, "kl_first": math.nan, "kl_last": math.nan, "last_step": 10, "visibility": math.nan,
            "step_ratio": math.nan, "gen_tokens_per_s": math.nan, "sync_s": math.nan, "gen_s": math.nan,
            "step_s": math.nan}
    out = [{**base, "mlflow_run_id": f"r{i}", "run_name": f"r{i}", **r} for i, r in enumerate(rows)]
    return D.coerce_runs(pd.DataFrame(out))


def t_ci(values):
    x = np.asarray(values, dtype=float)
    return stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))


def row_of(df, **match):
    sel = np.ones(len(df), dtype=bool)
    for k, v in match.items():
        sel &= (df[k] == v).to_numpy()
    assert sel.sum() == 1, (match, df.loc[sel, ["precision", "method", "uaq_s", "steps", "n"]])
    return df[sel].iloc[0]


def test_main_table_hand_computed():
    runs = frame([
        {"precision": "bf16", "correction": "naive", "uaq_s": 1.0, "seed": 0, "acc": 0.50},
        {"precision": "bf16", "correction": "naive", "uaq_s": 1.0, "seed": 1, "acc": 0.70},
        {"precision": "bf16", "correction": "acr", "seed": 0, "acc": 0.90},  # not the papers' BF16 row
        {"precision": "int8", "seed": 0, "acc": 0.40},
        {"precision": "int8", "seed": 1, "acc": 0.60},
        {"precision": "int8", "seed": 2, "acc": 0.90, "status": "FAILED"},  # listed, not averaged
        {"precision": "int8", "seed": 3, "acc": 0.10, "status": "RUNNING"},
        {"precision": "int8", "seed": 0, "acc": 0.99, "lr": 6e-5, "lr_factor": 2.0},  # an LR control: its own row
        {"precision": "int8", "correction": "tis", "uaq_s": 1.0, "seed": 0, "acc": 0.30},
    ])
    main = T.main_table(runs)
    bf16 = row_of(main, precision="bf16", method="naive")
    assert (bf16["n"], bf16["acc_pct"], bf16["seeds"], bf16["values"]) == (2, pytest.approx(60.0), "0 1", "50 70")
    np.testing.assert_allclose((bf16["acc_ci_low"], bf16["acc_ci_high"]), t_ci([50.0, 70.0]), rtol=1e-12)
    assert bf16["ci_method"] == "t"
    bf16_acr = row_of(main, precision="bf16", method="ACR")
    assert (bf16_acr["n"], bf16_acr["acc_pct"]) == (1, pytest.approx(90.0))
    acr = row_of(main, precision="int8", method="ACR", lr_factor=1.0)
    assert (acr["n"], acr["acc_pct"], acr["not_averaged"]) == (2, pytest.approx(50.0), "1 FAILED, 1 RUNNING")
    tis = row_of(main, precision="int8", method="TIS")
    assert (tis["n"], tis["acc_pct"], tis["uaq_s"]) == (1, pytest.approx(30.0), 1.0)
    assert np.isnan(tis["acc_ci_low"]) and np.isnan(tis["acc_ci_high"])  # one seed: no interval
    # 4 measured rows + the LR control's own row; no row for a setting nobody ran
    ctl = row_of(main, precision="int8", method="ACR", lr_factor=2.0)
    assert (ctl["n"], ctl["acc_pct"], ctl["lr"]) == (1, pytest.approx(99.0), 6e-5)
    assert len(main) == 5 and (main["n"] > 0).all()
    text = T.fmt.display_main(main)
    assert text.loc[ctl.name, "LR"] == "LR x2" and text.loc[acr.name, "LR"] == "ref"
    lo, hi = t_ci([40.0, 60.0])
    assert text.loc[acr.name, "acc % [95% CI]"] == f"50.0 [{lo:.1f}, {hi:.1f}]"
    assert text.loc[acr.name, "acc % per seed"] == "0: 40.0, 1: 60.0"
    assert text.loc[tis.name, "acc % [95% CI]"] == "30.0 (1 seed, no CI)"


def test_uaq_table_settings_and_visibility():
    runs = frame([
        {"uaq_s": 1.0, "seed": 0, "acc": 0.30, "visibility": 0.010, "step_ratio": 0.2},
        {"uaq_s": 1.0, "seed": 1, "acc": 0.40, "visibility": 0.030, "step_ratio": 0.4},
        {"uaq_s": 1.5, "seed": 0, "acc": 0.50, "visibility": 0.050, "step_ratio": 0.6},
        {"uaq_s": 1.5, "seed": 1, "acc": 0.60, "visibility": 0.070, "step_ratio": 0.8},
        {"uaq_s": 1.0, "seed": 0, "acc": 0.20, "visibility": 0.020, "lr": 6e-5, "lr_factor": 2.0},  # LR x2 control
        {"uaq_s": 1.0, "seed": 0, "acc": 0.45, "visibility": 0.060, "uaq_group_lr_s": 1.5},  # per-group LR control
        {"precision": "bf16", "acc": 0.9},  # full precision: not in the ablation
    ])
    uaq = T.uaq_table(runs).set_index("setting")
    assert uaq.loc["no UAQ (s=1)", "visibility_pct"] == pytest.approx(2.0)
    assert uaq.loc["no UAQ (s=1)", "step_ratio"] == pytest.approx(0.3)
    assert uaq.loc["s=1.5", "acc_pct"] == pytest.approx(55.0)
    assert uaq.loc["LR x2 (s=1)", "acc_pct"] == pytest.approx(20.0) and uaq.loc["LR x2 (s=1)", "n"] == 1
    assert uaq.loc["LR x2 (s=1)", "lr_factor"] == 2.0
    g = uaq.loc["group LR x1.5 (s=1)"]
    assert (g["acc_pct"], g["uaq_group_lr_s"], g["lr_factor"], g["n"]) == (pytest.approx(45.0), 1.5, 1.0, 1)
    # the rows that ran, no placeholder for a setting nobody asked for
    assert sorted(uaq.index) == ["LR x2 (s=1)", "group LR x1.5 (s=1)", "no UAQ (s=1)", "s=1.5"]
    assert "bf16" not in set(uaq["precision"])
    # the controls are main-table rows of their own, never pooled with the s=1 runs they control
    main = T.main_table(runs)
    assert row_of(main, precision="int8", uaq_group_lr_s=1.5)["acc_pct"] == pytest.approx(45.0)
    assert row_of(main, precision="int8", lr_factor=2.0)["acc_pct"] == pytest.approx(20.0)
    no_uaq = row_of(main, precision="int8", uaq_s=1.0, lr_factor=1.0, uaq_group_lr_s=1.0)
    assert no_uaq["acc_pct"] == pytest.approx(35.0)


def test_throughput_speedups_never_mix_native_and_emulated_rows():
    """An int8 row's bf16 reference ran its own GEMM path (the executed one where recorded);
    without one, fp32 (which has one path) is the reference."""
    runs = frame([
        {"precision": "bf16", "correction": "naive", "kernels": "native", "gen_tokens_per_s": 100.0},
        {"precision": "bf16", "correction": "naive", "kernels": "emulated", "seed": 1, "gen_tokens_per_s": 40.0},
        {"precision": "fp32", "correction": "naive", "kernels": "native", "gen_tokens_per_s": 50.0},
        {"precision": "int8", "kernels": "native", "kernels_executed": "native", "gen_tokens_per_s": 150.0},
        {"precision": "int8", "kernels": "native", "kernels_executed": "emulated", "seed": 1,
         "gen_tokens_per_s": 60.0},
        {"precision": "w4a16", "kernels": "emulated", "gen_tokens_per_s": 30.0},
    ])
    thr = T.throughput_table(runs)
    native = row_of(thr, precision="int8", kernels_executed="native")
    assert native["speedup"] == pytest.approx(1.5) and native["speedup_ref"] == "bf16"
    emulated = row_of(thr, precision="int8", kernels_executed="emulated")  # its own row: never pooled
    assert emulated["speedup"] == pytest.approx(60.0 / 40.0) and emulated["n"] == 1
    w4 = row_of(thr, precision="w4a16")
    assert w4["speedup"] == pytest.approx(30.0 / 40.0)
    bf16 = row_of(thr, precision="bf16", kernels="native")
    assert bf16["speedup"] == pytest.approx(1.0)


def test_throughput_and_kl_hand_computed():
    runs = frame([
        {"precision": "bf16", "correction": "naive", "uaq_s": 1.0, "seed": 0, "gen_tokens_per_s": 100.0,
         "sync_s": 0.1, "step_s": 2.0, "gen_s": 1.0},
        {"precision": "bf16", "correction": "naive", "uaq_s": 1.0, "seed": 1, "gen_tokens_per_s": 300.0,
         "sync_s": 0.3, "step_s": 2.0, "gen_s": 1.0},
        {"precision": "int8", "gen_tokens_per_s": 250.0, "sync_s": 0.5, "step_s": 1.0, "gen_s": 0.5,
         "kl_first": 0.002, "kl_last": 0.02},
        {"precision": "int8", "seed": 1, "gen_tokens_per_s": 999.0, "status": "KILLED", "kl_first": 1.0,
         "kl_last": 1.0},
        {"precision": "int8", "steps": 20, "gen_tokens_per_s": 50.0},  # another workload: no bf16 reference
        {"precision": "fp8", "fp8_granularity": "per_channel", "gen_tokens_per_s": 500.0, "model": "small",
         "kl_first": -0.001, "kl_last": 0.004},
    ])
    thr = T.throughput_table(runs)
    int8 = row_of(thr, model="tiny", precision="int8", steps=10)
    assert int8["speedup"] == pytest.approx(250.0 / 200.0) and int8["speedup_ref"] == "bf16"
    assert int8["sync_share_pct"] == pytest.approx(50.0)
    assert int8["not_averaged"] == "1 KILLED"
    bf16 = row_of(thr, model="tiny", precision="bf16")
    assert int8["speedup_ref_key"] == bf16["group_key"]
    assert bf16["sync_share_pct"] == pytest.approx((5.0 + 15.0) / 2) and bf16["values"] == "100 300"
    assert np.isnan(row_of(thr, precision="int8", steps=20)["speedup"])
    fp8 = row_of(thr, model="small", precision="fp8")
    assert np.isnan(fp8["speedup"]) and fp8["speedup_ref"] == ""
    kl = T.kl_table(runs)
    k = row_of(kl, precision="int8", steps=10)
    assert k["kl_growth"] == pytest.approx(10.0) and k["n"] == 1
    assert np.isnan(row_of(kl, precision="fp8")["kl_growth"])  # negative k1 start: no ratio
    pvt = T.paper_vs_throughput(thr, T.load_paper()["throughput"])
    measured = pvt[pvt["source"].str.startswith("measured")]
    assert measured["speedup_pct_low"].tolist() == [pytest.approx(25.0)]
    assert set(pvt.loc[pvt["source"].str.startswith("paper"), "model"]) == {"7B", "32B"}


def test_bench_vllm_rows_join_the_throughput_comparison(tmp_path):
    """`suite report --bench vllm.json`: each measured precision of `suite bench vllm` is a row beside
    the paper's claim for its model size, its speed-up (ratio - 1) in percent; bf16 (the reference) and
    precisions that failed are not rows."""
    import json

    from suite.report.paper import PaperDataError, load_bench

    common = {"shape": "qwen2.5-7b", "model": "7B", "gpu": "NVIDIA H200", "vllm": "0.24.0", "prompts": 256,
              "prompt_len": 512, "response_len": 512, "device": "cuda", "sync_share_pct": 4.0}
    rows = [{**common, "rollout": "bf16", "kernels": "UnquantizedLinearMethod", "rollout_tok_s": 1000.0,
             "speedup_vs_bf16": 1.0},
            {**common, "rollout": "int8", "kernels": "CutlassInt8ScaledMMLinearKernel", "rollout_tok_s": 1250.0,
             "speedup_vs_bf16": 1.25},
            {**common, "rollout": "w4a16", "kernels": "MarlinLinearKernel", "rollout_tok_s": 1100.0,
             "speedup_vs_bf16": 1.1},
            {"rollout": "fp8_per_channel", "error": "exit 1: CUDA out of memory"}]
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps({"bench": "vllm", "machine": {}, "rows": rows}))
    bench = load_bench([path])
    assert list(bench["precision"]) == ["bf16", "int8", "w4a16"]
    pvt = T.paper_vs_throughput(pd.DataFrame(columns=["precision", "speedup"]), T.load_paper()["throughput"], bench)
    ours = pvt[pvt["source"] == "measured (suite bench vllm, NVIDIA H200, vLLM 0.24.0)"]
    assert ours[["precision", "model"]].values.tolist() == [["int8", "7B"], ["w4a16", "7B"]]
    assert ours["speedup_pct_low"].tolist() == [pytest.approx(25.0), pytest.approx(10.0)]
    assert "CutlassInt8ScaledMMLinearKernel" in ours["configuration"].iloc[0]
    assert "256 x (512 + 512) tokens" in ours["configuration"].iloc[0]
    paper_7b = pvt[pvt["source"].str.startswith("paper") & (pvt["model"] == "7B")]
    assert paper_7b[["speedup_pct_low", "speedup_pct_high"]].values.tolist() == [[20, 30]]
    # each damaged copy is refused naming the file, the row's field and what it must be (suite.schemas.BenchRow)
    for change, expected in ((lambda r: r.pop("kernels"), "rows.1.kernels: field required"),
                             (lambda r: r.update(speedup_vs_bf16="1.25x"), "rows.1.speedup_vs_bf16: must be a valid "
                                                                          "number, got '1.25x'"),
                             (lambda r: r.update(rollout="nvfp4"), "rows.1.rollout: must be 'bf16', 'int8', "
                                                                  "'fp8_per_channel' or 'w4a16', got 'nvfp4'"),
                             (lambda r: r.update(rollout_tok_s=-3.0), "rows.1.rollout_tok_s: must be greater than 0")):
        bad = [dict(r) for r in rows]
        change(bad[1])
        path.write_text(json.dumps({"bench": "vllm", "rows": bad}))
        with pytest.raises(PaperDataError) as err:
            load_bench([path])
        assert str(err.value).startswith(f"--bench {path}: {expected}"), str(err.value)
    path.write_bytes(b"\xff{}")
    with pytest.raises(PaperDataError, match="not UTF-8 text"):
        load_bench([path])


def test_missing_cells_from_expected_list():
    runs = frame([{"run_id": "a", "cell": 0, "acc": 0.5}])
    expected = [{"cell": 0, "run_id": "a", "precision": "int8", "correction": "acr", "uaq_s": "1.5", "seed": "0",
                 "task": "arith", "model": "tiny", "algo": "grpo", "aligned_forward": "false", "backend": "embedded"},
                {"cell": 1, "run_id": "b", "precision": "int8", "correction": "acr", "uaq_s": "1.5", "seed": "1",
                 "task": "arith", "model": "tiny", "algo": "grpo", "aligned_forward": "false", "backend": "embedded",
                 "lr": 3e-5, "steps": 10, "trainer_dtype": "fp32"}]
    full = D.add_missing(runs, expected)
    assert list(full["status"]) == ["FINISHED", "MISSING"] and full.loc[1, "seed"] == 1
    st = T.run_status(full)
    assert list(st["status"]) == ["MISSING"] and st.loc[0, "cell"] == 1 and "no MLflow run" in st.loc[0, "reason"]
    main = T.main_table(full)
    acr = row_of(main, precision="int8", method="ACR", lr_factor=1.0)
    assert (acr["n"], acr["not_averaged"]) == (1, "1 MISSING")


def test_a_configuration_finished_twice_counts_once():
    from mlflow.entities import Metric, Run, RunData as MRunData, RunInfo, RunTag

    def run(rid, end, acc):
        info = RunInfo(run_id=rid, experiment_id="1", user_id="u", status="FINISHED", start_time=end - 10,
                       end_time=end, lifecycle_stage="active", run_name=rid)
        tags = [RunTag("run_id", "grpo-int8-acr-s1.5-arith-seed0-abc"), RunTag("precision", "int8"),
                RunTag("correction", "acr"), RunTag("uaq_s", "1.5"), RunTag("seed", "0"), RunTag("task", "arith")]
        return Run(info, MRunData(metrics=[Metric(D.acc_key("arith"), acc, end, 2)], tags=tags))

    df = D.runs_frame([run("new", 2000, 0.75), run("old", 1000, 0.25)])
    assert dict(zip(df["mlflow_run_id"], df["status"])) == {"new": "FINISHED", "old": D.SUPERSEDED}
    main = T.main_table(df)
    row = row_of(main, precision="int8", method="ACR")
    assert (row["n"], row["acc_pct"], row["not_averaged"]) == (1, 75.0, f"1 {D.SUPERSEDED}")


def test_a_report_prepares_its_run_frame_once_and_every_table_equals_its_own_call(monkeypatch):
    """build_tables prepares the runs once (suite.report.cells.prepare) and each table reads that
    frame: the tables equal the ones each table function makes from the raw runs on its own."""
    from suite.report import cells
    from suite.report.paper import load_paper

    runs = frame([
        {"precision": "bf16", "correction": "naive", "uaq_s": 1.0, "seed": 0, "acc": 0.50, "kl_first": 1e-5,
         "kl_last": 2e-5, "gen_tokens_per_s": 100.0, "sync_s": 0.1, "gen_s": 1.0, "step_s": 2.0},
        {"precision": "int8", "seed": 0, "acc": 0.40, "kl_first": 1e-4, "kl_last": 3e-4, "gen_tokens_per_s": 150.0,
         "sync_s": 0.2, "gen_s": 0.7, "step_s": 1.8},
        {"precision": "int8", "seed": 0, "acc": 0.45, "status": "FAILED"},
    ])
    alone = {"main": T.main_table(runs), "uaq_ablation": T.uaq_table(runs), "throughput": T.throughput_table(runs),
             "kl_drift": T.kl_table(runs), "runs_not_averaged": T.run_status(runs)}
    calls = []
    real = cells.prepare
    monkeypatch.setattr(T, "prepare", lambda r: calls.append(1) or real(r))
    monkeypatch.setattr(cells, "prepare", lambda r: calls.append(1) or real(r))
    tables = T.build_tables(runs, load_paper())
    assert len(calls) == 1
    for name, df in alone.items():
        pd.testing.assert_frame_equal(tables[name].data.reset_index(drop=True), df.reset_index(drop=True))
    assert "{" not in "".join(t.caption for t in tables.values())  # every placeholder filled
    assert "Runs: 1 FAILED, 2 FINISHED." in tables["main"].caption


def test_a_control_is_a_control_by_its_config_not_by_how_many_runs_there_are():
    """LR x1.5 with more seeds than its reference stays the control: the factor is what the run's config
    declares (train.lr_factor), never inferred from the learning rate most runs share."""
    runs = frame([{"uaq_s": 1.0, "seed": s, "acc": 0.5, "lr": 4.5e-5, "lr_factor": 1.5} for s in range(3)]
                 + [{"uaq_s": 1.0, "seed": 0, "acc": 0.4}])
    main = T.main_table(runs)
    assert row_of(main, precision="int8", uaq_s=1.0, lr_factor=1.5)["n"] == 3
    assert row_of(main, precision="int8", uaq_s=1.0, lr_factor=1.0)["n"] == 1
    uaq = T.uaq_table(runs).set_index("setting")
    assert uaq.loc["LR x1.5 (s=1)", "n"] == 3 and uaq.loc["no UAQ (s=1)", "n"] == 1
    # a study run at another learning rate throughout declares no control
    assert set(T.with_lr_factor(frame([{"seed": s, "lr": 1e-3} for s in range(2)]))["lr_factor"]) == {1.0}
