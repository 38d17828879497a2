"""`suite uaq apply|undo` on a tiny random Qwen2 checkpoint (transformers, CPU, float32)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from suite.verl.hf_uaq import UAQError, transform

from verl_tiny_hf import make_tiny_qwen2


@pytest.fixture(scope="module")
def sharded_model(tmp_path_factory) -> Path:
    # several shards, so that a norm and the linears it feeds can live in different files
    return make_tiny_qwen2(tmp_path_factory.mktemp("uaq") / "model", seed=1, shard_size="20KB")


def _tensors(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


@torch.no_grad()
def _logits(d: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    return model(tokens).logits  # [B, T, V]


def test_apply_keeps_logits_and_undo_restores(sharded_model, tmp_path):
    before = _digest(sharded_model)
    assert len(list(sharded_model.glob("*.safetensors"))) > 2
    out, back = tmp_path / "uaq", tmp_path / "restored"
    from suite.cli import main

    assert main(["uaq", "apply", "--s", "1.5", str(sharded_model), str(out)]) == 0
    assert main(["uaq", "undo", "--s", "1.5", str(out), str(back)]) == 0
    assert _digest(sharded_model) == before, "the input checkpoint was modified"

    orig, scaled, restored = _tensors(sharded_model), _tensors(out), _tensors(back)
    assert orig.keys() == scaled.keys() == restored.keys()
    # which tensors changed, and by exactly s (independent of suite.core.uaq: names from the HF model)
    changed = {k for k in orig if not torch.equal(orig[k], scaled[k])}
    expect = {f"model.layers.{i}.{n}.weight" for i in range(2) for n in (
        "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "mlp.gate_proj", "mlp.up_proj")}
    assert changed == expect
    for k in expect:
        want = orig[k] * 1.5 if k.endswith("norm.weight") else orig[k] / 1.5
        torch.testing.assert_close(scaled[k], want, rtol=0, atol=0)
    # undo: every tensor back exactly, or within one float32 ulp
    for k, t in orig.items():
        ulp = (torch.nextafter(t.abs(), torch.tensor(float("inf"))) - t.abs())  # [..] one ulp at |t|
        assert bool(((restored[k] - t).abs() <= ulp).all()), k
    # logits unchanged (float32, relative 1e-5 of their largest magnitude) on the whole model
    tokens = torch.randint(0, 90, (2, 12), generator=torch.Generator().manual_seed(0))
    la, lb = _logits(sharded_model, tokens), _logits(out, tokens)
    assert float((la - lb).abs().max() / la.abs().max()) < 1e-5
    assert not torch.equal(la, _logits(sharded_model, tokens.flip(-1)))  # the check can see a difference
    meta = json.loads((out / "uaq.json").read_text())
    assert meta["s"] == 1.5 and meta["mapping"] == "qwen2" and meta["max_rel_logit_diff"] < 1e-5
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors.index.json").is_file()


def test_refusals(sharded_model, tmp_path):
    with pytest.raises(UAQError, match="never overwrites its input"):
        transform(sharded_model, sharded_model, 1.5)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(UAQError, match="not empty"):
        transform(sharded_model, busy, 1.5)
    # unknown architecture: refused, naming the known ones
    other = tmp_path / "gpt2"
    other.mkdir()
    cfg = json.loads((sharded_model / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UAQError, match="LlamaForCausalLM, Qwen2ForCausalLM"):
        transform(other, tmp_path / "o", 1.5)
    # a bad s is refused before anything is written
    with pytest.raises(ValueError, match="s=-1"):
        transform(sharded_model, tmp_path / "neg", -1.0, log=lambda *_: None)
    assert not (tmp_path / "neg").exists()


def test_cli_reports_errors(sharded_model, capsys):
    from suite.cli import main

    assert main(["uaq", "apply", "--s", "1.5", str(sharded_model), str(sharded_model)]) == 2
    assert "never overwrites its input" in capsys.readouterr().err
