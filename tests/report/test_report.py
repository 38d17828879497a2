"""`suite report` on a real sweep (tests/report/conftest.py): the tables' numbers against the
runs' own records (metrics.jsonl, summary.json), the CIs against scipy and a direct bootstrap,
one row per configuration, missing/failed/running cells listed and not averaged, figures, HTML
and the executed notebook, artifacts on the sweep's parent run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
from cli_here import suite_here
from mlflow.tracking import MlflowClient
from scipy import stats

from suite.report import data as D
from suite.report import tables as T
from suite.report.notebook import NOTEBOOK_LINE
from _store import STEPS, TASK, jsonl_metrics

ACC_KEY = f"val-core/{TASK}/acc/mean@1"  # JSONL keeps verl's original name


def direct_ci(values, n_resamples=T.N_RESAMPLES, seed=T.CI_SEED):
    """The percentile bootstrap written out, one resample at a time."""
    x = [float(v) for v in values]
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(n_resamples):
        idx = rng.integers(0, len(x), size=len(x))
        means.append(sum(x[i] for i in idx) / len(x))
    means.sort()
    # numpy's default 'linear' percentile: position p/100 * (B - 1), interpolated
    out = []
    for p in (2.5, 97.5):
        pos = p / 100 * (len(means) - 1)
        lo = int(np.floor(pos))
        frac = pos - lo
        out.append(means[lo] + (means[min(lo + 1, len(means) - 1)] - means[lo]) * frac)
    return tuple(out)


@pytest.fixture(scope="module")
def loaded(sweep_store):
    return D.load_runs(sweep_store.tracking_uri, experiment="report-test", parent_run_id=sweep_store.parent_run_id)


@pytest.fixture(scope="module")
def cell_runs(sweep_store):
    """cell index -> (cell, summary.json or None, jsonl entries)."""
    out = {}
    for c in sweep_store.cells:
        summary_path = Path(c.run_dir) / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        entries = jsonl_metrics(c.run_dir) if (Path(c.run_dir) / "metrics.jsonl").exists() else []
        out[c.index] = (c, summary, entries)
    return out


def test_bootstrap_ci_matches_direct_computation():
    values = [0.113, 0.52, 0.871, 0.342, 0.605, 0.29, 0.4475]
    got = T.bootstrap_ci(values)
    want = direct_ci(values)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    # hand-checkable: two values a < b -> resample means a, (a+b)/2, b with p = 1/4, 1/2, 1/4,
    # so with 10,000 resamples the 2.5% and 97.5% percentiles are a and b.
    assert T.bootstrap_ci([0.2, 0.6]) == (0.2, 0.6)
    assert T.bootstrap_ci([0.3]) == (0.3, 0.3)
    assert all(np.isnan(T.bootstrap_ci([])))
    # seeded: the same interval every time; another seed draws other resamples
    assert T.bootstrap_ci(values, seed=0) == T.bootstrap_ci(values, seed=0)
    assert T.bootstrap_ci(values, seed=0) != T.bootstrap_ci(values, seed=1)


@pytest.mark.slow
def test_runs_frame_statuses_and_axes(loaded, sweep_store):
    runs = loaded.runs
    want = {s: sum(1 for o in sweep_store.outcome.values() if o == s) for s in ("FINISHED", "FAILED", "RUNNING")}
    assert runs["status"].value_counts().to_dict() == want
    by_cell = runs.set_index("cell")
    for c in sweep_store.cells:
        if sweep_store.outcome[c.index] == "MISSING":
            assert c.index not in by_cell.index
            continue
        row = by_cell.loc[c.index]
        a = c.config_axes
        assert row["run_id"] == c.run_id
        assert row["status"] == sweep_store.outcome[c.index]
        assert (row["precision"], row["correction"], f"{row['uaq_s']:g}", str(row["seed"])) == (
            a["precision"], a["correction"], a["uaq_s"], a["seed"])
        assert row["sweep"] == "report-test" and row["parent_run_id"] == sweep_store.parent_run_id


def test_history_matches_jsonl(loaded, cell_runs, sweep_store):
    """The long form holds exactly the values each finished run logged, step by step."""
    h = loaded.history
    runs = loaded.runs.set_index("cell")
    checked = 0
    for idx, (c, summary, entries) in cell_runs.items():
        if sweep_store.outcome[idx] != "FINISHED":
            continue
        rid = runs.loc[idx, "mlflow_run_id"]
        mine = h[h["mlflow_run_id"] == rid].set_index("step")
        assert sorted(mine.index) == sorted(e["step"] for e in entries) == list(range(STEPS + 1))
        for e in entries:
            for key in ("rollout_corr/kl", "critic/score/mean", "quant/update_code_changed_frac",
                        "perf/gen_tokens_per_s"):
                if key in e["metrics"]:
                    assert mine.loc[e["step"], key] == pytest.approx(e["metrics"][key], rel=1e-12)
                    checked += 1
            if ACC_KEY in e["metrics"]:
                assert mine.loc[e["step"], "acc"] == e["metrics"][ACC_KEY]
    assert checked >= 5 * STEPS * 4


def expected_cells(sweep_store):
    return [{"cell": c.index, "run_id": c.run_id, "lr": float(c.cfg.train.lr), "params": D.config_params(c.cfg),
             **c.config_axes} for c in sweep_store.cells]


def test_group_keys_of_the_sweep(loaded, sweep_store):
    """Seeds of one cell configuration share a group key (the runs' group_key tag); different
    configurations never do; FP8 runs carry their granularity."""
    runs = loaded.runs.set_index("cell")
    keys = {}
    for c in sweep_store.cells:
        if c.index in runs.index:
            a = c.config_axes
            keys.setdefault((a["precision"], a["correction"], a["uaq_s"]), set()).add(runs.loc[c.index, "group_key"])
    assert all(len(v) == 1 for v in keys.values()), keys
    assert len({next(iter(v)) for v in keys.values()}) == len(keys)
    assert set(runs.loc[runs["precision"] == "fp8", "fp8_granularity"]) == {"per_channel"}
    assert set(runs.loc[runs["precision"] != "fp8", "fp8_granularity"]) == {""}
    assert set(runs["trainer_dtype"]) <= {"bf16", "fp32"} and set(runs["steps"]) == {STEPS}


def test_main_table_against_runs(loaded, cell_runs, sweep_store):
    runs = D.add_missing(loaded.runs, expected_cells(sweep_store))
    main = T.main_table(runs)
    # Expected from summary.json (the trainer's own final accuracy), by (precision, method, s).
    groups: dict = {}
    for idx, (c, summary, _) in cell_runs.items():
        a = c.config_axes
        method = D.method_label(a["correction"], a["aligned_forward"] == "true")
        groups.setdefault((a["precision"], method, float(a["uaq_s"])), []).append(
            (sweep_store.outcome[idx], summary, a))
    for (prec, method, s), members in groups.items():
        row = main[(main["precision"] == prec) & (main["method"] == method) & (main["uaq_s"] == s)]
        assert len(row) == 1, (prec, method, s)
        row = row.iloc[0]
        done = sorted((m for m in members if m[0] == "FINISHED"), key=lambda m: int(m[2]["seed"]))
        vals = [m[1]["final_acc"] * 100 for m in done]
        assert row["n"] == len(vals)
        assert row["seeds"] == " ".join(m[2]["seed"] for m in done)
        np.testing.assert_allclose([float(v) for v in row["values"].split()], vals, rtol=1e-9)
        if vals:
            assert row["acc_pct"] == pytest.approx(sum(vals) / len(vals), rel=1e-12)
        else:
            assert np.isnan(row["acc_pct"])
        if len(vals) > 1:  # Student-t at this n, wider than the seeds' range
            want = stats.t.interval(0.95, len(vals) - 1, loc=np.mean(vals), scale=stats.sem(vals))
            np.testing.assert_allclose((row["acc_ci_low"], row["acc_ci_high"]), want, rtol=1e-12)
            assert row["ci_method"] == "t" and row["acc_ci_low"] < min(vals) and row["acc_ci_high"] > max(vals)
        else:
            assert np.isnan(row["acc_ci_low"]) and np.isnan(row["acc_ci_high"])
        others = sorted(m[0] for m in members if m[0] != "FINISHED")
        assert row["not_averaged"] == ", ".join(f"{others.count(s_)} {s_}" for s_ in sorted(set(others)))
    # A row per configuration the sweep holds, none for a setting it never asked for (e.g. FP8 TIS):
    # the published values stand in paper_vs_main.
    assert len(main) == len(groups)
    assert main[(main["precision"] == "fp8") & (main["method"] == "TIS")].empty
    # an expected cell with no run at all is its row's "missing"
    empty = main[main["n"] == 0]
    assert (T.fmt.display_main(empty)["acc % [95% CI]"] == "missing").all()


def test_uaq_and_throughput_against_jsonl(loaded, cell_runs, sweep_store):
    runs = loaded.runs
    uaq = T.uaq_table(runs)
    thr = T.throughput_table(runs)

    def rl_mean(entries, key):
        vals = [e["metrics"][key] for e in entries if e["step"] >= 1 and key in e["metrics"]]
        return sum(vals) / len(vals)

    per = {}
    for idx, (c, summary, entries) in cell_runs.items():
        if sweep_store.outcome[idx] == "FINISHED":
            a = c.config_axes
            per.setdefault((a["precision"], a["correction"], float(a["uaq_s"])), []).append(entries)
    # UAQ: int8 ACR at s = 1 (1 seed) and s = 1.5 (2 seeds); visibility = mean over steps, then seeds.
    for s in (1.0, 1.5):
        row = uaq[(uaq["precision"] == "int8") & (uaq["method"] == "ACR") & (uaq["uaq_s"] == s)].iloc[0]
        want = np.mean([rl_mean(e, "quant/update_code_changed_frac") for e in per[("int8", "acr", s)]]) * 100
        assert row["visibility_pct"] == pytest.approx(want, rel=1e-9)
        assert row["setting"] == ("no UAQ (s=1)" if s == 1.0 else "s=1.5")
    # only the settings that ran: no row for s = 2 or an LR control nobody asked for
    grid = uaq[(uaq["precision"] == "int8") & (uaq["method"] == "ACR")]
    assert sorted(grid["setting"]) == ["no UAQ (s=1)", "s=1.5"]
    # Throughput, one row per configuration: tokens/s = mean over seeds of the mean over RL steps;
    # speed-up over the BF16 row of the same workload (the sweep's bf16 cells).
    def cfg_mean(key, cfg):
        return np.mean([rl_mean(e, key) for e in per[cfg]])

    bf16 = cfg_mean("perf/gen_tokens_per_s", ("bf16", "acr", 1.5))
    bf16_row = thr[(thr["precision"] == "bf16") & (thr["n"] > 0)].iloc[0]
    for cfg in (("int8", "acr", 1.5), ("int8", "tis", 1.5), ("int8", "acr", 1.0)):
        row = thr[(thr["precision"] == cfg[0]) & (thr["correction"] == cfg[1]) & (thr["uaq_s"] == cfg[2])]
        assert len(row) == 1, cfg
        row = row.iloc[0]
        assert row["n"] == len(per[cfg])
        assert row["gen_tokens_per_s"] == pytest.approx(cfg_mean("perf/gen_tokens_per_s", cfg), rel=1e-9)
        if bf16_row["kernels_executed"] == row["kernels_executed"]:  # AVX-512 VNNI / BF16, AMX: both native
            assert (row["speedup"] == pytest.approx(row["gen_tokens_per_s"] / bf16, rel=1e-9)
                    and row["speedup_ref"] == "bf16")
        else:  # AVX2 only: packed int8 is native, bf16 emulated; never native over emulated, and no fp32 cell
            assert (bf16_row["kernels_executed"], row["kernels_executed"]) == ("emulated", "native")
            assert np.isnan(row["speedup"]) and row["speedup_ref"] == ""
        assert row["sync_s"] == pytest.approx(cfg_mean("timing_s/update_weights", cfg), rel=1e-9)
        assert row["not_averaged"] == ("1 RUNNING" if cfg[1] == "tis" else "")
    fp8 = thr[thr["precision"] == "fp8"].iloc[0]
    assert fp8["n"] == 0 and fp8["not_averaged"] == "1 FAILED" and np.isnan(fp8["gen_tokens_per_s"])


@pytest.mark.slow  # ~8 s quiet: a sweep's runs and the executed notebook
def test_cli_report_on_the_sweep(sweep_store, tmp_path):
    """Subprocess smoke: `suite report SWEEP_FILE` writes everything and logs it to the parent run."""
    out = tmp_path / "report"
    env = {**os.environ, "MPLBACKEND": "Agg"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "report", str(sweep_store.sweep_file), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "6 FINISHED" in proc.stdout and "2 MISSING" in proc.stdout, proc.stdout
    # the notebook's kernel talks over IPC and is shut down: neither ipykernel's TCP warning nor
    # its "parent appears to have exited" reaches the user
    assert "WARNING" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr[-3000:]
    for name in ("main", "uaq_ablation", "throughput", "kl_drift", "eval", "paper_vs_main", "paper_vs_uaq",
                 "paper_vs_throughput", "paper_vs_kl", "runs_not_averaged", "layout_qurl_table1", "layout_qurl_table3",
                 "layout_qurl_uaq", "layout_qarl_table1", "layout_qarl_table3"):
        for ext in ("csv", "md", "tex"):
            assert (out / "tables" / f"{name}.{ext}").stat().st_size > 0, (name, ext)
    for name in ("kl_vs_step", "reward_vs_step", "clip_is_vs_step", "visibility_vs_s", "throughput",
                 "accuracy_vs_step"):
        png = out / "figures" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, name
        svg = (out / "figures" / f"{name}.svg").read_text()
        assert "<svg" in svg and len(svg) > 5000, name
    # Not averaged: the failed and the running run and the two missing cells are listed.
    status = pd.read_csv(out / "tables" / "runs_not_averaged.csv")
    assert sorted(status["status"]) == ["FAILED", "MISSING", "MISSING", "RUNNING"]
    missing_cells = sorted(i for i, o in sweep_store.outcome.items() if o == "MISSING")
    assert sorted(status.loc[status["status"] == "MISSING", "cell"].astype(int)) == missing_cells
    caption = (out / "tables" / "main.md").read_text()
    assert "Student-t" in caption and "n < 20" in caption and "percentile bootstrap" in caption
    main = pd.read_csv(out / "tables" / "main.csv")
    fp8 = main[(main["precision"] == "fp8") & (main["method"] == "ACR")].iloc[0]
    assert fp8["n"] == 0 and fp8["not_averaged"] == "1 FAILED, 1 MISSING"
    # Paper and measured are labelled apart in every comparison table; every published value is a row with
    # its source, and none pairs with these runs: they scored the embedded task, not a paper's benchmark
    pvm = pd.read_csv(out / "tables" / "paper_vs_main.csv", keep_default_na=False, na_values=[""])
    assert len(pvm) == len(T.load_paper()["main"]) and pvm["source"].str.contains("Table").all()
    assert (pvm["measured bf16: n"] == 0).all()
    qurl = pvm[(pvm["table"] == "table1") & (pvm["row"] == "QuRL, INT8") & (pvm["column"] == "GSM8K")]
    assert len(qurl) == 1 and qurl.iloc[0]["paper (%)"] == 53.55
    layout = (out / "tables" / "layout_qurl_table1.md").read_text()
    # the paper's layout: one row per method and bitwidth, one column per benchmark
    assert "| QuRL, INT8 | 53.55 |" in layout and "| RL (naive), INT8 | 48.78 |" in layout, layout
    assert layout.index("| BF16 | 55.35 |") < layout.index("| RL (naive), INT8 |") < layout.index("| QuRL, FP8 |")
    table3 = (out / "tables" / "layout_qurl_table3.md").read_text()
    assert "|  | AIME 2024 | AMC 2023 | MATH-500 | Minerva-Math | OlympiadBench | Avg. |" in table3, table3
    assert "| FlashRL, INT8 | 36.77 | 70.55 | 85.88 | 28.44 | 47.33 | 53.80 |" in table3, table3
    # The executed notebook: every code cell ran without error and produced output.
    nb = nbformat.read(out / "report.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert sum(1 for c in code for o in c.outputs if "image/png" in o.get("data", {})) >= 6
    # Its code keeps the house line limit (ruff checks the committed notebooks; a run id and a store path
    # overflow one line), and the commented reload line, uncommented, reads the same runs back from MLflow.
    lines = code[0].source.splitlines()
    assert all(len(x) <= NOTEBOOK_LINE or x.endswith("# noqa: E501") for c in code for x in c.source.splitlines())
    start = next(i for i, x in enumerate(lines) if x.startswith("# d = D.load_runs("))
    end = next(i for i, x in enumerate(lines) if x.startswith("# runs, history = d.runs"))
    reload = "\n".join(x[2:].split("  # noqa")[0] for x in lines[start:end + 1])
    scope = {"D": D}
    exec(reload, scope)
    saved = pd.read_csv(out / "data" / "runs.csv")
    assert sorted(scope["runs"]["run_id"]) == sorted(saved.loc[saved["status"] != "MISSING", "run_id"])
    assert sweep_store.parent_run_id in reload
    page = (out / "report.html").read_text()
    assert len(page) > 50_000 and "Paper vs measured: every published value" in page and 'class="paper"' in page
    assert 'class="measured"' in page and "FAILED" in page and "MISSING" in page
    # Logged as artifacts of the sweep's parent run.
    client = MlflowClient(tracking_uri=sweep_store.tracking_uri)
    names = {a.path for a in client.list_artifacts(sweep_store.parent_run_id, "report")}
    assert {"report/report.html", "report/tables", "report/figures"} <= names


@pytest.mark.slow
def test_cli_bad_input_names_the_option(sweep_store, tmp_path, monkeypatch):
    env = {**os.environ}
    env.pop("MLFLOW_TRACKING_URI", None)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = ["report", "--tracking-uri", sweep_store.tracking_uri, "--out", str(tmp_path)]
    # the first through a real `suite` process, the rest through the same entry point in this one
    p = subprocess.run([sys.executable, "-m", "suite.cli", *args, "--experiment", "no-such-exp"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 2 and "--experiment 'no-such-exp'" in p.stderr and "report-test" in p.stderr, p.stderr
    p = suite_here(*args, "--runs", "tags.precision === 'x'")
    assert p.returncode == 2 and "--runs" in p.stderr, p.stderr
    p = suite_here(*args, "--experiment", "report-test", "--resamples", "100")
    assert p.returncode == 2 and "--resamples=100" in p.stderr
    wrong = tmp_path.parent / f"{tmp_path.name}-rollout.json"
    wrong.write_text(json.dumps({"bench": "rollout", "rows": []}))  # another benchmark's result
    for bench, message in ((tmp_path.parent / "absent.json", "absent.json: no such file"),
                           (wrong, "bench: must be 'vllm', got 'rollout' (a `suite bench vllm` result")):
        p = suite_here(*args, "--experiment", "report-test", "--bench", str(bench))
        assert p.returncode == 2 and f"suite report: --bench {bench}" in p.stderr and message in p.stderr, p.stderr
    # a sweep file that never ran in this store: a wrong source, not a report of nothing
    never = tmp_path.parent / f"{tmp_path.name}-never.yaml"
    never.write_text(f"name: never-ran\nbase: [model=tiny, tracking.experiment=report-test, "
                     f"out_dir={tmp_path.parent / 'never-runs'}]\n"
                     "matrix: {seed: [0, 1]}\n")
    p = suite_here(*args, str(never))
    assert p.returncode == 2 and f"sweep 'never-ran' ({never}) has no run there" in p.stderr, p.stderr
    assert not any(tmp_path.iterdir())  # nothing written before the input was checked

