"""The published values: their identity columns, the pairing with measured rows, bad rows refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from test_tables import frame

from suite.report import tables as T
from suite.report.paper import PaperDataError, analysis_dir, load_paper

M = "measured"
P = "paper (%)"
DS5 = ("aime2024", "numina_amc_aime", "HuggingFaceH4/MATH-500", "minerva_math", "olympiadbench")


def test_paper_values_match_the_published_tables():
    """Every published value with its identity, place (table, row, column) and source; each average a
    paper takes is the mean of its parts (a check of the transcription), except where the source is flagged."""
    paper = load_paper()
    main = paper["main"]
    assert main["source"].str.contains("Table|table").all() and main["source"].str.contains("row").all()
    key = main.set_index(["paper", "table", "row", "column"])["value"]
    assert not key.index.duplicated().any()
    spec = {("QuRL", "table1", "QuRL, INT8", "GSM8K"): 53.55, ("QuRL", "table1", "FlashRL, INT8", "GSM8K"): 51.40,
            ("QuRL", "table1", "BF16", "GSM8K"): 55.35, ("QuRL", "table1", "QuRL, FP8", "GSM8K"): 54.28,
            ("QuRL", "table1", "FlashRL, FP8", "GSM8K"): 53.60,
            ("QuRL", "table2", "QuRL, INT8", "Avg@32"): 31.25,
            ("QuRL", "table2", "FlashRL, INT8", "Avg@32"): 30.29,
            ("QuRL", "table2", "BF16", "Avg@32"): 31.67,
            ("QuRL", "table2", "QuRL, FP8", "Avg@32"): 33.27,
            ("QuRL", "table2", "FlashRL, FP8", "Avg@32"): 32.60,
            ("QuRL", "table3", "QuRL, INT8", "Avg."): 55.48,
            ("QuRL", "table3", "FlashRL, INT8", "Avg."): 53.80,
            ("QuRL", "table3", "BF16", "Avg."): 56.40,
            ("QuRL", "table3", "QuRL, INT8", "AIME 2024"): 40.52,
            ("QuRL", "table3", "FlashRL, INT8", "AIME 2024"): 36.77,
            ("QuRL", "table3", "BF16", "AIME 2024"): 40.73,
            ("QaRL", "table1", "BF16 GRPO", "Avg."): 34.5, ("QaRL", "table1", "w4a16 rollout GRPO", "Avg."): 29.3,
            ("QaRL", "table1", "w4a16 QaRL TBPO", "Avg."): 33.9, ("QaRL", "table3", "BF16 GRPO", "Avg."): 57.2,
            ("QaRL", "table3", "BF16 TBPO", "Avg."): 56.2, ("QaRL", "table3", "w4a16 GRPO", "Avg."): 49.2,
            ("QaRL", "table3", "w4a16 TBPO", "Avg."): 52.1}
    for k, v in spec.items():  # ../shared/SPEC.md's numbers
        assert key[k] == pytest.approx(v), k
    rows = main.to_dict("records")
    for r in rows:
        if not r["benchmark_id"].startswith("mean:") or "not the mean" in r["source"] or "OOD" in r["column"]:
            continue
        parts = r["benchmark_id"][len("mean:"):].split("+")
        vals = [x["value"] for x in rows if (x["paper"], x["table"], x["label"]) == (r["paper"], r["table"], r["label"])
                and x["benchmark_id"] in parts and x["k"] == r["k"] and x["row"] == r["row"]
                and not x["column"].endswith("(OOD)")]
        if len(vals) == len(parts):
            # parts and average are each rounded to the paper's decimals; QaRL's Table 1 averages sit up to 0.17
            # below the plain mean of their six columns, as published (w4a16 rollout GRPO: 29.3 vs 29.47)
            tol = 0.2 if r["paper"] == "QaRL" else 0.02
            assert sum(vals) / len(vals) == pytest.approx(r["value"], abs=tol), (r["table"], r["row"], r["column"])
    ident = {lab: set(map(tuple, g[["correction", "uaq_s", "aligned_forward"]].values.tolist()))
             for lab, g in main.groupby("label")}
    assert ident["FlashRL"] == {("tis", 1.0, False)} and ident["BF16"] == ident["BF16 GRPO"] == {("naive", 1.0, False)}
    assert ident["QuRL"] == {("acr", 1.0, False), ("acr", 1.5, False)}  # GSM8K runs without UAQ (Table 1)
    gsm = main[(main["benchmark_id"] == "openai/gsm8k") & (main["label"] == "QuRL")]
    assert set(gsm["uaq_s"]) == {1.0} and set(gsm["recipe"]) == {"qurl-gsm8k"}
    assert ident["w4a16 QaRL TBPO"] == {("tbpo", 1.0, True)} and ident["BF16 TBPO"] == {("tbpo", 1.0, False)}
    assert set(main.loc[main["precision"] == "fp8", "fp8_granularity"]) == {"per_channel"}
    uaq = paper["uaq"].set_index(["uaq_s", "lr_factor", "uaq_group_lr_s"])["value"].to_dict()
    assert uaq == {(1.0, 1.0, 1.0): 30.63, (1.5, 1.0, 1.0): 31.25, (2.0, 1.0, 1.0): 29.15, (1.0, 1.5, 1.0): 29.06,
                   (1.0, 2.0, 1.0): 26.66}
    assert paper["kl"].iloc[0][["kl_start", "kl_end", "steps"]].tolist() == [0.002, 0.025, 1000]


def _scored(recipe, model, evals, **cfg):
    """A finished verl run composed with `recipe` (at the recipe's learning rate), its `suite eval` scores
    {(benchmark, engine, k): acc}."""
    import json

    from suite.recipes import resolved_values

    return {"backend": "verl", "recipe": recipe, "model": model, "task": recipe, "steps": 10,
            "lr": resolved_values(recipe)["train.lr"].value,
            "evals": json.dumps({f"{b}|{e}|{k}": v for (b, e, k), v in evals.items()}), **cfg}


def test_a_published_value_pairs_with_its_benchmark_metric_identity_recipe_and_model_only():
    runs = []
    for seed, (b, r) in enumerate(((0.50, 0.46), (0.54, 0.52))):  # QuRL's GSM8K cell: INT8 ACR, no UAQ
        runs.append(_scored("qurl-gsm8k", "Qwen2.5-0.5B-Instruct", {("openai/gsm8k", "bf16", 1): b,
                                                                   ("openai/gsm8k", "rollout", 1): r},
                            precision="int8", correction="acr", uaq_s=1.0, algo="ppo", seed=seed))
    # the same cell with UAQ s = 1.5 (off the recipe), another model, another benchmark, an embedded run
    runs.append(_scored("qurl-gsm8k", "Qwen2.5-0.5B-Instruct", {("openai/gsm8k", "bf16", 1): 0.9}, precision="int8",
                        correction="acr", uaq_s=1.5, algo="ppo", seed=0))
    runs.append(_scored("qurl-gsm8k", "Llama-3.2-1B", {("openai/gsm8k", "bf16", 1): 0.9}, precision="int8",
                        correction="acr", uaq_s=1.0, algo="ppo", seed=0))
    # (a configuration of the cell's identity that scored only another benchmark is no pairing row either)
    runs.append(_scored("qurl-gsm8k", "Qwen2.5-0.5B-Instruct", {("aime2024", "bf16", 1): 0.9}, precision="int8",
                        correction="acr", uaq_s=1.0, algo="ppo", seed=5, steps=20))
    runs.append({"precision": "int8", "correction": "acr", "uaq_s": 1.0, "algo": "ppo", "seed": 0, "acc": 0.99,
                 "evals": '{"arith-d1|bf16|1": 0.99}'})
    pvm = T.paper_vs_main(T.eval_scores(frame(runs)), load_paper()["main"])
    q = pvm[(pvm["table"] == "table1") & (pvm["row"] == "QuRL, INT8") & (pvm["column"] == "GSM8K")]
    assert len(q) == 1, q
    q = q.iloc[0]
    assert (q[P], q[f"{M} bf16: n"], q[f"{M} bf16: seeds"]) == (53.55, 2, "0 1")
    assert q[f"{M} bf16: mean"] == pytest.approx(52.0) and q[f"{M} rollout: mean"] == pytest.approx(49.0)
    assert q[f"{M}: rollout - bf16"] == pytest.approx(-3.0)
    # nothing else pairs: FlashRL, BF16 and FP8 cells ran nothing; the in-training accuracy (0.99) is never used
    others = pvm[~pvm.index.isin([q.name])]
    assert (others[f"{M} bf16: n"] == 0).all() and not (pvm[f"{M} bf16: mean"] > 90).any()
    text = T.fmt.display_paper_vs(pvm)
    assert text.loc[q.name, "measured: bf16 acc % [95% CI]"].startswith("52.0 [")
    assert text.loc[q.name, "paper: published (%)"] == "53.55" and "Table 1" in text.loc[q.name, "paper: source"]


def test_an_average_the_paper_takes_is_per_run_then_over_seeds_and_needs_every_part():
    runs = []
    for seed, base in enumerate((0.40, 0.50)):
        runs.append(_scored("qurl-deepscaler", "DeepSeek-R1-Distill-Qwen-7B",
                            {(b, "bf16", 32): base + i / 100 for i, b in enumerate(DS5)},
                            precision="int8", correction="acr", uaq_s=1.5, algo="grpo", seed=seed))
    # a seed missing one of the five gives no average (and still its AIME 2024 value)
    runs.append(_scored("qurl-deepscaler", "DeepSeek-R1-Distill-Qwen-7B",
                        {(b, "bf16", 32): 0.9 for b in DS5[:4]}, precision="int8", correction="acr", uaq_s=1.5,
                        algo="grpo", seed=2))
    pvm = T.paper_vs_main(T.eval_scores(frame(runs)), load_paper()["main"]).set_index(["row", "column"])
    avg = pvm.loc[("QuRL, INT8", "Avg.")]
    assert (avg[P], avg[f"{M} bf16: n"]) == (55.48, 2)
    assert avg[f"{M} bf16: mean"] == pytest.approx(100 * (0.42 + 0.52) / 2)  # 40..44 and 50..54 -> 42, 52
    aime = pvm.loc[("QuRL, INT8", "AIME 2024")]
    assert (aime[f"{M} bf16: n"], aime[f"{M} bf16: mean"]) == (3, pytest.approx(100 * (0.40 + 0.50 + 0.9) / 3))
    assert pvm.loc[("QuRL, INT8", "Minerva-Math"), f"{M} bf16: mean"] == pytest.approx(100 * (0.43 + 0.53 + 0.9) / 3)
    assert pvm.loc[("Base (SFT), BF16", "Avg."), f"{M} bf16: n"] == 0  # no base model was scored
    # the layout: QuRL's Table 3 with ours beside the published value
    grid = T.layout(T.paper_vs_main(T.eval_scores(frame(runs)), load_paper()["main"]), "QuRL", "table3")
    cell = grid.set_index("").loc["QuRL, INT8", "Avg."]
    assert cell == "55.48 | ours 47.0 (n=2)"


def test_uaq_pairing_matches_s_lr_and_group_lr():
    """Each published row pairs by the runs' declared settings; the LR x1.5 control has more runs than the
    reference (6 against 3) and stays the control (train.lr_factor says so, not the count)."""
    rows = []
    for s, f, q, acc in ((1.0, 1.0, 1.0, 0.30), (1.5, 1.0, 1.0, 0.31), (1.0, 1.5, 1.0, 0.29), (1.0, 1.0, 1.5, 0.28)):
        rows += [_scored("qurl-dapo", "Qwen2.5-Math-7B", {("aime2024", "bf16", 32): acc}, precision="int8",
                         algo="dapo", correction="acr", uaq_s=s, lr=1e-6 * f, lr_factor=f, uaq_group_lr_s=q, seed=k)
                 for k in (0, 1, 2)]
    rows += [_scored("qurl-dapo", "Qwen2.5-Math-7B", {("aime2024", "bf16", 32): 0.29}, precision="int8", algo="dapo",
                     correction="acr", uaq_s=1.0, lr=1.5e-6, lr_factor=1.5, seed=k) for k in (3, 4, 5)]
    runs = frame(rows)
    scores = T.eval_scores(runs)
    pvu = T.paper_vs_uaq(scores, load_paper()["uaq"], T.group_lr_controls(scores)).set_index("label")
    assert pvu.loc["QuRL w/ UAQ s=1.5", P] == 31.25
    assert pvu.loc["QuRL w/ UAQ s=1.5", f"{M} bf16: mean"] == pytest.approx(31.0)
    assert pvu.loc["LR x1.5", f"{M} bf16: mean"] == pytest.approx(29.0) and pvu.loc["LR x1.5", f"{M} bf16: n"] == 6
    assert pvu.loc["QuRL w/o UAQ", f"{M} bf16: mean"] == pytest.approx(30.0)
    assert pvu.loc["QuRL w/o UAQ", f"{M} bf16: n"] == 3
    g = pvu.loc["group LR x1.5 (s=1) (not in the paper)"]
    assert np.isnan(g[P]) and g[f"{M} bf16: mean"] == pytest.approx(28.0) and g["uaq_group_lr_s"] == 1.5
    assert pvu.loc["LR x2", f"{M} bf16: n"] == 0  # every published row stays, measured or not
    assert not any("group LR x2" in label for label in pvu.index)  # no row nobody published or ran


BAD = [
    ("paper_main.csv", "correction", "QuRL2"),
    ("paper_main.csv", "uaq_s", "abc"),
    ("paper_main.csv", "precision", "int4"),
    ("paper_main.csv", "algo", "reinforce"),
    ("paper_main.csv", "aligned_forward", "yes"),
    ("paper_main.csv", "fp8_granularity", "per_row"),
    ("paper_uaq.csv", "lr_factor", "x1.5"),
    ("paper_uaq.csv", "uaq_group_lr_s", "-1"),
    ("paper_kl.csv", "correction", "QuRL"),
]


def _bad_copy(tmp_path, name, col, value, line=3):
    d = tmp_path / "paper"
    shutil.copytree(analysis_dir(), d, ignore=shutil.ignore_patterns("tune", "README.md"))
    df = pd.read_csv(d / name, dtype=str, keep_default_na=False)
    row = min(line - 2, len(df) - 1)
    if col == "fp8_granularity":
        row = int(np.flatnonzero(df["precision"] == "fp8")[0])
    df.loc[row, col] = value
    df.to_csv(d / name, index=False)
    return d, row + 2


@pytest.mark.parametrize("name,col,value", BAD)
def test_a_row_that_names_no_config_value_is_refused(tmp_path, name, col, value):
    d, line = _bad_copy(tmp_path, name, col, value)
    with pytest.raises(PaperDataError) as e:
        load_paper(d)
    msg = str(e.value)
    assert str(d / name) in msg and f"line {line}" in msg and f"{col}={value!r}" in msg, msg


def test_a_granularity_on_a_non_fp8_row_is_refused(tmp_path):
    d = tmp_path / "paper"
    shutil.copytree(analysis_dir(), d, ignore=shutil.ignore_patterns("tune", "README.md"))
    df = pd.read_csv(d / "paper_main.csv", dtype=str, keep_default_na=False)
    df.loc[0, "fp8_granularity"] = "per_channel"  # an int8 row
    df.to_csv(d / "paper_main.csv", index=False)
    with pytest.raises(PaperDataError, match="line 2 .*fp8_granularity='per_channel'"):
        load_paper(d)


@pytest.mark.slow
def test_cli_stops_on_a_bad_row_with_exit_2_and_no_traceback(tmp_path):
    d, line = _bad_copy(tmp_path, "paper_main.csv", "correction", "QuRL2")
    out = tmp_path / "out"
    env = {**os.environ}
    env.pop("MLFLOW_TRACKING_URI", None)
    p = subprocess.run([sys.executable, "-m", "suite.cli", "report", "--paper", str(d), "--out", str(out),
                        "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and str(d / "paper_main.csv") in p.stderr
    assert f"line {line}" in p.stderr and "correction='QuRL2'" in p.stderr, p.stderr
    assert not out.exists() and not (tmp_path / "none.db").exists()


def test_a_base_model_scored_by_suite_eval_model_pairs_with_the_base_row_of_its_own_model():
    """`suite eval --model` runs (correction base) pair with a paper's base row, and only for the model the row
    is about: QuRL's DeepScaleR Base (SFT) values are the 1.5B distill's, so a 7B base pairs with nothing."""
    base = {"precision": "bf16", "correction": "base", "uaq_s": 1.0, "algo": "grpo", "seed": 0}
    runs = [_scored("qurl-deepscaler", "DeepSeek-R1-Distill-Qwen-1.5B", {(b, "bf16", 32): 0.3 + i / 100
                                                                          for i, b in enumerate(DS5)}, **base),
            _scored("qurl-deepscaler", "DeepSeek-R1-Distill-Qwen-7B", {(b, "bf16", 32): 0.9 for b in DS5}, **base)]
    pvm = T.paper_vs_main(T.eval_scores(frame(runs)), load_paper()["main"]).set_index(["row", "column"])
    avg = pvm.loc[("Base (SFT), BF16", "Avg.")]
    assert (avg[P], avg[f"{M} bf16: n"]) == (48.8, 1) and avg[f"{M} bf16: mean"] == pytest.approx(32.0)
    assert pvm.loc[("Base (SFT), BF16", "AIME 2024"), f"{M} bf16: mean"] == pytest.approx(30.0)
    assert pvm.loc[[("QuRL, INT8", "Avg.")], f"{M} bf16: n"].eq(0).all()  # a base model is no trained policy
    main = T.main_table(frame(runs))  # a base run in the training tables breaks nothing
    assert set(main["method"]) == {"base"}


def test_a_pass_at_k_column_pairs_with_pass_at_k_never_with_mean_at_k():
    """QaRL's LiveCodeBench column is pass@4: a run's pass@4 pairs with it, its mean@4 (from the same four
    samples) does not; its ARC-c column (pass@1) pairs with mean@1."""
    import json

    run = _scored("qarl-math", "Qwen2.5-Math-1.5B", {("arc-c", "bf16", 1): 0.6, ("livecodebench", "bf16", 4): 0.1},
                  precision="bf16", correction="naive", uaq_s=1.0, algo="grpo", seed=0)
    run["evals"] = json.dumps({**json.loads(run["evals"]), "livecodebench|bf16|pass4": 0.25})
    scores = T.eval_scores(frame([run]))
    assert sorted(zip(scores["benchmark"], scores["k"], scores["agg"])) == [
        ("arc-c", 1, "mean"), ("livecodebench", 4, "mean"), ("livecodebench", 4, "pass")]
    pvm = T.paper_vs_main(scores, load_paper()["main"])
    bf16 = pvm[(pvm["paper"] == "QaRL") & (pvm["row"] == "BF16 GRPO")].set_index("column")
    assert bf16.loc["LiveCodeBench (OOD)", f"{M} bf16: mean"] == pytest.approx(25.0)
    assert bf16.loc["ARC-c (OOD)", f"{M} bf16: mean"] == pytest.approx(60.0)
    table = T.eval_table(frame([run]))
    assert sorted(T.fmt.display_eval(table)["metric"]) == ["mean@1", "mean@4", "pass@4"]


def test_two_values_in_one_cell_of_a_paper_table_are_refused(tmp_path):
    """A published-values row placed in a cell another row holds (a copy-paste slip) is refused naming both lines."""
    d, line = _bad_copy(tmp_path, "paper_main.csv", "row", "BF16")  # line 3 is table 1's "RL (naive), INT8"
    df = pd.read_csv(d / "paper_main.csv", dtype=str, keep_default_na=False)
    assert (df.loc[0, ["table", "row", "column"]] == df.loc[1, ["table", "row", "column"]]).all()
    with pytest.raises(PaperDataError) as e:
        load_paper(d)
    assert str(e.value) == f"{d / 'paper_main.csv'}: line 3: QuRL, table1, BF16, GSM8K is already the cell of line 2"


def test_a_published_value_pairs_with_one_checkpoint_step_at_a_time():
    """Two seeds of one configuration scored at different checkpoints pair as two rows, each naming its step."""
    import json

    runs = []
    for seed, (step, acc) in enumerate(((10, 0.50), (20, 0.60))):
        run = _scored("qurl-gsm8k", "Qwen2.5-0.5B-Instruct", {}, precision="int8", correction="acr", uaq_s=1.0,
                      algo="ppo", seed=seed)
        run["evals"] = json.dumps({"openai/gsm8k|bf16|1": {"acc": acc, "step": step}})
        runs.append(run)
    pvm = T.paper_vs_main(T.eval_scores(frame(runs)), load_paper()["main"])
    q = pvm[(pvm["table"] == "table1") & (pvm["row"] == "QuRL, INT8")].set_index(f"{M}: step")
    assert sorted(q.index) == [10, 20]
    assert (q.loc[10, f"{M} bf16: n"], q.loc[10, f"{M} bf16: mean"]) == (1, pytest.approx(50.0))
    assert (q.loc[20, f"{M} bf16: n"], q.loc[20, f"{M} bf16: mean"]) == (1, pytest.approx(60.0))
