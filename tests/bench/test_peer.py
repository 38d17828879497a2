"""`suite bench peer`: the comparison with Hugging Face really runs the same network."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

from suite.cli import main

transformers = pytest.importorskip("transformers")


def test_hf_llama_has_our_logits_and_our_greedy_tokens():
    from suite.bench.peer import hf_generate, hf_llama, ours_generate
    from suite.bench.rollout import bench_model, bench_prompts
    from suite.core.quant import QuantScheme
    from suite.embedded.engine import RolloutEngine

    model = bench_model("tiny", gain=4.0)
    hf = hf_llama(model, torch.float32)
    prompts = bench_prompts(3, 6, model.cfg.vocab_size, seed=1)
    ids = torch.tensor(prompts)
    ours = ours_generate(RolloutEngine(model, QuantScheme("fp32")), prompts, 10)  # [3, 10]
    theirs = hf_generate(hf, ids, 10)  # [3, 10]
    assert ours.shape == theirs.shape == (3, 10)
    assert torch.equal(ours, theirs)  # greedy tokens identical
    assert len(set(ours.flatten().tolist())) > 3  # a real sequence, not one repeated token
    full = torch.cat([ids, ours], 1)
    with torch.no_grad():
        a = model(full)
        b = hf(input_ids=full).logits
    assert a.abs().max() > 2  # peaked logits: no near ties
    assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_peer_json_rows(tmp_path, capsys):
    rc = main(["bench", "peer", "--json", "--models", "tiny", "--batch", "2", "--new-tokens", "4", "--prompt-len", "5",
               "--repeats", "1", "--warmup", "0", "--no-mlflow", "--out", str(tmp_path)])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1
    r = rows[0]
    assert (r["model"], r["batch"], r["new_tokens"], r["dtype"]) == ("tiny", 2, 4, "fp32")
    assert r["tokens_match"] == 1.0 and r["logits_max_abs_diff"] < 1e-3
    assert r["ratio_vs_hf"] == pytest.approx(r["ours_tokens_per_s"] / r["hf_tokens_per_s"], rel=1e-12)
