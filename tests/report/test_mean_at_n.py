"""The report reads a verl run's held-out accuracy where verl logs it: the largest mean@N (QuRL's
Avg@32 with ``backend.val_n=32``) over the run's data sources, final and step by step."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient


def _run(client, exp, task, metrics: dict[str, list[tuple[int, float]]]) -> str:
    tags = {"backend": "verl", "precision": "int8", "correction": "acr", "uaq_s": "1.5", "algo": "dapo",
            "task": task, "model": "Qwen2.5-Math-7B", "aligned_forward": "false", "seed": "0"}
    rid = client.create_run(exp, tags=tags).info.run_id
    for key, points in metrics.items():
        for step, value in points:
            client.log_metric(rid, key, value, step=step)
    client.set_terminated(rid, "FINISHED")
    return rid


def test_avg_at_32_over_data_sources_is_the_accuracy(tmp_path):
    from suite.report.data import load_runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("verl")
    # two data sources at Avg@32, plus a mean@1 (kept by verl for some sources) and rewards, which lose
    avg32 = _run(client, exp, "dapo-math-17k", {
        "val-core/aime2024/acc/mean_at_32": [(0, 0.10), (10, 0.30)],
        "val-core/aime2025/acc/mean_at_32": [(0, 0.20), (10, 0.40)],
        "val-core/aime2024/acc/mean_at_1": [(0, 0.9), (10, 0.9)],
        "val-core/aime2024/reward/mean_at_32": [(0, -0.8), (10, -0.4)],
    })
    greedy = _run(client, exp, "gsm8k", {"val-core/openai/gsm8k/acc/mean_at_1": [(0, 0.25), (5, 0.5)]})
    data = load_runs(uri)
    runs = data.runs.set_index("mlflow_run_id")
    assert runs.loc[avg32, "acc"] == pytest.approx(0.35)  # (0.30 + 0.40) / 2, not the mean@1's 0.9
    assert runs.loc[avg32, "acc_metric"] == "val-core/aime2024/acc/mean_at_32;val-core/aime2025/acc/mean_at_32"
    assert runs.loc[greedy, "acc"] == pytest.approx(0.5)
    hist = data.history.set_index(["mlflow_run_id", "step"])["acc"]
    assert hist.loc[(avg32, 0)] == pytest.approx(0.15) and hist.loc[(avg32, 10)] == pytest.approx(0.35)
    assert hist.loc[(greedy, 0)] == pytest.approx(0.25) and hist.loc[(greedy, 5)] == pytest.approx(0.5)


def test_the_main_table_names_avg_at_32_where_the_runs_were_validated_so(tmp_path):
    """The papers' AIME column is Avg@32: the main table says how each row was validated, from the
    runs' own keys (greedy mean@1 elsewhere), in its CSV (`acc_at`) and its displayed table."""
    from suite.report import fmt
    from suite.report.data import load_runs
    from suite.report.tables import held_out_label, main_table

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("verl")
    _run(client, exp, "dapo-math-17k", {"val-core/aime2024/acc/mean_at_32": [(0, 0.10), (10, 0.30)],
                                        "val-core/aime2024/acc/mean_at_1": [(0, 0.9), (10, 0.9)]})
    _run(client, exp, "gsm8k", {"val-core/openai/gsm8k/acc/mean_at_1": [(0, 0.25), (5, 0.5)]})
    main = main_table(load_runs(uri).runs)
    measured = main[main["n"] > 0].set_index("task")
    assert measured.loc["dapo-math-17k", "acc_at"] == "Avg@32" and measured.loc["gsm8k", "acc_at"] == "mean@1"
    shown = fmt.display_main(main[main["n"] > 0])
    assert sorted(shown["held-out"]) == ["Avg@32", "mean@1"]
    assert (main.loc[main["n"] == 0, "acc_at"] == "").all()  # the papers' grid rows nobody ran
    assert held_out_label(["a/acc/mean_at_1;b/acc/mean_at_16", "c/acc/mean_at_16"]) == "mean@1 / Avg@16"
    assert held_out_label(["", "val-core/x/reward/best_at_4/mean"]) == ""


def test_a_verl_run_and_an_embedded_run_of_one_cell_sit_side_by_side(tmp_path):
    """verl's MLflow logger records verl's own config as params ("/"-flattened): the report reads a
    verl run's lr and steps from them, and the main table names each row's backend, so the same
    cell on both backends is two rows of one table that differ in the backend column only."""
    from suite.report import fmt
    from suite.report.data import load_runs
    from suite.report.tables import main_table

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("both")
    ids = {}
    verl_params = {"actor_rollout_ref/actor/optim/lr": "3e-05", "trainer/total_training_steps": "40"}
    for backend, params in (("verl", verl_params), ("embedded", {"train.lr": "3e-05", "steps": "40"})):
        tags = {"backend": backend, "precision": "int8", "correction": "acr", "uaq_s": "1", "algo": "grpo",
                "task": "arith", "model": "tiny", "aligned_forward": "false", "seed": "0", "trainer_dtype": "fp32"}
        rid = client.create_run(exp, tags=tags).info.run_id
        for k, v in params.items():
            client.log_param(rid, k, v)
        client.log_metric(rid, "val-core/arith/acc/mean_at_1", 0.5 if backend == "verl" else 0.625, step=40)
        client.set_terminated(rid, "FINISHED")
        ids[backend] = rid
    runs = load_runs(uri).runs.set_index("mlflow_run_id")
    assert runs.loc[ids["verl"], "lr"] == pytest.approx(3e-5) and runs.loc[ids["verl"], "steps"] == 40
    main = main_table(load_runs(uri).runs)
    measured = main[main["n"] > 0]
    assert sorted(measured["backend"]) == ["embedded", "verl"]
    shown = fmt.display_main(measured).set_index("backend")
    assert shown.loc["verl", "acc % [95% CI]"].startswith("50.0") and shown.loc["embedded", "steps"] == "40"
    same = [c for c in shown.columns if c not in ("acc % [95% CI]", "acc % per seed", "variant")]
    assert (shown.loc["verl", same] == shown.loc["embedded", same]).all(), shown[same].T


def test_throughput_bars_name_one_configuration_measured_at_several_workloads():
    """A verl run's workload hashes verl's own params, which differ per seed, so one configuration
    can be several throughput rows: each gets its own bar label (the figure used to fail with
    "cannot reindex on an axis with duplicate labels")."""
    import pandas as pd

    from suite.report.plots import _bar_labels, throughput_bars

    row = {"model": "tiny", "precision": "bf16", "fp8_granularity": "", "method": "naive", "uaq_s": 1.0,
           "uaq_group_lr_s": 1.0, "lr": 3e-5, "steps": 40, "trainer_dtype": "fp32", "kernels": "vllm",
           "kernels_executed": "", "bf16_kernels": "vllm", "task": "arith", "algo": "grpo", "backend": "verl",
           "variant": "", "group_key": "g1", "gen_tokens_per_s": float("nan"), "speedup": float("nan"),
           "speedup_ref": "", "n": 0}
    thr = pd.DataFrame([{**row, "workload": "wl-a"}, {**row, "workload": "wl-b"}])
    labels = _bar_labels(thr)
    assert len(set(labels)) == 2 and labels[0].endswith("wl-a") and labels[1].endswith("wl-b")
    throughput_bars(thr)  # draws


def test_the_scored_checkpoint_step_reaches_the_eval_table_and_steps_are_never_pooled(tmp_path):
    """`suite eval` logs each score at its checkpoint's step: the report shows that step (the latest one scored
    where a run was scored twice), and two seeds scored at different steps are two rows, never one mean."""
    from suite.report import fmt
    from suite.report.data import load_runs
    from suite.report.tables import eval_table

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("verl")
    key = "eval/aime2024/bf16/acc/mean_at_32"
    ids = []
    for seed, points in enumerate(([(40, 0.2), (100, 0.3)], [(100, 0.5)], [(60, 0.9)])):
        rid = _run(client, exp, "dapo-math-17k", {"val-core/aime2024/acc/mean_at_32": [(100, 0.1)], key: points})
        client.set_tag(rid, "seed", str(seed))
        ids.append(rid)
    table = eval_table(load_runs(uri).runs)
    by_step = table.set_index("eval_step")
    assert sorted(table["eval_step"]) == [60, 100]
    assert by_step.loc[100, "n"] == 2 and by_step.loc[100, "acc_pct"] == pytest.approx(40.0)  # 0.3 (not 0.2), 0.5
    assert by_step.loc[60, "n"] == 1 and by_step.loc[60, "acc_pct"] == pytest.approx(90.0)
    assert sorted(fmt.display_eval(table)["step"]) == ["100", "60"]
