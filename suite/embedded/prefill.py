"""The rollout engine's prompt prefill: the model's layers re-fused for a [B, T] prompt batch.

Why not ``Transformer.hidden``: the general forward rebuilds nothing per layer that it could
share, but it rotates q and k as [B, H, T, hd] transposed views (eight strided multiplies and
a ``cat`` per tensor and layer), runs each norm as many small aten calls (docs/bench.md,
"Measurements behind the code"), allocates every residual
and MLP product anew, and computes the final norm and its casts over all T positions though
sampling reads the last one. :class:`Prefill` builds positions, the rotary tables and the
keys' additive mask once for all layers, rotates q and k together on the rows of their
projection (before the head transpose, contiguous), writes K and V into the cache once, and
runs attention as one ``baddbmm`` (scale and mask), a softmax and one ``bmm`` per layer.

Every op that remains computes its elements as the general forward does (elementwise ops do
not depend on the layout; the GEMMs are the same calls on the same operands): the logits of
the last prompt position and the KV cache left behind are bit for bit those of
``model.hidden`` + ``lm_head`` (tests/embedded/test_prefill.py, every precision).
"""

from __future__ import annotations

import torch

from suite.embedded.decode import DecodeLayer, Decoder, rotate
from suite.embedded.model import KVCache, attention_blocked


class Prefill:
    """Prefill of ``decoder``'s model (the engine's copy): the same layers, norms and linears."""

    def __init__(self, decoder: Decoder):
        self.decoder = decoder

    def __call__(self, tokens: torch.Tensor, mask: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Append ``tokens [B, T]`` (``mask [B, T]`` False = pad) at slot ``cache.length``;
        returns the float32 logits [B, V] of the last position, the same numbers as
        ``lm_head(model.hidden(tokens, attention_mask=mask, kv_cache=cache)[:, -1])``."""
        d = self.decoder
        m, dtype = d.model, d.dtype
        B, T = tokens.shape
        s0, s1 = cache.length, cache.length + T
        if s1 > cache.max_len:
            raise ValueError(f"KV cache holds {cache.max_len} slots; {s0} used, {T} more asked")
        H = m.cfg.n_heads
        # positions: the cumsum rule of Transformer.hidden, continuing from the cache's count.
        pos = (cache.n_valid[:, None] + mask.long().cumsum(-1)).sub_(1).clamp_(min=0)  # [B, T]
        cache.key_valid[:, s0:s1] = mask
        cache.n_valid += mask.sum(-1)
        blocked = attention_blocked(cache.key_valid[:, :s1], s0, T)  # [B, 1, T, s1]
        # The keys' additive mask (0 = seen, -inf = blocked): the scores of masked_fill (DecodeLayer).
        bias = torch.zeros(B, H, T, s1, dtype=dtype, device=tokens.device)  # [B, H, T, s1]
        bias = bias.masked_fill_(blocked, float("-inf")).view(B * H, T, s1)  # [B * H, T, s1]
        pos = pos.view(-1)  # [B * T]
        cos, sin = d.cos.index_select(0, pos), d.sin.index_select(0, pos)  # [B * T, D]
        x = m.tok_emb.weight.index_select(0, tokens.reshape(-1))  # [B * T, D], = the embedding lookup
        hd = m.cfg.d_model // H
        qk = torch.empty(2, B * T, H * hd, dtype=dtype, device=tokens.device)  # [2, B * T, D]
        qk = (qk, qk[0], qk[1])  # the buffer and its halves (DecodeLayer.project)
        for i, layer in enumerate(d.layers):
            k_cache = cache.k[i].view(B * H, cache.max_len, hd)  # [B * H, max_len, hd]
            v_cache = cache.v[i].view(B * H, cache.max_len, hd)
            x = _layer(layer, x, B, T, s0, k_cache, v_cache, cos, sin, bias, qk)
        cache.length = s1
        last = x.view(B, T, -1)[:, -1]  # [B, D] view: the norm is per row, lm_head reads one row each
        return d.lm_head(d.norm(last)).float()  # [B, V]


def _layer(layer: DecodeLayer, x: torch.Tensor, B: int, T: int, s0: int, k_cache: torch.Tensor,
           v_cache: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
           qk: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One block over the prompt rows x [B * T, D] (updated in place and returned): the
    arithmetic of ``Block.forward`` (see DecodeLayer, whose weights and norms it runs)."""
    N, D = x.shape
    H, hd, s1 = layer.n_heads, layer.head_dim, s0 + T
    h = layer.attn_norm(x)  # [N, D]
    q_k, v = layer.project(h, qk)  # [2, N, D], [N, D]
    q_k = rotate(q_k, cos, sin, H, layer.swap).view(2, N, H, hd)  # [2, N, H, hd]
    k_new = q_k[1].view(B, T, H, hd).transpose(1, 2)  # [B, H, T, hd] view
    k_cache.view(B, H, -1, hd)[:, :, s0:s1] = k_new
    v_cache.view(B, H, -1, hd)[:, :, s0:s1] = v.view(B, T, H, hd).transpose(1, 2)  # [B, H, T, hd]
    q = q_k[0].view(B, T, H, hd).transpose(1, 2).reshape(B * H, T, hd)  # [B * H, T, hd], a copy
    y = layer.attend(q, k_cache[:, :s1], v_cache[:, :s1], bias)  # [B * H, T, hd]
    y = y.view(B, H, T, hd).transpose(1, 2).reshape(N, D)  # [N, D]
    return layer.mlp(x.add_(layer.wo(y)))
