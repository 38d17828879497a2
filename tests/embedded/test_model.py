"""Tests of the embedded decoder: presets, names, KV-cache decoding, padding, log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from _prompts import left_padded, rand_prompts
from suite.embedded.model import (
    PRESETS,
    KVCache,
    ModelConfig,
    Transformer,
    apply_rope,
    response_logprobs,
    rope_table,
    to_hf_llama,
)

VOCAB = 80  # the character tokenizer's size


def make_model(preset: str = "tiny", seed: int = 0, gain: float = 4.0, **over) -> Transformer:
    """A seeded model whose weights are scaled up by ``gain``: with the 0.02-std init the logits
    are nearly uniform and attention nearly flat, which would make equality tests vacuous."""
    torch.manual_seed(seed)
    m = Transformer(ModelConfig(vocab_size=VOCAB, **{**PRESETS[preset], **over}))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(gain)
    return m.eval()


# ----------------------------------------------------------------------------- config and layout


def test_preset_sizes():
    counts = {}
    for name, kw in PRESETS.items():
        with torch.device("meta"):  # no memory, no init cost
            counts[name] = Transformer(ModelConfig(vocab_size=VOCAB, **kw)).num_params()
    assert 0.7e6 < counts["tiny"] < 1.3e6
    assert 2.5e6 < counts["small"] < 4e6 and PRESETS["small"]["d_model"] == 256 and PRESETS["small"]["n_layers"] == 4
    assert 10e6 < counts["base"] < 14e6
    assert 45e6 < counts["large"] < 55e6
    assert PRESETS["wide"]["d_model"] == 512
    assert "vocab_size" not in PRESETS["small"]  # it comes from the tokenizer


def test_module_names():
    m = Transformer(ModelConfig(vocab_size=VOCAB, **{**PRESETS["tiny"], "n_layers": 2}))
    names = {n for n, _ in m.named_parameters()}
    per_layer = ["attn_norm", "attn.wq", "attn.wk", "attn.wv", "attn.wo",
                 "mlp_norm", "mlp.w_gate", "mlp.w_up", "mlp.w_down"]
    want = {"tok_emb.weight", "norm.weight", "lm_head.weight"}
    want |= {f"layers.{i}.{p}.weight" for i in range(2) for p in per_layer}
    assert names == want
    assert all(mod.bias is None for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    assert m.lm_head.weight.data_ptr() != m.tok_emb.weight.data_ptr()  # untied
    assert set(m.state_dict()) == want  # rotary tables are not persistent


def test_init_scales():
    m = Transformer(ModelConfig(vocab_size=VOCAB, **PRESETS["small"]))
    std = lambda n: m.get_parameter(n).std().item()  # noqa: E731
    assert std("layers.0.attn.wq.weight") == pytest.approx(0.02, rel=0.05)
    assert std("layers.0.mlp.w_down.weight") == pytest.approx(0.02 / math.sqrt(2 * 4), rel=0.05)
    assert torch.equal(m.layers[0].attn_norm.weight, torch.ones(256))


def test_config_rejects_odd_head_split():
    with pytest.raises(ValueError, match="n_heads"):
        ModelConfig(vocab_size=VOCAB, d_model=130, n_layers=1, n_heads=4, d_ff=64, max_seq_len=16)


# ----------------------------------------------------------------------------- rotary positions


def test_rope_is_a_rotation_with_relative_dot_products():
    cos, sin = rope_table(8, 32, 10000.0)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)

    def rot(x, pos):
        return apply_rope(x.float()[None, None, None], cos[pos][None, None, None], sin[pos][None, None, None])[0, 0, 0]

    assert_close(rot(q, 5).norm(), q.float().norm())
    # <R_m q, R_n k> depends on m - n only (Su et al. 2021, Sec. 3.2).
    assert_close(rot(q, 7) @ rot(k, 3), rot(q, 14) @ rot(k, 10), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- KV cache and padding


def test_kv_cache_decode_equals_full_forward():
    """Prefill left-padded prompts of different lengths, then decode one token at a time
    (one row right-padded after its 'stop'): the logits equal the full forward everywhere."""
    m = make_model()
    prompts = rand_prompts([3, 7, 5, 1])
    tok_p, mask_p = left_padded(prompts)
    B, P, R = tok_p.shape[0], tok_p.shape[1], 6
    resp = torch.randint(3, VOCAB, (B, R), generator=torch.Generator().manual_seed(2))  # [B, R]
    resp_mask = torch.ones(B, R, dtype=torch.bool)
    resp_mask[1, 3:] = False  # row 1 "stopped" after 3 tokens: pads follow
    tokens, mask = torch.cat([tok_p, resp], 1), torch.cat([mask_p, resp_mask], 1)  # [B, P + R]

    with torch.no_grad():
        full = m(tokens, attention_mask=mask)  # [B, P + R, V]
        cache = KVCache(m.cfg, B, P + R)
        steps = [m(tokens[:, :P], attention_mask=mask[:, :P], kv_cache=cache)]
        for t in range(P, P + R):
            steps.append(m(tokens[:, t : t + 1], attention_mask=mask[:, t : t + 1], kv_cache=cache))
    decoded = torch.cat(steps, 1)  # [B, P + R, V]
    assert full.abs().max() > 2  # non-trivial logits
    assert_close(decoded, full)
    assert cache.length == P + R
    assert cache.n_valid.tolist() == mask.sum(-1).tolist()


def test_chunked_prefill_equals_full_forward():
    m = make_model()
    tokens, mask = left_padded(rand_prompts([9, 4, 6]))
    with torch.no_grad():
        full = m(tokens, attention_mask=mask)
        cache = KVCache(m.cfg, 3, tokens.shape[1])
        parts = [m(tokens[:, s : s + 4], attention_mask=mask[:, s : s + 4], kv_cache=cache) for s in range(0, 9, 4)]
    assert_close(torch.cat(parts, 1), full)


def test_left_padding_and_batch_invariance():
    """A sequence's logits do not depend on its left padding or its batch-mates."""
    m = make_model()
    a, long_mate = rand_prompts([5, 12], seed=3)
    with torch.no_grad():
        alone = m(torch.tensor([a]))[0]  # [5, V]
        tokens, mask = left_padded([a, long_mate])  # a gets 7 pads
        batched = m(tokens, attention_mask=mask)[0, -5:]  # [5, V]
    assert_close(batched, alone)


def test_default_positions_follow_the_mask():
    m = make_model()
    tokens, mask = left_padded(rand_prompts([2, 6]))
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        assert torch.equal(m(tokens, attention_mask=mask), m(tokens, positions=pos, attention_mask=mask))
        # Without a mask every token is real and positions are 0..T-1.
        assert torch.equal(m(tokens), m(tokens, positions=torch.arange(6).expand(2, 6)))


def test_all_pad_prefix_rows_stay_finite():
    m = make_model()
    tokens, mask = left_padded(rand_prompts([1, 8]))  # row 0: 7 pads, then 1 token
    with torch.no_grad():
        out = m(tokens, attention_mask=mask)
    assert torch.isfinite(out).all()


def test_cache_capacity_errors():
    m = make_model(max_seq_len=16)
    with pytest.raises(ValueError, match="max_seq_len"):
        KVCache(m.cfg, 1, 17)
    cache = KVCache(m.cfg, 1, 4)
    with pytest.raises(ValueError, match="KV cache"):
        m(torch.zeros(1, 5, dtype=torch.long), kv_cache=cache)


# ----------------------------------------------------------------------------- log-probs


def test_response_logprobs_matches_manual_softmax():
    m = make_model()
    tokens, mask = left_padded(rand_prompts([4, 6, 2]))
    tokens = torch.cat([tokens, torch.randint(3, VOCAB, (3, 5))], 1)  # [3, 11]
    mask = torch.cat([mask, torch.ones(3, 5, dtype=torch.bool)], 1)
    P = 6
    with torch.no_grad():
        logp, ent = response_logprobs(m, tokens, mask, P, temperature=0.7, with_entropy=True)
        logits = m(tokens, attention_mask=mask).double() / 0.7  # [3, 11, V]
    ref = torch.log_softmax(logits, -1)  # [3, 11, V]
    want = torch.stack([ref[b, t - 1, tokens[b, t]] for b in range(3) for t in range(P, 11)]).view(3, 5)
    assert logp.dtype == torch.float32 and logp.shape == (3, 5)
    assert_close(logp.double(), want, rtol=1e-5, atol=1e-5)
    want_ent = -(ref.exp() * ref).sum(-1)[:, P - 1 : -1]  # [3, 5]
    assert_close(ent.double(), want_ent, rtol=1e-5, atol=1e-5)
    # temperature 0 (greedy) is scored at temperature 1; no entropy unless asked.
    lp0, none = response_logprobs(m, tokens, mask, P, temperature=0.0)
    lp1, _ = response_logprobs(m, tokens, mask, P, temperature=1.0)
    assert none is None and torch.equal(lp0, lp1)


def test_response_logprobs_backpropagates_to_every_parameter():
    m = make_model(gain=1.0)
    tokens, mask = left_padded(rand_prompts([3, 5]))
    logp, _ = response_logprobs(m, tokens, mask, 2, 1.0)
    logp.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


@pytest.mark.slow  # importing transformers alone takes ~10 s on 2 shared cores
def test_same_network_as_hugging_face_llama():
    transformers = pytest.importorskip("transformers")
    m = make_model()
    kw, sd = to_hf_llama(m)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    hf.load_state_dict(sd, strict=True)
    tokens, mask = left_padded(rand_prompts([4, 9]))
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ours = m(tokens, attention_mask=mask)
        theirs = hf(input_ids=tokens, attention_mask=mask.long(), position_ids=pos).logits
    assert_close(ours[mask], theirs[mask], rtol=1e-4, atol=1e-4)
