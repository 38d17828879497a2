"""`suite sync` on a file or on a run dir with damaged record files: exit 2, the file named,
no traceback, nothing sent."""

from __future__ import annotations

import json

import pytest

from suite.tracking.loggers import RUN_FILE, SYNC_FILE, resync_cli


def _run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / RUN_FILE).write_text(json.dumps({"run_id": "abc", "tracking_uri": f"sqlite:///{tmp_path / 'm.db'}"}))
    (d / "metrics.jsonl").write_text('{"step": 0, "time": 0, "metrics": {"x": 1}}\n')
    return d


def test_sync_on_a_file_names_it(tmp_path, capsys):
    f = tmp_path / "metrics.jsonl"
    f.write_text("{}\n")
    assert resync_cli(f) == 2
    assert f"{f} is a file, not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("name, text, expected", [
    (RUN_FILE, "{\"run_id\": \"ab", "not valid JSON"),
    (RUN_FILE, "[1, 2]", "must be a JSON object"),
    (RUN_FILE, json.dumps({"run_id": "abc"}), "incomplete: no tracking_uri"),
    (SYNC_FILE, "garbage", "not valid JSON"),
    ("params.json", "\xff\xfe", "not valid JSON"),
    ("artifacts.json", "{}", "must be a JSON list"),
])
def test_sync_on_damaged_record_files_names_the_file(tmp_path, capsys, name, text, expected):
    d = _run_dir(tmp_path)
    (d / name).write_text(text)
    assert resync_cli(d) == 2
    err = capsys.readouterr().err
    assert f"{d / name}: {expected}" in err and "Traceback" not in err
    assert not (tmp_path / "m.db").exists(), "nothing sent"
