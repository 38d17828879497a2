"""The engine's prompt prefill (suite.embedded.prefill) against the model's general forward.

As for the decode step (test_decode.py): the prefill must give the bits of ``model.hidden`` +
``lm_head`` at the last prompt position and leave the same KV cache behind, for every precision
the engine runs, with left padding, and when a second chunk is appended to a filled cache."""

from __future__ import annotations

import pytest
import torch

from _prompts import left_padded, rand_prompts, same_values
from suite.core.quant import PRECISIONS, QuantScheme
from suite.embedded.engine import RolloutEngine
from suite.embedded.model import PRESETS, KVCache, ModelConfig, Transformer

VOCAB = 80  # the character tokenizer's size


def _engine(precision: str, d_model: int, kernels: str = "auto") -> RolloutEngine:
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=VOCAB, **{**PRESETS["tiny"], "d_model": d_model}))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(4.0)  # sharper attention and logits than the 0.02 init: more bits at stake
    return RolloutEngine(m, QuantScheme(precision), kernels=kernels)


@pytest.mark.parametrize("precision,d_model,kernels",
                         [(p, 128, "auto") for p in PRECISIONS]
                         + [("bf16", 128, "emulated"), ("w4a16", 128, "emulated"), ("fp32", 96, "auto")])
def test_prefill_equals_the_general_forward(precision, d_model, kernels):
    """Left-padded prompts (one of a single token), then a second left-padded chunk appended
    to the filled cache; d_model 96 (head_dim 48) has a 1 / sqrt(head_dim) that is not a
    power of two. Logits and cache bit for bit as ``model.hidden`` + ``lm_head``."""
    e = _engine(precision, d_model, kernels)
    chunks = [left_padded(rand_prompts([3, 7, 5, 1, 6])), left_padded(rand_prompts([2, 4, 1, 4, 3], seed=2))]
    B = 5
    S = sum(t.shape[1] for t, _ in chunks)
    general, fast = KVCache(e.cfg, B, S, dtype=e.dtype), KVCache(e.cfg, B, S, dtype=e.cache_dtype)
    with torch.no_grad():
        for tokens, mask in chunks:
            h = e.model.hidden(tokens, attention_mask=mask, kv_cache=general)  # [B, T, D]
            want = e.model.lm_head(h[:, -1]).float()  # [B, V]
            got = e.prefill(tokens, mask, fast)
            assert got.dtype == torch.float32 and torch.equal(got, want)
            same_values(fast, general)


def test_prefill_rejects_a_full_cache():
    e = _engine("fp32", 128)
    tokens, mask = left_padded(rand_prompts([3, 4]))
    with pytest.raises(ValueError, match="KV cache holds 3 slots"):
        e.prefill(tokens, mask, KVCache(e.cfg, 2, 3))


@pytest.mark.parametrize("precision,kernels", [("fp32", "auto"), ("bf16", "auto"), ("int8", "auto"),
                                               ("bf16", "emulated"), ("int8", "emulated")])
def test_generate_with_shared_prefixes_equals_the_general_forward(precision, kernels):
    """generate's prefill of the distinct prompts, fanned out to their copies (prefix sharing),
    then greedy decoding, against the same schedule through the general forward (the distinct
    prompts prefilled by ``model.hidden``, the cache fanned out, one ``model.hidden`` per
    token): the same tokens and behaviour log-probs, bit for bit. Emulated bf16 attention keeps its
    cache in float32 (RolloutEngine.cache_dtype); the reference's cache is bf16."""
    e = _engine(precision, 128, kernels)
    base = rand_prompts([3, 6, 2], seed=4)
    prompts = [base[0], base[1], base[0], base[2], base[1], base[0]]
    ro = e.generate(prompts, max_new_tokens=5, temperature=0.0, top_p=1.0, stop_id=-1, pad_id=0,
                    generator=torch.Generator().manual_seed(0))
    P, B = ro.response_start, len(prompts)
    rep, src = torch.tensor([0, 1, 3]), torch.tensor([0, 1, 0, 2, 1, 0])  # distinct rows; row -> distinct id
    cache = KVCache(e.cfg, B, ro.tokens.shape[1], dtype=e.dtype)
    with torch.no_grad():
        h = e.model.hidden(ro.tokens[rep, :P], attention_mask=ro.attention_mask[rep, :P],
                           kv_cache=cache.rows(3))  # [3, P, D]
        logits = [e.model.lm_head(h[:, -1]).float()[src]]  # [B, V] each
        cache.gather_rows(src, P)
        for t in range(ro.tokens.shape[1] - P - 1):
            col = P + t
            h = e.model.hidden(ro.tokens[:, col, None], attention_mask=ro.attention_mask[:, col, None],
                               kv_cache=cache)  # [B, 1, D]
            logits.append(e.model.lm_head(h[:, 0]).float())
    logits = torch.stack(logits, 1)  # [B, R, V]
    want = torch.log_softmax(logits, -1).gather(-1, ro.tokens[:, P:, None]).squeeze(-1)  # [B, R]
    assert torch.equal(ro.tokens[:, P:], logits.argmax(-1))
    assert torch.equal(ro.behav_logp, want)
