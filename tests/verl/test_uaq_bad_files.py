"""`suite uaq` on damaged or mismatched checkpoints: exit 2, a message naming the file, no traceback,
nothing written."""

from __future__ import annotations

import json
import shutil

import pytest

from suite.cli import main


@pytest.fixture
def model_copy(tiny_qwen2, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(tiny_qwen2, d)
    return d


def _uaq(capsys, *args):
    code = main(["uaq", *args])
    return code, capsys.readouterr().err


def test_a_corrupt_config_json_names_the_file(model_copy, tmp_path, capsys):
    (model_copy / "config.json").write_text("{not json")
    code, err = _uaq(capsys, "apply", "--s", "1.5", str(model_copy), str(tmp_path / "out"))
    assert code == 2 and f"{model_copy / 'config.json'}: not valid JSON" in err
    assert not (tmp_path / "out").exists()


def test_a_truncated_shard_names_the_shard(model_copy, tmp_path, capsys):
    shard = sorted(model_copy.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    code, err = _uaq(capsys, "apply", "--s", "1.5", str(model_copy), str(tmp_path / "out"))
    assert code == 2 and f"{shard}: not a readable safetensors file" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_undo_of_a_checkpoint_never_transformed_is_refused(model_copy, tmp_path, capsys):
    code, err = _uaq(capsys, "undo", "--s", "1.5", str(model_copy), str(tmp_path / "out"))
    assert code == 2 and "uaq.json" in err and "nothing to undo" in err
    assert not (tmp_path / "out").exists()


def test_a_corrupt_record_or_another_scale_is_refused(model_copy, tmp_path, capsys):
    (model_copy / "uaq.json").write_text(json.dumps({"op": "apply"}))
    code, err = _uaq(capsys, "undo", "--s", "1.5", str(model_copy), str(tmp_path / "out"))
    assert code == 2 and f"{model_copy / 'uaq.json'}: has no numeric 's'" in err
    (model_copy / "uaq.json").write_text(json.dumps({"op": "apply", "s": 2.0}))
    code, err = _uaq(capsys, "undo", "--s", "1.5", str(model_copy), str(tmp_path / "out"))
    assert code == 2 and "s=2.0" in err
