"""`suite.report.data.summarize`: the per-run means the studies' runs.csv carries, by hand."""
import math

import numpy as np
import pandas as pd
import pytest

from suite.report import data as D


def test_summaries_are_means_over_rl_steps_by_hand():
    runs = pd.DataFrame({"mlflow_run_id": ["a", "b"]})
    nan = math.nan
    history = pd.DataFrame([
        # run a: step 0 is the baseline evaluation (no rollout), steps 1-3 are RL steps
        {"mlflow_run_id": "a", "step": 0, D.ACC: 0.50, "rollout_corr/k3_kl": nan, "train/acc": nan},
        {"mlflow_run_id": "a", "step": 1, D.ACC: nan, "rollout_corr/k3_kl": 0.001, "train/acc": 0.25,
         "actor/acr_relaxed_frac": 0.6, "response/error_ratio": 0.0},
        {"mlflow_run_id": "a", "step": 2, D.ACC: 0.70, "rollout_corr/k3_kl": 0.002, "train/acc": 0.50,
         "actor/acr_relaxed_frac": 0.4, "response/error_ratio": 0.5},
        {"mlflow_run_id": "a", "step": 3, D.ACC: 0.60, "rollout_corr/k3_kl": 0.006, "train/acc": 0.75,
         "actor/acr_relaxed_frac": 0.5, "response/error_ratio": 0.1},
        # run b: never logged ACR's fractions (a naive run)
        {"mlflow_run_id": "b", "step": 0, D.ACC: 0.40, "rollout_corr/k3_kl": nan, "train/acc": nan},
        {"mlflow_run_id": "b", "step": 1, D.ACC: 0.30, "rollout_corr/k3_kl": 0.010, "train/acc": 0.0},
    ])
    out = D.summarize(runs, history).set_index("mlflow_run_id")
    assert out.loc["a", "k3_kl_mean"] == pytest.approx(0.003)  # (0.001 + 0.002 + 0.006) / 3
    assert out.loc["a", "train_acc_mean"] == pytest.approx(0.5)
    assert out.loc["a", "acr_relaxed_mean"] == pytest.approx(0.5)
    assert out.loc["a", "error_ratio_mean"] == pytest.approx(0.2)
    assert out.loc["a", "acc_max"] == pytest.approx(0.70) and out.loc["a", "acc0"] == pytest.approx(0.50)
    assert out.loc["b", "k3_kl_mean"] == pytest.approx(0.010)
    assert out.loc["b", "acc_max"] == pytest.approx(0.40)  # the baseline beat every later evaluation
    assert np.isnan(out.loc["b", "acr_relaxed_mean"]) and np.isnan(out.loc["b", "error_ratio_mean"])
    assert np.isnan(out.loc["a", "acr_tightened_mean"])  # a metric absent from the history


def test_mechanism_metrics_are_read_and_summarized():
    """Every mechanism key (r's tails, clip high / low, ppo_kl, R's p99, entropy, gradient norm, error
    tokens, ACR's inversions) is read step by step and becomes a per-run mean over RL steps."""
    from suite.report.summaries import MECHANISM_MEANS

    assert set(MECHANISM_MEANS.values()) <= set(D.HISTORY_KEYS)
    runs = pd.DataFrame({"mlflow_run_id": ["a"]})
    rows = [{"mlflow_run_id": "a", "step": 0, D.ACC: 0.5}]
    for step, v in ((1, 0.01), (2, 0.03)):
        rows.append({"mlflow_run_id": "a", "step": step, D.ACC: math.nan, **{k: v for k in MECHANISM_MEANS.values()}})
    out = D.summarize(runs, pd.DataFrame(rows)).set_index("mlflow_run_id")
    for col in MECHANISM_MEANS:
        assert out.loc["a", col] == pytest.approx(0.02), col


def test_rollout_copy_accuracy_at_step_0_and_at_its_last_evaluation():
    """acc_rollout0 / acc_rollout_final: the quantized copy's held-out accuracy at the baseline and
    at the last step that scored it (not the last step); NaN for a run that never scored its copy."""
    nan = math.nan
    runs = pd.DataFrame({"mlflow_run_id": ["a", "b"]})
    history = pd.DataFrame([
        {"mlflow_run_id": "a", "step": 0, D.ACC: 0.50, D.ACC_ROLLOUT: 0.45},
        {"mlflow_run_id": "a", "step": 1, D.ACC: nan, D.ACC_ROLLOUT: nan},
        {"mlflow_run_id": "a", "step": 2, D.ACC: 0.60, D.ACC_ROLLOUT: 0.55},
        {"mlflow_run_id": "a", "step": 3, D.ACC: nan, D.ACC_ROLLOUT: nan},
        {"mlflow_run_id": "b", "step": 0, D.ACC: 0.40, D.ACC_ROLLOUT: nan},
        {"mlflow_run_id": "b", "step": 1, D.ACC: 0.42, D.ACC_ROLLOUT: nan},
    ])
    out = D.summarize(runs, history).set_index("mlflow_run_id")
    assert out.loc["a", "acc_rollout0"] == pytest.approx(0.45)
    assert out.loc["a", "acc_rollout_final"] == pytest.approx(0.55)
    assert np.isnan(out.loc["b", "acc_rollout0"]) and np.isnan(out.loc["b", "acc_rollout_final"])
