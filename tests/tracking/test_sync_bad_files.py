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
    (RUN_FILE, "{\"run_id\": \"ab", "not valid JSON (line 1, column 12"),
    (RUN_FILE, "[1, 2]", "(the whole file): must be a valid dictionary"),
    (RUN_FILE, json.dumps({"run_id": "abc"}), "tracking_uri: field required"),
    (RUN_FILE, json.dumps({"run_id": "abc", "tracking_uri": 5}), "tracking_uri: must be a valid string, got 5"),
    (SYNC_FILE, "garbage", "not valid JSON"),
    (SYNC_FILE, json.dumps({"run_id": "abc", "synced_step": "7"}), "synced_step: must be a valid integer, got '7'"),
    ("params.json", "\xff\xfe", "not valid JSON"),
    ("params.json", b"\xff\xfe", "not UTF-8 text (byte 0)"),
    ("artifacts.json", "{}", "(the whole file): must be a valid list, got {}"),
    ("artifacts.json", json.dumps(["a.txt", 3]), "1: must be a valid string, got 3"),
    ("metrics.jsonl", b"\xff\xfe\x00bad", "not UTF-8 text (byte 0)"),
    ("metrics.jsonl", '{"step": 0, "metrics": {}}\nnot json\n{"step": 1, "metrics": {}}\n', "line 2: not valid JSON"),
    ("metrics.jsonl", '{"step": 0, "metrics": {}}\n{"step": 1.5, "metrics": {}}\n', "line 2: step: must be a valid "
                                                                                      "integer, got 1.5"),
    ("metrics.jsonl", '{"step": 0}\n', "line 1: metrics: field required"),
])
def test_sync_on_damaged_record_files_names_the_file(tmp_path, capsys, name, text, expected):
    d = _run_dir(tmp_path)
    (d / name).write_bytes(text) if isinstance(text, bytes) else (d / name).write_text(text)
    assert resync_cli(d) == 2
    err = capsys.readouterr().err
    assert f"{d / name}: {expected}" in err and "Traceback" not in err
    assert not (tmp_path / "m.db").exists(), "nothing sent"


def test_sync_of_a_directory_the_suite_never_logged_names_the_missing_record(tmp_path, capsys):
    d = _run_dir(tmp_path)
    (d / RUN_FILE).unlink()
    assert resync_cli(d) == 2
    err = capsys.readouterr().err
    assert f"{d / RUN_FILE}: not found" in err and "Traceback" not in err and len(err.splitlines()) == 1
