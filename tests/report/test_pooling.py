"""Table cells average only runs whose configs differ by the seed; no seed is listed twice."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_tables import frame, row_of

from suite.report import cells as C
from suite.report import data as D
from suite.report import identity as I
from suite.report import tables as T

# Pairs of runs (seed 0 and seed 1) that look alike on the papers' axes but must never share a cell.
SPLITS = [
    ("correction", {"correction": "naive"}, {"correction": "acr"}),
    ("correction", {"correction": "naive"}, {"correction": "bypass"}),
    ("UAQ s", {"uaq_s": 1.0}, {"uaq_s": 1.5}),
    ("steps", {"steps": 200}, {"steps": 300}),
    ("trainer dtype", {"trainer_dtype": "bf16"}, {"trainer_dtype": "fp32"}),
    ("kernel path", {"kernels": "native"}, {"kernels": "emulated"}),
    ("bf16 kernel path", {"bf16_kernels": "native"}, {"bf16_kernels": "emulated"}),
    ("lr", {"lr": 3e-5}, {"lr": 1e-5}),
    ("model", {"model": "tiny"}, {"model": "small"}),
    ("per-group LR", {"uaq_group_lr_s": 1.0}, {"uaq_group_lr_s": 1.5}),
]


@pytest.mark.parametrize("what,a,b", SPLITS, ids=[f"{s[0]}:{i}" for i, s in enumerate(SPLITS)])
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_configs_that_differ_are_never_averaged(what, a, b, precision):
    runs = frame([{"precision": precision, "seed": 0, "acc": 0.50, **a},
                  {"precision": precision, "seed": 1, "acc": 0.70, **b}])
    for table in (T.main_table(runs), T.uaq_table(runs) if precision == "int8" else None, T.kl_table(runs),
                  T.throughput_table(runs)):
        if table is None:
            continue
        real = table[table["group_key"] != ""]
        assert real["n"].max() <= 1, (what, real[["method", "uaq_s", "steps", "n"]])
        assert set(real["seeds"]) <= {"0", "1", ""}
    main = T.main_table(runs)
    assert sorted(main["acc_pct"]) == [pytest.approx(50.0), pytest.approx(70.0)], what
    assert len(main) == 2, what  # the two runs, nothing nobody ran


# Runs that differ in one axis alone (issue: the report pooled the per-group-LR control into s = 1).
AXIS_SPLITS = SPLITS + [
    ("backend", {"backend": "embedded"}, {"backend": "verl"}),
    ("aligned forward", {"aligned_forward": False}, {"aligned_forward": True}),
    ("algo", {"algo": "grpo"}, {"algo": "dapo"}),
    ("task", {"task": "arith"}, {"task": "word"}),
    ("LR control x1.5", {"lr": 3e-5}, {"lr": 4.5e-5, "lr_factor": 1.5}),
]


def _two_runs(a: dict, b: dict) -> pd.DataFrame:
    """Two seeds of each of two configurations (a, b): int8, with every per-run metric a figure reads."""
    metrics = {"kl_first": 1e-3, "kl_last": 2e-3, "visibility": 0.02, "step_ratio": 0.5, "gen_tokens_per_s": 100.0,
               "sync_s": 0.1, "step_s": 1.0, "gen_s": 0.5}
    rows = [{"precision": "int8", "seed": s, "acc": 0.5 + 0.1 * s, **metrics, **cfg, "visibility": v + 0.001 * s}
            for cfg, v in ((a, 0.02), (b, 0.04)) for s in (0, 1)]
    if "lr" in a:  # two more runs of a: the control b is the control by its declared factor, not by count
        rows += [{"precision": "int8", "seed": s, "acc": 0.6, **metrics, **a} for s in (2, 3)]
    return frame(rows)


def _history(runs: pd.DataFrame) -> pd.DataFrame:
    """Two RL steps per run with the metrics the step figures draw."""
    keys = {"rollout_corr/kl": 1e-3, "critic/score/mean": 0.5, "train/acc": 0.5, D.ACC: 0.5, D.ACC_ROLLOUT: 0.5,
            "actor/pg_clipfrac": 0.1, "rollout_corr/rollout_is_mean": 1.0,
            "actor/pg_clipfrac_high_bound": 0.05, "rollout_corr/rollout_is_ratio_fraction_high": 0.0}
    cols = ["mlflow_run_id", "status", "backend", "precision", "correction", "uaq_s", "algo", "task", "model",
            "aligned_forward", "seed", "method", "lr", *D.HISTORY_IDENTITY]
    rows = [{**{c: r[c] for c in cols}, "step": step, **keys} for _, r in runs.iterrows() for step in (1, 2)]
    return pd.DataFrame(rows)


STATISTICS = ("n", "CI", "not averaged", "rollout tokens/s", "speed-up", "KL first step", "KL last step",
              "KL last, per seed", "growth (x)", "last step")


def _is_statistic(column: str) -> bool:
    """A displayed column that holds a measured value, not a row's identity."""
    return "%" in column or column in STATISTICS or column.startswith(
        ("weight sync", "sync share", "rollout share", "update visibility", "|dW|"))


def _visibility_points(fig) -> dict:
    """{series label: [(s, visibility %), ...]} of the visibility figure's error-bar series."""
    return {c.get_label(): list(zip(c.lines[0].get_xdata(), c.lines[0].get_ydata())) for c in fig.axes[0].containers}


def _legend_labels(fig) -> list[str]:
    labels = []
    for ax in fig.axes:
        labels += [lab for lab in ax.get_legend_handles_labels()[1] if not lab.startswith("paper")]
    labels += [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    return labels


@pytest.mark.parametrize("what,a,b", AXIS_SPLITS, ids=[f"{s[0]}:{i}" for i, s in enumerate(AXIS_SPLITS)])
def test_every_table_and_figure_keeps_configurations_that_differ_in_one_axis_apart(what, a, b):
    """Each table has one row per configuration and shows each row differently (no two displayed
    rows alike: every identity column is shown); each figure draws each configuration as its own
    labelled series."""
    from suite.report import plots as P

    runs = C.prepare(_two_runs(a, b))
    tables = T.build_tables(runs, T.load_paper(), n_resamples=200)
    for name in ("main", "uaq_ablation", "kl_drift", "throughput"):
        t = tables[name]
        data = t.data[t.data["n"] > 0]
        assert len(data) == 2 and (data["n"] >= 2).all(), (what, name, data[["n", "group_key"]])
        ident = t.text.loc[data.index].drop(columns=[c for c in t.text.columns if _is_statistic(c)])
        assert not ident.duplicated().any(), (what, name, ident.to_dict("records"))
    history = _history(runs)
    figs = P.build_figures(runs, history, tables["throughput"].data)
    n_configs = len(runs.drop_duplicates("group_key"))
    for name in ("kl_vs_step", "reward_vs_step", "accuracy_vs_step"):
        labels = _legend_labels(figs[name])
        assert len(set(labels)) >= n_configs and len(set(labels)) == len(labels), (what, name, labels)
    # throughput: a configuration is a (series, model group) bar
    bars = [(c.get_label(), round(b.get_x(), 6)) for c in figs["throughput"].axes[0].containers for b in c
            if b.get_height() > 0]
    assert len(set(bars)) == len(bars) == n_configs, (what, bars)
    # visibility vs s: a configuration is a (series, s) point; s itself is the x axis
    points = [(label, x) for label, xy in _visibility_points(figs["visibility_vs_s"]).items() for x, _ in xy]
    assert len(set(points)) == len(points) == n_configs, (what, points)
    import matplotlib.pyplot as plt

    plt.close("all")


def test_visibility_figure_never_pools_the_group_lr_control_into_s1():
    """What a new user met on the reduced UAQ ablation: the point at s = 1 pooled the no-UAQ runs
    with the per-group-LR x1.5 control."""
    from suite.report import plots as P

    rows = [{"uaq_s": 1.0, "seed": s, "acc": 0.5, "visibility": 0.0218} for s in (0, 1)]
    rows += [{"uaq_s": 1.0, "uaq_group_lr_s": 1.5, "seed": s, "acc": 0.5, "visibility": 0.0298} for s in (0, 1)]
    rows += [{"uaq_s": 1.5, "seed": s, "acc": 0.5, "visibility": 0.03} for s in (0, 1)]
    fig = P.visibility_vs_s(C.prepare(frame(rows)))
    points = _visibility_points(fig)
    assert points == {"int8": [(1.0, pytest.approx(2.18)), (1.5, pytest.approx(3.0))],
                      "int8 group LR x1.5": [(1.0, pytest.approx(2.98))]}, points
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.mark.parametrize("gran", [("per_tensor", "per_channel"), ("per_channel", "block"), ("per_tensor", "block")])
def test_fp8_granularities_are_separate_rows(gran):
    runs = frame([{"precision": "fp8", "fp8_granularity": gran[0], "seed": s, "acc": 0.4 + s / 10} for s in (0, 1)]
                 + [{"precision": "fp8", "fp8_granularity": gran[1], "seed": s, "acc": 0.8 + s / 10} for s in (0, 1)])
    for table in (T.main_table(runs), T.uaq_table(runs), T.kl_table(runs), T.throughput_table(runs)):
        fp8 = table[(table["precision"] == "fp8") & (table["group_key"] != "")]
        assert sorted(fp8["fp8_granularity"]) == sorted(gran)
        assert (fp8["n"] <= 2).all() and set(fp8["seeds"]) <= {"0 1", ""}
    main = T.main_table(runs)
    for g, mean in zip(gran, (45.0, 85.0)):
        assert row_of(main, precision="fp8", fp8_granularity=g, method="ACR")["acc_pct"] == pytest.approx(mean)
    text = T.fmt.display_main(main)
    assert not (text["precision"] == "fp8").any()  # never a bare "fp8": always with its granularity
    assert {f"fp8 {g}" for g in gran} <= set(text["precision"])


def test_a_mixed_experiment_is_split_and_each_row_lists_each_seed_once():
    """What `suite report --experiment suite` met: runs of 200/300/1000 steps, bf16 and fp32
    trainers, native and emulated kernels, a bf16-naive and a bf16-acr run, one seed run twice."""
    rows = []
    for steps in (200, 300, 1000):
        for dtype in ("bf16", "fp32"):
            for kernels in ("native", "emulated"):
                rows += [{"precision": "int8", "steps": steps, "trainer_dtype": dtype, "kernels": kernels, "seed": s,
                          "acc": 0.5} for s in (0, 1)]
    rows += [{"precision": "bf16", "correction": "naive", "uaq_s": 1.0, "seed": 0, "acc": 0.55},
             {"precision": "bf16", "correction": "acr", "uaq_s": 1.0, "seed": 0, "acc": 0.56}]
    # the same configuration and seed finished twice: only the later one counts
    rows += [{"precision": "int8", "steps": 200, "trainer_dtype": "bf16", "kernels": "native", "seed": 0,
              "acc": 0.9, "end_time": "2030-01-01T00:00:00Z"}]
    runs = frame(rows)
    main = T.main_table(runs)
    real = main[main["group_key"] != ""]
    assert len(real) == 3 * 2 * 2 + 2
    for seeds in real["seeds"]:
        listed = seeds.split()
        assert len(listed) == len(set(listed)), seeds
    assert (real.loc[real["precision"] == "int8", "n"] == 2).all()
    bf16 = real[real["precision"] == "bf16"]
    assert sorted(bf16["method"]) == ["ACR", "naive"] and (bf16["n"] == 1).all()
    late = row_of(main, precision="int8", steps=200, trainer_dtype="bf16", kernels="native")
    assert late["values"] == "90 50" and late["not_averaged"] == f"1 {I.SUPERSEDED}"
    status = T.run_status(runs)
    assert list(status["status"]) == [I.SUPERSEDED] and "later FINISHED run" in status.loc[0, "reason"]


def test_group_key_tag_splits_rows_that_look_alike_and_names_the_difference():
    cfg_a = {"algo.clip_high": "0.2", "train.lr": "3e-05"}
    cfg_b = {"algo.clip_high": "0.28", "train.lr": "3e-05"}
    runs = frame([{"seed": s, "acc": 0.5, "group_key": "ga", "config": I.config_json(cfg_a)} for s in (0, 1)]
                 + [{"seed": s, "acc": 0.7, "group_key": "gb", "config": I.config_json(cfg_b)} for s in (0, 1)]
                 + [{"seed": 0, "acc": 0.9, "group_key": "gc"}])  # no config: named by its key
    main = T.main_table(runs)
    real = main[main["group_key"] != ""].set_index("group_key")
    assert real.loc["ga", "n"] == 2 and real.loc["gb", "n"] == 2 and real.loc["gc", "n"] == 1
    assert real.loc["ga", "variant"] == "algo.clip_high=0.2"
    assert real.loc["gb", "variant"] == "algo.clip_high=0.28"
    assert real.loc["gc", "variant"] == "config gc"


def test_derived_group_key_ignores_seed_and_non_semantic_params_only():
    base = {"seed": "0", "train.lr": "3e-05", "steps": "200", "tracking.experiment": "a", "tracking.tags": "{}",
            "out_dir": "runs", "threads": "1", "warm_start.cache_dir": "/x", "warm_start.seed": "0"}

    def key(params, tags=None):
        run = _mlflow_run("r", {"precision": "int8", "correction": "acr", **(tags or {})}, params, 0.5)
        return D.runs_frame([run])["group_key"].iloc[0]

    same = {**base, "seed": "1", "tracking.experiment": "b", "out_dir": "elsewhere", "threads": "2",
            "warm_start.cache_dir": "/y"}
    assert key(base) == key(same)
    for k, v in (("steps", "300"), ("train.lr", "1e-05"), ("warm_start.seed", "1"), ("quant.fp8_granularity", "block")):
        assert key(base) != key({**base, k: v}), k
    assert json.loads(I.from_tags_and_params({}, base, "int8")["config"]) == {
        "train.lr": "3e-05", "steps": "200", "warm_start.seed": "0"}
    # the tag wins over the derived key
    assert key(base, {"group_key": "tagged"}) == "tagged"


def test_runs_with_few_params_are_told_apart_by_their_tags():
    """Runs that logged only a few params (the bench's synthetic runs, say) have equal params but
    different tags: different group keys, and the same seed of each is kept, not superseded."""
    runs = [_mlflow_run(f"r{p}", {"precision": p, "correction": "acr", "seed": "0"}, {"train.lr": "3e-05"}, 0.5)
            for p in ("bf16", "int8")]
    df = D.runs_frame(runs)
    assert df["group_key"].nunique() == 2 and list(df["status"]) == ["FINISHED", "FINISHED"]


def _mlflow_run(rid, tags, params, acc, end=1000):
    from mlflow.entities import Metric, Param, Run, RunData as MRunData, RunInfo, RunTag

    info = RunInfo(run_id=rid, experiment_id="1", user_id="u", status="FINISHED", start_time=end - 10, end_time=end,
                   lifecycle_stage="active", run_name=rid)
    return Run(info, MRunData(metrics=[Metric(D.acc_key("arith"), acc, end, 2)],
                              params=[Param(k, v) for k, v in params.items()],
                              tags=[RunTag(k, v) for k, v in tags.items()]))


def test_runs_without_the_new_tags_fall_back_to_their_params():
    axes = {"precision": "fp8", "correction": "acr", "uaq_s": "1.5", "algo": "grpo", "task": "arith", "model": "tiny",
            "aligned_forward": "false", "backend": "embedded", "trainer_dtype": "fp32"}
    params = {"train.lr": "3e-05", "steps": "200", "quant.fp8_granularity": "block", "correction.mode": "acr"}
    df = D.runs_frame([_mlflow_run(f"r{s}", {**axes, "seed": str(s)}, {**params, "seed": str(s)}, 0.5) for s in (0, 1)]
                      + [_mlflow_run("r9", {**axes, "seed": "0"}, {**params, "steps": "300"}, 0.5)])
    assert set(df["fp8_granularity"]) == {"block"} and set(df["uaq_group_lr_s"]) == {1.0}
    assert df.loc[0, "group_key"] == df.loc[1, "group_key"] != df.loc[2, "group_key"]
    assert list(df["status"]) == ["FINISHED"] * 3  # seed 0 twice, but of two configurations
    main = T.main_table(df)
    assert sorted(main.loc[main["group_key"] != "", "n"]) == [1, 2]


def test_naive_logged_before_the_rename_is_bypass():
    axes = {"precision": "int8", "uaq_s": "1", "algo": "grpo", "task": "arith", "model": "tiny", "seed": "0",
            "aligned_forward": "false", "backend": "embedded"}
    old = _mlflow_run("old", {**axes, "correction": "naive"}, {"correction.mode": "naive"}, 0.4)
    new = _mlflow_run("new", {**axes, "correction": "naive", "group_key": "k1"}, {"correction.mode": "naive"}, 0.6)
    df = D.runs_frame([old, new]).set_index("mlflow_run_id")
    assert (df.loc["old", "correction"], df.loc["old", "method"]) == ("bypass", "bypass")
    assert json.loads(df.loc["old", "config"])["correction.mode"] == "bypass"
    assert (df.loc["new", "correction"], df.loc["new", "method"]) == ("naive", "naive")


def test_a_missing_cell_joins_its_siblings_through_its_params():
    axes = {"precision": "int8", "correction": "acr", "uaq_s": "1.5", "algo": "grpo", "task": "arith", "model": "tiny",
            "aligned_forward": "false", "backend": "embedded"}
    params = {"train.lr": "3e-05", "steps": "200", "correction.mode": "acr", "train.autocast": "auto"}
    runs = D.runs_frame([_mlflow_run("r0", {**axes, "seed": "0", "group_key": "tagkey", "trainer_dtype": "bf16",
                                           "kernels": "native"}, {**params, "seed": "0"}, 0.5)])
    expected = [{"cell": 1, "run_id": "x1", **axes, "seed": "1", "params": {**params, "seed": "1"}},
                {"cell": 2, "run_id": "x2", **axes, "seed": "0", "params": {**params, "steps": "300", "seed": "0"}}]
    full = D.add_missing(runs, expected)
    assert full.loc[1, "group_key"] == "tagkey" and full.loc[1, "trainer_dtype"] == "bf16"
    assert full.loc[2, "group_key"] not in ("tagkey", "")
    main = T.main_table(full)
    real = main[main["group_key"] != ""].set_index("group_key")
    assert (real.loc["tagkey", "n"], real.loc["tagkey", "not_averaged"]) == (1, "1 MISSING")
    other = real.drop(index="tagkey")
    assert list(other["n"]) == [0] and list(other["not_averaged"]) == ["1 MISSING"] and list(other["steps"]) == [300]


def test_cell_stats_refuses_a_repeated_seed():
    runs = C.prepare(frame([{"seed": 0, "acc": 0.5}, {"seed": 0, "acc": 0.7}]))
    # prepare supersedes the earlier duplicate ...
    assert sorted(runs["status"]) == ["FINISHED", I.SUPERSEDED]
    # ... and averaging an unprepared frame with a repeated seed is an error, not a silent mean
    raw = D.coerce_runs(frame([{"seed": 0, "acc": 0.5}, {"seed": 0, "acc": 0.7}]))
    with pytest.raises(ValueError, match="repeat"):
        C.cell_stats(raw, "acc")


def test_history_carries_the_identity_columns():
    runs = frame([{"seed": 0, "fp8_granularity": "", "steps": 200, "trainer_dtype": "bf16"}])
    long = pd.DataFrame({"mlflow_run_id": ["r0"], "step": [1], "key": ["rollout_corr/kl"], "value": [0.01]})
    h = D.history_frame(long, runs)
    for col in D.HISTORY_IDENTITY:
        assert col in h.columns, col
    assert (h.loc[0, "steps"], h.loc[0, "trainer_dtype"]) == (200, "bf16")
    assert np.isclose(h.loc[0, "rollout_corr/kl"], 0.01)


def test_a_row_names_its_recipe_and_where_it_departs_from_it():
    runs = frame([{"backend": "verl", "uaq_s": 1.5, "seed": s, "acc": 0.5, "recipe": "qurl-gsm8k",
                   "recipe_deviations": "uaq.s=1.5 (recipe: 1.0)"} for s in (0, 1)]
                 + [{"backend": "verl", "uaq_s": 1.0, "seed": 0, "acc": 0.4, "recipe": "qurl-gsm8k"}])
    main = T.main_table(runs)
    text = T.fmt.display_main(main).set_index(main["uaq_s"])
    assert text.loc[1.5, "recipe"] == "qurl-gsm8k (off-recipe: uaq.s=1.5 (recipe: 1.0))"
    assert text.loc[1.0, "recipe"] == "qurl-gsm8k"
