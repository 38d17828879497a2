"""The table functions on small hand-made run frames, against hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

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
    out = []
    for i, r in enumerate(rows):
        row = {**base, "mlflow_run_id": f"r{i}", "run_name": f"r{i}", **r}
        row["method"] = D.method_label(row["correction"], row["aligned_forward"], row["precision"])
        out.append(row)
    return D.coerce_runs(pd.DataFrame(out))


def test_main_table_hand_computed():
    runs = frame([
        {"precision": "bf16", "seed": 0, "acc": 0.50},
        {"precision": "bf16", "correction": "tis", "seed": 1, "acc": 0.70},  # BF16 whatever the correction
        {"precision": "int8", "seed": 0, "acc": 0.40},
        {"precision": "int8", "seed": 1, "acc": 0.60},
        {"precision": "int8", "seed": 2, "acc": 0.90, "status": "FAILED"},  # listed, not averaged
        {"precision": "int8", "seed": 3, "acc": 0.10, "status": "RUNNING"},
        {"precision": "int8", "seed": 0, "acc": 0.99, "lr": 6e-5},  # an LR control: not in the main table
        {"precision": "int8", "correction": "tis", "seed": 0, "acc": 0.30},
    ])
    main = T.main_table(runs)
    bf16 = main[main["method"] == "BF16"].iloc[0]
    assert (bf16["n"], bf16["acc_pct"], bf16["seeds"]) == (2, pytest.approx(60.0), "0 1")
    assert (bf16["acc_ci_low"], bf16["acc_ci_high"]) == (pytest.approx(50.0), pytest.approx(70.0))
    acr = main[(main["precision"] == "int8") & (main["method"] == "ACR")].iloc[0]
    assert (acr["n"], acr["acc_pct"], acr["not_averaged"]) == (2, pytest.approx(50.0), "1 FAILED, 1 RUNNING")
    tis = main[(main["precision"] == "int8") & (main["method"] == "TIS")].iloc[0]
    assert (tis["n"], tis["acc_pct"]) == (1, pytest.approx(30.0))
    assert tis["acc_ci_low"] == tis["acc_ci_high"] == pytest.approx(30.0)
    # the papers' grid: 1 BF16 + INT8/FP8 x naive/TIS/ACR rows, nothing silently dropped
    assert len(main) == 7
    missing = main[main["n"] == 0]
    assert sorted(zip(missing["precision"], missing["method"])) == [
        ("fp8", "ACR"), ("fp8", "TIS"), ("fp8", "naive"), ("int8", "naive")]
    text = T.display_main(main)
    assert (text.loc[missing.index, "acc % [95% CI]"] == "missing").all()
    assert text.loc[acr.name, "acc % [95% CI]"] == "50.0 [40.0, 60.0]"


def test_uaq_table_settings_and_visibility():
    runs = frame([
        {"uaq_s": 1.0, "seed": 0, "acc": 0.30, "visibility": 0.010, "step_ratio": 0.2},
        {"uaq_s": 1.0, "seed": 1, "acc": 0.40, "visibility": 0.030, "step_ratio": 0.4},
        {"uaq_s": 1.5, "seed": 0, "acc": 0.50, "visibility": 0.050, "step_ratio": 0.6},
        {"uaq_s": 1.5, "seed": 1, "acc": 0.60, "visibility": 0.070, "step_ratio": 0.8},
        {"uaq_s": 1.0, "seed": 0, "acc": 0.20, "visibility": 0.020, "lr": 6e-5},  # LR x2 control
        {"precision": "bf16", "acc": 0.9},  # full precision: not in the ablation
    ])
    uaq = T.uaq_table(runs).set_index("setting")
    assert uaq.loc["no UAQ (s=1)", "visibility_pct"] == pytest.approx(2.0)
    assert uaq.loc["no UAQ (s=1)", "step_ratio"] == pytest.approx(0.3)
    assert uaq.loc["s=1.5", "acc_pct"] == pytest.approx(55.0)
    assert uaq.loc["LR x2 (s=1)", "acc_pct"] == pytest.approx(20.0) and uaq.loc["LR x2 (s=1)", "n"] == 1
    assert uaq.loc["s=2", "n"] == 0 and uaq.loc["LR x1.5 (s=1)", "n"] == 0 and uaq.loc["s=1.25", "n"] == 0
    assert "bf16" not in set(uaq["precision"])
    pv = T.paper_vs_uaq(T.uaq_table(runs), T.load_paper()["uaq"]).set_index("setting")
    assert pv.loc["s=2", "paper: QuRL AIME24 avg@32, int8 ACR (%)"] == 29.15
    assert pv.loc["LR x2 (s=1)", "measured: arith/tiny/grpo/int8/ACR acc (%)"] == pytest.approx(20.0)


def test_throughput_and_kl_hand_computed():
    runs = frame([
        {"precision": "bf16", "gen_tokens_per_s": 100.0, "sync_s": 0.1, "step_s": 2.0, "gen_s": 1.0},
        {"precision": "bf16", "gen_tokens_per_s": 300.0, "sync_s": 0.3, "step_s": 2.0, "gen_s": 1.0},
        {"precision": "int8", "gen_tokens_per_s": 250.0, "sync_s": 0.5, "step_s": 1.0, "gen_s": 0.5,
         "kl_first": 0.002, "kl_last": 0.02},
        {"precision": "int8", "gen_tokens_per_s": 999.0, "status": "KILLED", "kl_first": 1.0, "kl_last": 1.0},
        {"precision": "fp8", "gen_tokens_per_s": 500.0, "model": "small", "kl_first": -0.001, "kl_last": 0.004},
    ])
    thr = T.throughput_table(runs).set_index(["model", "precision"])
    assert thr.loc[("tiny", "int8"), "speedup"] == pytest.approx(250.0 / 200.0)
    assert thr.loc[("tiny", "int8"), "sync_share_pct"] == pytest.approx(50.0)
    assert thr.loc[("tiny", "bf16"), "sync_share_pct"] == pytest.approx((5.0 + 15.0) / 2)
    assert thr.loc[("tiny", "int8"), "not_averaged"] == "1 KILLED"
    assert np.isnan(thr.loc[("small", "fp8"), "speedup"]) and thr.loc[("small", "fp8"), "speedup_ref"] == ""
    kl = T.kl_table(runs)
    int8 = kl[kl["precision"] == "int8"].iloc[0]
    assert int8["kl_growth"] == pytest.approx(10.0) and int8["n"] == 1
    assert np.isnan(kl[kl["precision"] == "fp8"].iloc[0]["kl_growth"])  # negative k1 start: no ratio
    pvt = T.paper_vs_throughput(T.throughput_table(runs), T.load_paper()["throughput"])
    measured = pvt[pvt["source"].str.startswith("measured")].iloc[0]
    assert measured["speedup_pct_low"] == pytest.approx(25.0)
    assert set(pvt.loc[pvt["source"].str.startswith("paper"), "model"]) == {"7B", "32B"}


def test_missing_cells_from_expected_list():
    runs = frame([{"run_id": "a", "cell": 0, "acc": 0.5}])
    expected = [{"cell": 0, "run_id": "a", "precision": "int8", "correction": "acr", "uaq_s": "1.5", "seed": "0",
                 "task": "arith", "model": "tiny", "algo": "grpo", "aligned_forward": "false", "backend": "embedded"},
                {"cell": 1, "run_id": "b", "precision": "int8", "correction": "acr", "uaq_s": "1.5", "seed": "1",
                 "task": "arith", "model": "tiny", "algo": "grpo", "aligned_forward": "false", "backend": "embedded"}]
    full = D.add_missing(runs, expected)
    assert list(full["status"]) == ["FINISHED", "MISSING"] and full.loc[1, "seed"] == 1
    st = T.run_status(full)
    assert list(st["status"]) == ["MISSING"] and st.loc[0, "cell"] == 1
    main = T.main_table(full)
    acr = main[(main["precision"] == "int8") & (main["method"] == "ACR")].iloc[0]
    assert (acr["n"], acr["not_averaged"]) == (1, "1 MISSING")


def test_paper_values_are_data_with_sources():
    paper = T.load_paper()
    main = paper["main"]
    assert main["source"].str.len().min() > 10
    row = main[(main["benchmark"] == "GSM8K") & (main["precision"] == "int8") & (main["method"] == "TIS")]
    assert row["value"].tolist() == [51.40]
    assert paper["kl"].iloc[0][["kl_start", "kl_end", "steps"]].tolist() == [0.002, 0.025, 1000]


def test_a_configuration_finished_twice_counts_once():
    from mlflow.entities import Run, RunData as MRunData, RunInfo, RunTag

    def run(rid, end, acc):
        info = RunInfo(run_id=rid, experiment_id="1", user_id="u", status="FINISHED", start_time=end - 10,
                       end_time=end, lifecycle_stage="active", run_name=rid)
        tags = [RunTag("run_id", "grpo-int8-acr-s1.5-arith-seed0-abc"), RunTag("precision", "int8"),
                RunTag("correction", "acr"), RunTag("uaq_s", "1.5"), RunTag("seed", "0"), RunTag("task", "arith")]
        from mlflow.entities import Metric

        return Run(info, MRunData(metrics=[Metric(D.acc_key("arith"), acc, end, 2)], tags=tags))

    df = D.runs_frame([run("new", 2000, 0.75), run("old", 1000, 0.25)])
    assert dict(zip(df["mlflow_run_id"], df["status"])) == {"new": "FINISHED", "old": D.SUPERSEDED}
    main = T.main_table(df)
    row = main[(main["precision"] == "int8") & (main["method"] == "ACR")].iloc[0]
    assert (row["n"], row["acc_pct"], row["not_averaged"]) == (1, 75.0, f"1 {D.SUPERSEDED}")
