"""`suite bench peer`'s vLLM peer (suite/bench/vllm_runner.py, driven by suite.bench.vllm_peer)
decodes what our engine decodes: this process is vLLM's environment, so the runner is started
with this Python."""

from __future__ import annotations

import sys

import torch
from torch.testing import assert_close


def test_vllm_takes_the_eos_id_greedily_where_we_do(tmp_path):
    """The bench decodes without a stop token on both sides; vLLM must not mask the config's
    ``eos_token_id`` (what ``min_tokens`` does), or its greedy pick differs from ours at every
    step where that id is the argmax. fp32 both: the tokens, and vLLM's teacher-forced argmax on
    our tokens, are ours exactly (the logits differ by ~1e-6; the margins here are > 1e-3)."""
    from suite.bench.peer import ours_generate
    from suite.bench.rollout import bench_model, bench_prompts
    from suite.bench.vllm_peer import VllmPeer, export_model
    from suite.core.quant import QuantScheme
    from suite.embedded.engine import RolloutEngine

    model = bench_model("tiny", gain=4.0)
    prompts = bench_prompts(6, 6, model.cfg.vocab_size, seed=1)
    eos = 2  # export_model's eos_token_id
    first = ours_generate(RolloutEngine(model, QuantScheme("fp32")), prompts, 1)[:, 0]  # [6]
    with torch.no_grad():  # the eos row: 1.5x the row of the token prompt 0 picks first, so it wins there
        model.lm_head.weight[eos] = 1.5 * model.lm_head.weight[first[0]]
    engine = RolloutEngine(model, QuantScheme("fp32"))
    ours = ours_generate(engine, prompts, 5)  # [6, 5]
    assert (ours == eos).sum() >= 3  # the eos id is our greedy pick, more than once
    peer = VllmPeer(sys.executable, str(tmp_path), export_model(model, str(tmp_path), "fp32"), prompts, 5)
    try:
        theirs = peer.generate()  # [6, 5]
        full = torch.cat([torch.tensor(prompts), ours], 1)  # [6, 11]
        tf = peer.teacher_forced(full)
    finally:
        peer.close()
    lp = torch.log_softmax(engine.logits(full), -1)  # [6, 11, V]
    top2 = lp[:, 5:-1].topk(2, -1).values  # [6, 5, 2]
    assert (top2[..., 0] - top2[..., 1]).min() > 1e-3  # no near tie that 1e-6 could flip
    assert torch.equal(theirs, ours)
    assert torch.equal(tf["top"][:, 5:], ours)
    assert_close(tf["lp"][:, 5:], lp[:, 5:-1].gather(-1, ours[..., None])[..., 0], rtol=0, atol=1e-4)
