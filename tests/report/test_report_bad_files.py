"""`suite report` on damaged files: the published-values CSVs, the MLflow store, a sweep's
parent_run.json. Each exits 2 naming the file (and line) and what is wrong, with no traceback,
before any report is written."""

from __future__ import annotations

import os
import shutil

import pytest

from suite.cli import main
from suite.report.paper import analysis_dir

DAMAGE = {
    "unterminated quote": ("paper_main.csv", lambda t: t + 'x,"unterminated\n', ["line", "not valid CSV"]),
    "short row": ("paper_uaq.csv", lambda t: t + "a,b\n", ["line 7", "2 fields, the header has 23"]),
    "long row": ("paper_kl.csv", lambda t: t.replace("\n", ",extra\n", 2).replace(",extra\n", "\n", 1),
                 ["line 2", "fields, the header has"]),
    "not UTF-8": ("paper_kl.csv", lambda t: t + "\udcff", ["not UTF-8"]),
    "empty": ("paper_throughput.csv", lambda t: "", ["empty file"]),
}


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    paper = tmp_path / "paper"
    shutil.copytree(analysis_dir(), paper, ignore=shutil.ignore_patterns("tune", "*.md"))
    return tmp_path


def _report(capsys, *args):
    try:
        code = main(["report", "--no-notebook", "--quiet", *args])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("what", list(DAMAGE))
def test_a_damaged_published_values_csv_is_named(what, work, capsys):
    name, damage, words = DAMAGE[what]
    path = work / "paper" / name
    path.write_bytes(damage(path.read_text()).encode("utf-8", "surrogateescape"))
    code, err = _report(capsys, "--paper", str(work / "paper"), "--out", str(work / "out"))
    assert code == 2, err
    assert str(path) in err and all(w in err for w in words), err
    assert "Traceback" not in err and not (work / "out").exists()


def test_a_file_that_is_not_an_mlflow_store_is_named(work, capsys):
    (work / "store.db").write_bytes(b"not a database at all" * 100)
    uri = f"sqlite:///{work / 'store.db'}"
    code, err = _report(capsys, "--tracking-uri", uri, "--out", str(work / "out"))
    assert code == 2 and f"cannot read the MLflow store {uri}" in err and "not a database" in err, err
    assert "Traceback" not in err and not (work / "out").exists()


def test_a_damaged_parent_record_of_a_sweep_is_named(work, capsys):
    sweep = work / "s.yaml"
    sweep.write_text("name: s\nbase: [model=tiny]\nmatrix: {seed: [0]}\n")
    state = work / "runs" / "_sweeps" / "s"
    state.mkdir(parents=True)
    from mlflow.tracking import MlflowClient

    MlflowClient(f"sqlite:///{work / 'mlflow.db'}").search_experiments()  # a store there: the record is what is wrong
    (state / "parent_run.json").write_text('{"run_id": ')
    code, err = _report(capsys, str(sweep), "--out", str(work / "out"))
    assert code == 2 and f"{state / 'parent_run.json'}: not JSON" in err, err
    (state / "parent_run.json").write_text('["a list"]')
    code, err = _report(capsys, str(sweep), "--out", str(work / "out"))
    assert code == 2 and f"{state / 'parent_run.json'}: (the whole file): must be a valid dictionary" in err, err
    (state / "parent_run.json").write_text('{"run_id": "abc"}')
    code, err = _report(capsys, str(sweep), "--out", str(work / "out"))
    assert code == 2 and f"{state / 'parent_run.json'}: tracking_uri: field required" in err, err
    assert "Traceback" not in err and not (work / "out").exists()
    assert os.listdir(state) == ["parent_run.json"]
