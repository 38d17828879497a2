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


def _sha256_of_shards(d):
    import hashlib

    h = hashlib.sha256()
    for shard in sorted(d.glob("*.safetensors"), key=lambda p: p.name):
        h.update(shard.name.encode() + b"\0" + shard.read_bytes())
    return h.hexdigest()


def test_apply_records_what_it_did_and_undo_checks_it(model_copy, tmp_path, capsys):
    out, back = tmp_path / "uaq", tmp_path / "back"
    code, err = _uaq(capsys, "apply", "--s", "1.5", "--verify-layers", "1", str(model_copy), str(out))
    assert code == 0, err
    rec = json.loads((out / "uaq.json").read_text())
    assert (rec["op"], rec["s"], rec["mapping"], rec["architecture"]) == ("apply", 1.5, "qwen2", "Qwen2ForCausalLM")
    assert rec["source"] == str(model_copy.resolve())
    assert rec["source_sha256"] == _sha256_of_shards(model_copy) and rec["shards_sha256"] == _sha256_of_shards(out)
    assert rec["source_sha256"] != rec["shards_sha256"]  # the weights did change

    code, err = _uaq(capsys, "undo", "--s", "1.5", str(out), str(back))
    assert code == 0, err
    assert not (back / "uaq.json").exists()  # an ordinary checkpoint again: a second undo is refused
    done = json.loads((back / "uaq_undone.json").read_text())
    assert done["op"] == "undo" and done["applied"] == rec and done["source_sha256"] == rec["shards_sha256"]
    code, err = _uaq(capsys, "undo", "--s", "1.5", str(back), str(tmp_path / "twice"))
    assert code == 2 and "nothing to undo" in err and not (tmp_path / "twice").exists()


def test_undo_refuses_a_record_of_another_mapping_or_op(model_copy, tmp_path, capsys):
    marker = model_copy / "uaq.json"
    marker.write_text(json.dumps({"op": "apply", "s": 1.5, "mapping": "llama"}))
    code, err = _uaq(capsys, "undo", "--s", "1.5", str(model_copy), str(tmp_path / "out"))
    assert code == 2 and f"{marker}: recorded mapping 'llama'" in err and "qwen2" in err
    marker.write_text(json.dumps({"op": "undo", "s": 1.5, "mapping": "qwen2"}))
    code, err = _uaq(capsys, "undo", "--s", "1.5", str(model_copy), str(tmp_path / "out"))
    assert code == 2 and f"{marker}: op='undo'" in err
    assert not (tmp_path / "out").exists()


def test_a_sharded_checkpoint_missing_a_shard_or_a_tensor_is_refused_before_anything_is_read(tmp_path, capsys):
    """A copy cut short: the index names a shard that is not there (or a shard lost tensors). Refused
    naming what is missing, before any tensor is rescaled; nothing written."""
    from verl_tiny_hf import make_tiny_qwen2

    model = make_tiny_qwen2(tmp_path / "model", seed=1, shard_size="20KB")
    index = json.loads((model / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3
    gone = model / shards[1]
    kept = gone.read_bytes()
    gone.unlink()
    code, err = _uaq(capsys, "apply", "--s", "1.5", str(model), str(tmp_path / "out"))
    assert code == 2 and f"1 of the {len(shards)} shards model.safetensors.index.json names are missing" in err, err
    assert shards[1] in err and not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
    gone.write_bytes(kept)
    from safetensors.torch import load_file, save_file

    part = load_file(gone)
    dropped = sorted(part)[0]
    save_file({k: v for k, v in part.items() if k != dropped}, str(gone), metadata={"format": "pt"})
    code, err = _uaq(capsys, "apply", "--s", "1.5", str(model), str(tmp_path / "out"))
    assert code == 2 and "1 tensors model.safetensors.index.json names are in no shard" in err and dropped in err, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
