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

QURL = "paper: QuRL GSM8K (%)"
M = "measured: "


def test_paper_values_match_the_published_tables():
    """The numbers of QuRL's main table and UAQ ablation and QaRL's Tables 1 and 3, with each row's
    identity: QuRL = ACR + UAQ s=1.5, FlashRL = TIS at s=1, BF16 = bf16 rollout with correction naive."""
    paper = load_paper()
    main = paper["main"]
    assert main["source"].str.len().min() > 10
    qurl = main[main["paper"] == "QuRL"].set_index(["benchmark", "precision", "label"])["value"].to_dict()
    assert qurl == {
        ("GSM8K", "int8", "QuRL"): 53.55, ("GSM8K", "int8", "FlashRL"): 51.40, ("GSM8K", "bf16", "BF16"): 55.35,
        ("GSM8K", "fp8", "QuRL"): 54.28, ("GSM8K", "fp8", "FlashRL"): 53.60,
        ("AIME24 avg@32", "int8", "QuRL"): 31.25, ("AIME24 avg@32", "int8", "FlashRL"): 30.29,
        ("AIME24 avg@32", "bf16", "BF16"): 31.67, ("AIME24 avg@32", "fp8", "QuRL"): 33.27,
        ("AIME24 avg@32", "fp8", "FlashRL"): 32.60,
        ("DeepScaleR avg of 5", "int8", "QuRL"): 55.48, ("DeepScaleR avg of 5", "int8", "FlashRL"): 53.80,
        ("DeepScaleR avg of 5", "bf16", "BF16"): 56.40, ("DeepScaleR AIME24", "int8", "QuRL"): 40.52,
        ("DeepScaleR AIME24", "int8", "FlashRL"): 36.77, ("DeepScaleR AIME24", "bf16", "BF16"): 40.73}
    ident = {lab: set(map(tuple, g[["correction", "uaq_s", "aligned_forward"]].values.tolist()))
             for lab, g in main.groupby("label")}
    assert ident["QuRL"] == {("acr", 1.5, False)} and ident["FlashRL"] == {("tis", 1.0, False)}
    assert ident["BF16"] == ident["BF16 GRPO"] == {("naive", 1.0, False)}
    assert ident["w4a16 QaRL TBPO"] == {("tbpo", 1.0, True)} and ident["BF16 TBPO"] == {("tbpo", 1.0, False)}
    assert set(main.loc[main["precision"] == "fp8", "fp8_granularity"]) == {"per_channel"}
    assert set(main.loc[main["precision"] != "fp8", "fp8_granularity"]) == {""}
    qarl = main[main["paper"] == "QaRL"].set_index(["table", "label"])["value"].to_dict()
    assert qarl == {("table1", "BF16 GRPO"): 34.5, ("table1", "w4a16 rollout GRPO"): 29.3,
                    ("table1", "w4a16 QaRL TBPO"): 33.9, ("table3", "BF16 GRPO"): 57.2, ("table3", "BF16 TBPO"): 56.2,
                    ("table3", "w4a16 GRPO"): 49.2, ("table3", "w4a16 TBPO"): 52.1}
    uaq = paper["uaq"].set_index(["uaq_s", "lr_factor", "uaq_group_lr_s"])["value"].to_dict()
    assert uaq == {(1.0, 1.0, 1.0): 30.63, (1.5, 1.0, 1.0): 31.25, (2.0, 1.0, 1.0): 29.15, (1.0, 1.5, 1.0): 29.06,
                   (1.0, 2.0, 1.0): 26.66}
    assert paper["kl"].iloc[0][["kl_start", "kl_end", "steps"]].tolist() == [0.002, 0.025, 1000]


def _tied_runs():
    """INT8 ACR at s = 1.0 and s = 1.5 with two seeds each, TIS at s = 1.0 and 1.5, BF16 naive and ACR."""
    rows = []
    for s, acc in ((1.0, 0.30), (1.5, 0.60)):
        rows += [{"precision": "int8", "correction": "acr", "uaq_s": s, "seed": k, "acc": acc + k / 100}
                 for k in (0, 1)]
        rows += [{"precision": "int8", "correction": "tis", "uaq_s": s, "seed": k, "acc": acc + 0.05} for k in (0, 1)]
    rows += [{"precision": "bf16", "correction": "naive", "uaq_s": 1.0, "seed": k, "acc": 0.70} for k in (0, 1)]
    rows += [{"precision": "bf16", "correction": "acr", "uaq_s": 1.5, "seed": k, "acc": 0.90} for k in (0, 1)]
    return frame(rows)


def test_qurl_column_pairs_with_acr_at_s_1_5_only():
    pvm = T.paper_vs_main(T.main_table(_tied_runs()), load_paper()["main"])
    qurl = pvm[(pvm["label"] == "QuRL") & (pvm["precision"] == "int8") & (pvm["algo"] == "unstated")]
    assert len(qurl) == 1 and qurl.iloc[0][QURL] == 53.55
    q = qurl.iloc[0]
    assert (q["uaq_s"], q[f"{M}n"], q[f"{M}seeds"]) == (1.5, 2, "0 1")
    assert q[f"{M}acc (%)"] == pytest.approx(60.5)  # s = 1.5's seeds, never s = 1.0's (30.5)
    flash = pvm[(pvm["label"] == "FlashRL") & (pvm["precision"] == "int8") & (pvm["algo"] == "unstated")].iloc[0]
    assert (flash["uaq_s"], flash[f"{M}acc (%)"]) == (1.0, pytest.approx(35.0))
    bf16 = pvm[(pvm["label"] == "BF16") & (pvm["algo"] == "unstated")]
    assert len(bf16) == 1 and bf16.iloc[0][f"{M}acc (%)"] == pytest.approx(70.0)  # naive, not the ACR run's 90
    assert "s=1.5" in q[f"{M}configuration"] and "no UAQ (s=1)" in flash[f"{M}configuration"]
    # nothing measured ran DAPO: the AIME24 (DAPO) rows stay unpaired, shown as missing
    dapo = pvm[pvm["algo"] == "dapo"]
    assert len(dapo) == 5 and (dapo[f"{M}n"] == 0).all()
    text = T.fmt.display_paper_vs(pvm)
    assert (text.loc[dapo.index, f"{M}acc % [95% CI]"] == "missing").all()
    assert text.loc[q.name, f"{M}acc % per seed"] == "0: 60.0, 1: 61.0"


def test_every_measured_row_of_an_identity_is_its_own_pairing_row():
    runs = frame([{"precision": "int8", "correction": "acr", "uaq_s": 1.5, "seed": k, "acc": 0.5, "steps": st}
                  for k in (0, 1) for st in (200, 1000)]
                 + [{"precision": "int8", "correction": "acr", "uaq_s": 1.5, "seed": 0, "acc": 0.5, "algo": "dapo"}])
    pvm = T.paper_vs_main(T.main_table(runs), load_paper()["main"])
    qurl = pvm[(pvm["label"] == "QuRL") & (pvm["precision"] == "int8")]
    # GSM8K / DeepScaleR rows (algo unstated) pair all three configurations; AIME24 (DAPO) only the DAPO one
    assert sorted(zip(qurl["algo"], qurl[f"{M}algo"], qurl[f"{M}steps"].astype(int))) == [
        ("dapo", "dapo", 10), ("unstated", "dapo", 10), ("unstated", "grpo", 200), ("unstated", "grpo", 1000)]
    assert (qurl[f"{M}n"] <= 2).all()


def test_uaq_pairing_matches_s_lr_and_group_lr():
    rows = []
    for s, f, q, acc in ((1.0, 1.0, 1.0, 0.30), (1.5, 1.0, 1.0, 0.31), (1.0, 1.5, 1.0, 0.29), (1.0, 1.0, 1.5, 0.28)):
        rows += [{"precision": "int8", "algo": "dapo", "uaq_s": s, "lr": 3e-5 * f, "uaq_group_lr_s": q, "seed": k,
                  "acc": acc} for k in (0, 1, 2)]
    rows += [{"precision": "int8", "algo": "dapo", "uaq_s": 1.0, "seed": k, "acc": 0.3} for k in (3, 4, 5)]
    uaq = T.uaq_table(frame(rows))
    pvu = T.paper_vs_uaq(uaq, load_paper()["uaq"], T.uaq_settings(uaq)).set_index("label")
    p = "paper: QuRL AIME24 avg@32 (%)"
    assert pvu.loc["QuRL w/ UAQ s=1.5", p] == 31.25
    assert pvu.loc["QuRL w/ UAQ s=1.5", f"{M}acc (%)"] == pytest.approx(31.0)
    assert pvu.loc["LR x1.5", f"{M}acc (%)"] == pytest.approx(29.0) and pvu.loc["LR x1.5", f"{M}n"] == 3
    assert pvu.loc["QuRL w/o UAQ", f"{M}acc (%)"] == pytest.approx(30.0) and pvu.loc["QuRL w/o UAQ", f"{M}n"] == 6
    g = pvu.loc["group LR x1.5 (s=1) (not in the paper)"]
    assert np.isnan(g[p]) and g[f"{M}acc (%)"] == pytest.approx(28.0) and g["uaq_group_lr_s"] == 1.5
    assert pvu.loc["LR x2", f"{M}n"] == 0  # every published row stays, measured or not
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
