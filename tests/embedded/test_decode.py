"""The engine's one-token decode path (suite.embedded.decode) against the model's general forward.

This is where the two implementations of the layers meet: the decode step must give the bits of
``Transformer.hidden`` + ``lm_head`` with a KV cache, and leave the same cache behind, for every
precision the engine runs."""

from __future__ import annotations

import pytest
import torch

from _prompts import left_padded, rand_prompts
from suite.core.quant import PRECISIONS, QuantScheme
from suite.embedded.decode import DecodeState
from suite.embedded.engine import RolloutEngine
from suite.embedded.model import PRESETS, KVCache, ModelConfig, Transformer

VOCAB = 80  # the character tokenizer's size


@pytest.mark.parametrize("precision,d_model,kernels", [(p, 128, "auto") for p in PRECISIONS]
                         + [("fp32", 96, "auto"), ("bf16", 128, "emulated"), ("w4a16", 128, "emulated")])
def test_decode_step_equals_the_general_forward(precision, d_model, kernels):
    """The engine's one-token decode path (suite.embedded.decode.Decoder, which
    RolloutEngine.generate runs) gives the bits of ``model.hidden`` + ``lm_head`` with a KV cache, and leaves the same cache behind: with
    left-padded prompts, rows turning into padding mid-way, and (d_model 96: head_dim 48) a
    1 / sqrt(head_dim) that is not a power of two. The caches have spare slots beyond the last
    token (native 16-bit attention reads all of them; they must add nothing)."""
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=VOCAB, **{**PRESETS["tiny"], "d_model": d_model}))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(4.0)
    e = RolloutEngine(m, QuantScheme(precision), kernels=kernels)
    tokens, mask = left_padded(rand_prompts([3, 7, 5, 1, 6]))
    B, P, R = tokens.shape[0], tokens.shape[1], 6
    g = torch.Generator().manual_seed(3)
    new = torch.randint(3, VOCAB, (R, B), generator=g)  # [R, B]
    valid = torch.ones(R, B, dtype=torch.bool)
    valid[2:, 1] = valid[4:, 3] = False  # rows 1 and 3 stop: pads follow
    general, fast = KVCache(m.cfg, B, P + R + 9, dtype=e.dtype), KVCache(m.cfg, B, P + R + 9, dtype=e.dtype)
    fast.v.fill_(float("nan"))  # uninitialised memory at its worst
    with torch.no_grad():
        for c in (general, fast):
            e.model.hidden(tokens, attention_mask=mask, kv_cache=c)
        state = DecodeState(fast)
        for t in range(R):
            h = e.model.hidden(new[t, :, None], attention_mask=valid[t, :, None], kv_cache=general)  # [B, 1, D]
            want = e.model.lm_head(h[:, 0]).float()  # [B, V]
            assert torch.equal(e.decoder(new[t], valid[t], state), want)
    n = general.length
    assert fast.length == n == P + R
    assert torch.equal(fast.k[:, :, :, :n], general.k[:, :, :, :n])
    assert torch.equal(fast.v[:, :, :, :n], general.v[:, :, :, :n])
    assert torch.equal(fast.key_valid, general.key_valid) and torch.equal(fast.n_valid, general.n_valid)
