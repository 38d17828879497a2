"""suite.schemas: every file read back through a declared schema is listed with its test, the docs show
the list, and each schema refuses a damaged copy in one line naming the file and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from suite import schemas as S

REPO = Path(__file__).resolve().parents[1]


def test_the_docs_list_every_schema():
    text = (REPO / "docs" / "architecture.md").read_text()
    assert S.markdown_table() in text, "docs/architecture.md: paste `python -c 'import suite.schemas as s; " \
                                       "print(s.markdown_table())'` under 'Files and their schemas'"


def test_each_listed_test_exists():
    for _, _, _, test in S.SCHEMAS:
        path, _, name = test.partition("::")
        name = name.split("::")[-1]
        assert re.search(rf"def {re.escape(name)}\(", (REPO / path).read_text()), test


GOOD = {
    S.EvalResultsFile: {"step": 4, "scores": [{"benchmark": "arith-d1", "engine": "bf16", "engine_detail": "x",
                                               "protocol": {"samples": 1, "temperature": 0.0, "top_p": 1.0,
                                                            "max_new_tokens": 8},
                                               "step": 4, "n_prompts": 2, "n_correct": 1, "acc": 0.5,
                                               "seconds": 0.1}]},
    S.RunRecordFile: {"tracking_uri": "sqlite:///m.db", "run_id": "abc"},
    S.SyncMarkerFile: {"run_id": "abc", "synced_step": 3, "end_status": None},
    S.ParamsFile: {"a": "1"},
    S.TagsFile: {"seed": "0"},
    S.ArtifactsFile: ["a.txt"],
    S.MetricsLine: {"step": 0, "metrics": {"x": 1.0}},
    S.JobRecord: {"cell": 0, "run_id": "r", "job_id": "123", "launcher": "local"},
    S.ParentRunFile: {"run_id": "abc", "tracking_uri": "sqlite:///m.db", "experiment": "suite"},
    S.MatrixRecordFile: {"tracking_uri": "sqlite:///m.db", "experiment": "suite", "only": [],
                         "cells": [{"index": 0, "overrides": ["seed=0"], "axes": {"seed": "0"}, "run_id": "r",
                                    "run_dir": "runs/r", "steps": 5, "config": {"seed": 0}}]},
}
BAD = [
    (S.EvalResultsFile, lambda d: d["scores"][0]["protocol"].update(top_p=0), "scores.0.protocol.top_p: must be "
                                                                             "greater than 0, got 0"),
    (S.EvalResultsFile, lambda d: d["scores"][0].update(engine="int8"), "scores.0.engine: must be 'bf16', 'fp32' or "
                                                                       "'rollout', got 'int8'"),
    (S.EvalResultsFile, lambda d: d["scores"][0].update(acc=1.5), "scores.0.acc: must be less than or equal to 1"),
    (S.EvalResultsFile, lambda d: d.update(step=True), "step: must be a valid integer, got True"),
    (S.RunRecordFile, lambda d: d.pop("tracking_uri"), "tracking_uri: field required"),
    (S.SyncMarkerFile, lambda d: d.update(synced_step=-5), "synced_step: must be greater than or equal to -1"),
    (S.ParamsFile, lambda d: d.clear() or d.update({3: 1}), None),  # JSON keys are text: no bad copy to write
    (S.TagsFile, lambda d: None, None),
    (S.ArtifactsFile, lambda d: d.append(None), "1: must be a valid string, got None"),
    (S.MetricsLine, lambda d: d.update(metrics=[1]), "metrics: must be a valid dictionary, got [1]"),
    (S.JobRecord, lambda d: d.update(cell=-1), "cell: must be greater than or equal to 0, got -1"),
    (S.ParentRunFile, lambda d: d.update(run_id=""), "run_id: String should have at least 1 character"),
    (S.MatrixRecordFile, lambda d: d["cells"][0].update(steps="5"), "cells.0.steps: must be a valid integer, got '5'"),
    (S.MatrixRecordFile, lambda d: d.update(cells=[]), "cells: List should have at least 1 item"),
]


@pytest.mark.parametrize("model, change, expected", BAD, ids=[f"{m.__name__}:{i}" for i, (m, _, _) in enumerate(BAD)])
def test_each_schema_refuses_a_damaged_copy(model, change, expected, tmp_path):
    path = tmp_path / "file.json"
    good = json.loads(json.dumps(GOOD[model]))
    path.write_text(json.dumps(good))
    assert S.read_json(model, path) is not None
    if expected is None:
        path.write_text(json.dumps("a text, not a mapping"))
        with pytest.raises(S.SchemaError, match=r"\(the whole file\): must be a valid dictionary"):
            S.read_json(model, path)
        return
    change(good)
    path.write_text(json.dumps(good))
    with pytest.raises(S.SchemaError) as err:
        S.read_json(model, path)
    assert str(err.value).startswith(f"{path}: {expected}"), str(err.value)
    assert "\n" not in str(err.value)
    for raw, what in ((b"\xff", "not UTF-8 text (byte 0)"), (b"{", "not valid JSON (line 1, column 2")):
        path.write_bytes(raw)
        with pytest.raises(S.SchemaError, match=re.escape(f"{path}: {what}")):
            S.read_json(model, path)
    with pytest.raises(FileNotFoundError):  # the caller decides what an absent file means
        S.read_json(model, tmp_path / "absent.json")
