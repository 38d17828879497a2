"""`suite bench peer`'s vLLM peer (suite/bench/vllm_runner.py, driven by suite.bench.vllm_peer)
decodes what our engine decodes: this process is vLLM's environment, so the runner is started
with this Python."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.testing import assert_close
from vllm_tiny import FP32_ENGINE_BROKEN, int8_kernel, w8a8_reference

# the peer is a subprocess: an emulated CPU kind (conftest.py) does not reach it
EMULATE = os.environ.get("SUITE_VLLM_CPU_EMULATE", "")
pytestmark = pytest.mark.skipif(bool(EMULATE), reason=f"SUITE_VLLM_CPU_EMULATE={EMULATE}: the bench's vLLM peer is a "
                                                      "subprocess, which the emulation does not reach")


@pytest.mark.skipif(bool(FP32_ENGINE_BROKEN),
                    reason="float32 vLLM engine on this CPU kind: " + (FP32_ENGINE_BROKEN or ""))
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


@pytest.mark.skipif(int8_kernel() == "onednn-saturating",
                    reason="vLLM's CPU INT8 here is oneDNN's saturating int16 kernel (no VNNI dot product), not W8A8: "
                           "the bench's int8 row compares two computations (tests/vllm_cpu/test_parity.py measures it)")
def test_the_int8_row_parts_at_near_ties_no_more_than_our_own_float32_w8a8(tmp_path):
    """The bench's int8 row (ours: W8A8 with bf16 around the GEMMs; vLLM: the exported
    compressed-tensors checkpoint in bf16) compares one computation: teacher-forced on our
    tokens, vLLM picks our token at least as often as an all-float32 W8A8 of the same codes
    does (which differs from ours only by bf16 rounding and the code flips it causes), and
    the rows part where our margin is of the size of the two engines' log-prob difference."""
    from suite.bench.peer import ours_generate, vllm_agreement
    from suite.bench.rollout import bench_model, bench_prompts
    from suite.bench.vllm_peer import VllmPeer, export_model
    from suite.core.quant import QuantScheme
    from suite.embedded.engine import RolloutEngine

    model = bench_model("tiny", gain=4.0)  # the bench's model, prompts and lengths
    prompts = bench_prompts(64, 16, model.cfg.vocab_size, seed=1)
    engine = RolloutEngine(model, QuantScheme("int8"))
    ours = ours_generate(engine, prompts, 32)  # [64, 32]
    full = torch.cat([torch.tensor(prompts), ours], 1)  # [64, 48]
    peer = VllmPeer(sys.executable, str(tmp_path), export_model(model, str(tmp_path), "int8"), prompts, 32)
    try:
        theirs = peer.generate()  # [64, 32]
        tf = peer.teacher_forced(full)
    finally:
        peer.close()
    ours_lp = torch.log_softmax(engine.logits(full), -1)  # [64, 48, V]
    got = vllm_agreement(ours, ours_lp, theirs, tf)
    with torch.no_grad():
        ref_lp = torch.log_softmax(w8a8_reference(model)(full).float(), -1)  # [64, 48, V]
    ref_top = ref_lp[:, 15:-1].argmax(-1)  # [64, 32]: the float32 W8A8's pick on our prefix
    ref_match = float((ref_top == ours).float().mean())
    assert 0.8 < ref_match < 0.99  # INT8 in bf16 vs float32 does part at near ties here
    assert got["vllm_tf_match"] >= ref_match - 0.01
    assert got["ours_tf_match"] == 1.0
    # parting at near ties: the first-diff margin is of the size of the log-prob difference,
    # far below the typical margin of our picks
    top2 = ours_lp[:, 15:-1].topk(2, -1).values  # [64, 32, 2]
    typical = float((top2[..., 0] - top2[..., 1]).median())
    assert got["vllm_first_diff_margin"] <= 2 * got["vllm_lp_diff"] < typical / 4
