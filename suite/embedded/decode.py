"""The rollout engine's one-token decode step: the model's layers, re-fused for decode batches.

Why not ``Transformer.hidden`` for each new token: at decode batch sizes on a CPU every aten
call costs a few microseconds of dispatch whatever its size, and the general forward spends
many of them per token on [B, T, ...] views, masks rebuilt per layer, rotary slices and no-op
casts; :class:`Decoder` spends far fewer (more in bf16, whose norms and softmax really cast;
docs/bench.md, "Measurements behind the code").
The per-step work (positions, rotary table, mask) is done once, the layers run on [B, D] rows
with in-place ops, and every op that remains computes its elements exactly as the general
forward does: tests/embedded/test_decode.py checks the logits and the KV cache left behind bit
for bit against ``model.hidden`` + ``lm_head`` for every precision.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from suite.embedded.model import Block, KVCache, RMSNorm, Transformer
from suite.embedded.qlinear import bf16_matmul_emulated


def native_extension():
    """The C++ layer loop's module (built on the first call: tens of seconds), or None where it
    cannot be built."""
    from suite.embedded import cext

    return cext.build("suite_decode_layers", "decode_layers.cpp", python_module=True,
                      what="the engine's decode step runs its Python layer loop (same numbers, slower)")


class Decoder:
    """One decode step of ``model`` (the engine's copy, computing in ``dtype``)."""

    def __init__(self, model: Transformer, dtype: torch.dtype):
        self.model, self.dtype = model, dtype
        self.layers = [DecodeLayer(block, dtype) for block in model.layers]
        self.norm, self.lm_head = Norm(model.norm, dtype), linear_fn(model.lm_head)
        self.cos, self.sin = rope_rows(model, dtype)
        self.native = NativeLayers.build(self.layers)  # the layer loop in C++, where it applies

    @property
    def cpp_loop(self) -> bool:
        """Whether the next step runs the layer loop in C++ (NativeLayers)."""
        return self.native is not None and self.native.applies()

    def __call__(self, tok: torch.Tensor, valid: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """One decode step: float32 logits [B, V] of ``tok [B]`` appended at slot ``cache.length``
        (``valid [B]`` False = pad), the same numbers as ``model.hidden`` + ``lm_head``."""
        m, cache = self.model, state.cache
        s0 = cache.length
        # positions: the cumsum rule of Transformer.hidden for one token, n_valid + valid - 1 >= 0.
        v = valid.long()  # [B]
        pos = (cache.n_valid + v).sub_(1).clamp_(min=0)  # [B]
        cache.key_valid[:, s0] = valid
        cache.n_valid.add_(v)
        x = m.tok_emb.weight.index_select(0, tok)  # [B, D], = the embedding lookup
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)  # [B, D]
        bias = state.bias[..., : s0 + 1]  # [B * H, 1, S] view
        if self.cpp_loop:
            x = self.native(x, s0, cos, sin, bias, state)
        else:
            for layer, (k, v) in zip(self.layers, state.kv):
                x = layer(x, k, v, s0, cos, sin, bias, state)
        cache.length = s0 + 1
        # The query saw its own slot; later queries must not see it if it is padding.
        state.bias4[:, :, 0, s0].masked_fill_(valid.logical_not().unsqueeze_(1), float("-inf"))
        return self.lm_head(self.norm(x)).float()  # [B, V]


def rope_rows(model: Transformer, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-width rotary tables cos, sin [max_seq_len, D] in ``dtype`` for ``x * cos + swap(x) * sin``
    on [M, D] rows of all heads, ``swap`` exchanging each head's halves: x1 cos - x2 sin is
    x1 cos + x2 (-sin) bit for bit (negation and the cast commute exactly), so apply_rope's values
    are reproduced by two plain multiplies and an add, with one table lookup per call."""
    c, s = model.rope_cos.to(dtype), model.rope_sin.to(dtype)  # [S, hd/2]
    H = model.cfg.n_heads
    return torch.cat([c, c], -1).repeat(1, H), torch.cat([s.neg(), s], -1).repeat(1, H)  # [S, D] each


def rotate(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, swap: torch.Tensor) -> torch.Tensor:
    """apply_rope on rows: qk [2, M, D] (q and k), cos, sin [M, D] (rope_rows) -> [2, M, D]."""
    two, M, D = qk.shape
    hd = D // n_heads
    rot = qk.view(two, M, n_heads, 2, hd // 2).index_select(3, swap).view(two, M, D)  # halves exchanged
    return (qk * cos).add_(rot.mul_(sin))  # [2, M, D]


class DecodeState:
    """Per-``generate`` buffers of the decode loop, allocated once per call: the keys' additive
    mask (0 = seen, -inf = padding), kept up to date slot by slot rather than rebuilt per
    step and layer; the q / k projections' buffer (DecodeLayer.project); per-layer views of
    the KV cache as [B * H, max_len, hd] batches; for native 16-bit attention (DecodeLayer) the
    probabilities' buffer over all max_len slots, zero beyond the slots seen, and the cache's
    unfilled V slots zeroed (0 * V must be 0, not NaN from uninitialised memory). ``dtype``: the
    layers' compute dtype, where the cache holds it wider (RolloutEngine.cache_dtype)."""

    def __init__(self, cache: KVCache, dtype: torch.dtype | None = None):
        L, B, H, S, hd = cache.k.shape
        self.cache = cache
        dtype = cache.k.dtype if dtype is None else dtype  # the layers' (RolloutEngine.cache_dtype may be wider)
        self.bias4 = torch.zeros(B, H, 1, S, dtype=dtype, device=cache.k.device)  # [B, H, 1, S]
        filled = cache.length  # the prefilled prompt slots
        self.bias4[:, :, 0, :filled].masked_fill_(~cache.key_valid[:, None, :filled], float("-inf"))
        self.bias = self.bias4.view(B * H, 1, S)
        self.kv = [(cache.k[i].view(B * H, S, hd), cache.v[i].view(B * H, S, hd)) for i in range(L)]
        self.kv_flat = [t for kv in self.kv for t in kv]  # the same views, for NativeLayers
        qk = torch.empty(2, B, H * hd, dtype=dtype, device=cache.k.device)  # [2, B, D]
        self.qk = (qk, qk[0], qk[1])  # the buffer and its [B, D] halves
        self.p = torch.zeros(B * H, 1, S, dtype=dtype, device=cache.k.device)  # [B * H, 1, S]
        cache.v[:, :, :, filled:].zero_()


class NativeLayers:
    """The layer loop of a decode step as one call into C++ (csrc/decode_layers.cpp): the same
    aten (and fused W8A8) calls with the same arguments as :class:`DecodeLayer`, so the same
    bits, without the Python around them (a few microseconds per call at decode batch sizes).
    W8A8 linears that read one input run as one integer GEMM (q|k|v and gate|up:
    qlinear.share_operands), whose exact sums are each linear's: the same bits again.
    It applies where the block linears are all plain bias-free ``nn.Linear`` (fp32, bf16) or
    all fused W8A8 ``Int8Linear`` (int8 on CPU), with the float32, the native 16-bit or the
    emulated bf16 attention; the other engines (emulated bf16 linears, fp8, w4a16's dequantizing
    linears where not plain) keep the Python loop. :func:`set_native_loop` switches it off (benchmarks)."""

    def __init__(self, ext, layers: list[DecodeLayer], int8: bool, weights: list[torch.Tensor]):
        self.ext, self.int8, self.weights = ext, int8, weights  # weights: layer_weights()
        self.int8_mods = [m for layer in layers for m in layer.modules] if int8 else []
        first = layers[0]
        self.args = (first.swap, first.n_heads, first.scale, first.scale_exact, first.full_att, first.emu_att,
                     first.attn_norm.f32, int8)

    @staticmethod
    def layer_weights(layers: list[DecodeLayer], int8: bool) -> list[torch.Tensor] | None:
        """The C++ loop's per-layer tensors (csrc/decode_layers.cpp, kNorms), views a sync writes
        through; None where the int8 linears of a group cannot share one GEMM."""
        from suite.embedded.qlinear import share_operands

        weights = []
        for layer in layers:
            weights += [layer.attn_norm.norm.weight, layer.attn_norm.n, layer.attn_norm.eps,
                        layer.mlp_norm.norm.weight, layer.mlp_norm.n, layer.mlp_norm.eps]
            if not int8:
                weights += [m.weight.t() for m in layer.modules]
                continue
            # one GEMM per input: q|k|v, wo, gate|up, w_down
            wq, wk, wv, wo, w_gate, w_up, w_down = layer.modules
            for group in ((wq, wk, wv), (wo,), (w_gate, w_up), (w_down,)):
                shared = share_operands(list(group)) if len(group) > 1 else (group[0].gemm_weight(), group[0].scale)
                if shared is None:
                    return None
                weights += shared
        return weights

    @classmethod
    def build(cls, layers: list[DecodeLayer]) -> "NativeLayers | None":
        from suite.embedded.qlinear import Int8Linear

        if not layers:
            return None
        mods = [m for layer in layers for m in layer.modules]
        plain = all(type(m) is nn.Linear and m.bias is None for m in mods)
        int8 = all(isinstance(m, Int8Linear) and m.fused for m in mods)
        if not (plain or int8) or not all(layer.fast_att or layer.full_att or layer.emu_att for layer in layers):
            return None
        if len({(layer.n_heads, layer.scale, layer.full_att, layer.emu_att, layer.attn_norm.f32)
                for layer in layers}) != 1:
            return None
        ext = native_extension()
        weights = cls.layer_weights(layers, int8) if ext is not None else None
        return cls(ext, layers, int8, weights) if weights is not None else None

    def applies(self) -> bool:
        """False while the int8 linears are switched off their fused path (qlinear.set_int8_fused)."""
        return all(m.fused for m in self.int8_mods)

    def __call__(self, x: torch.Tensor, s0: int, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
                 state: DecodeState) -> torch.Tensor:
        qk, q_out, k_out = state.qk
        x, bad = self.ext.layers(x, self.weights, state.kv_flat, s0, cos, sin, bias, qk, q_out, k_out, state.p,
                                 *self.args)
        if bad is not None:  # a non-finite activation: the int8 quantizer's own error names it
            from suite.core.quant import quantize_int8_per_token

            quantize_int8_per_token(bad.float())
        return x


def set_native_loop(engine, on: bool) -> None:
    """Run ``engine``'s decode steps through :class:`NativeLayers` (``on``, where it applies)
    or through the Python layer loop: the same numbers, for measuring one against the other."""
    d = engine.decoder
    d.native = NativeLayers.build(d.layers) if on else None
    if on and d.native is None:
        raise ValueError("set_native_loop(on=True): this engine's layers are not plain linears with float32 or "
                         "native 16-bit attention, or the extension did not build")


class Norm:
    """``RMSNorm`` as a function of rows x [M, D], with ``mean`` written out as the ``sum`` and
    ``div_`` it runs (aten's CPU ``mean``), ``pow(2)`` as the ``x * x`` it computes, the scalars
    as ready 0-dim tensors, and in float32 without its two no-op casts: a few aten calls instead
    of ``RMSNorm``'s many (two more in 16 bit, whose two casts are real; docs/bench.md,
    "Measurements behind the code"), the same bits (tests/embedded/test_decode.py)."""

    def __init__(self, norm: RMSNorm, dtype: torch.dtype):
        self.norm, self.f32 = norm, dtype == torch.float32
        w = norm.weight
        self.n = torch.tensor(float(w.shape[0]), device=w.device)  # D, float32
        self.eps = torch.tensor(norm.eps, device=w.device)  # float32, as the scalar the kernel uses

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xf = x if self.f32 else x.float()
        r = (xf * xf).sum(-1, keepdim=True).div_(self.n).add_(self.eps).rsqrt_()  # [M, 1]
        if self.f32:
            return (x * r).mul_(self.norm.weight)
        return xf.mul_(r).to(x.dtype).mul_(self.norm.weight)  # xf is a fresh float32 copy


def linear_fn(mod: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``mod`` as a function of x [M, K]: a plain bias-free ``nn.Linear`` becomes one ``mm``
    with its weight's transposed view (taken once; a sync writes into the same storage), the
    very call ``F.linear`` reaches after its ``linear -> t -> matmul`` dispatches."""
    if type(mod) is nn.Linear and mod.bias is None:
        wt = mod.weight.t()  # [K, N] view
        return lambda x: torch.mm(x, wt)
    return mod


class DecodeLayer:
    """One block of the engine's copy for a one-token decode step on rows x [B, D].

    The same arithmetic as ``Block.forward`` with T = 1, fewer dispatches: q and k are written
    by ``mm(..., out=)`` into one [2, B, D] buffer (plain linears; else stacked) and rotated
    together (rotate); the key mask enters as an additive 0 / -inf bias of a
    ``baddbmm`` (x + 0 = x and x + -inf = -inf: the same scores as ``masked_fill``) that also
    applies the 1 / sqrt(head_dim) scale when it is a power of two (then exact in any order);
    residual adds and the gating product are in place. :class:`~suite.embedded.prefill.Prefill`
    runs the same layers over a prompt.
    """

    def __init__(self, block: Block, dtype: torch.dtype):
        a = block.attn
        self.attn_norm, self.mlp_norm = Norm(block.attn_norm, dtype), Norm(block.mlp_norm, dtype)
        self.n_heads, self.head_dim = a.n_heads, a.head_dim
        self.wq, self.wk, self.wv, self.wo = (linear_fn(a.wq), linear_fn(a.wk), linear_fn(a.wv),
                                              linear_fn(a.wo))
        self.w_gate, self.w_up, self.w_down = (linear_fn(block.mlp.w_gate), linear_fn(block.mlp.w_up),
                                               linear_fn(block.mlp.w_down))
        plain = type(a.wq) is nn.Linear and type(a.wk) is nn.Linear
        self.qk_t = (a.wq.weight.t(), a.wk.weight.t()) if plain else None  # [D, D] views
        self.modules = (a.wq, a.wk, a.wv, a.wo, block.mlp.w_gate, block.mlp.w_up, block.mlp.w_down)  # NativeLayers
        self.matmul = a.matmul  # torch.matmul, or the engine's bf16 emulation
        self.dtype = dtype  # the attention probabilities' (a cache's dtype may be wider: RolloutEngine.cache_dtype)
        self.fast_att = dtype == torch.float32 and self.matmul is torch.matmul
        self.full_att = dtype != torch.float32 and self.matmul is torch.matmul
        self.emu_att = dtype == torch.bfloat16 and self.matmul is bf16_matmul_emulated  # CPUs without bf16 GEMMs
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.scale_exact = math.frexp(self.scale)[0] == 0.5  # a power of two
        self.swap = torch.tensor([1, 0], device=block.attn_norm.weight.device)  # rotate's index

    def __call__(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, s0: int,
                 cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """x [B, D] (updated in place and returned); k_cache, v_cache [B * H, max_len, hd] views
        of this layer's cache; the new token goes to slot s0; cos, sin [B, D] (rope_rows); bias
        [B * H, 1, s0 + 1]."""
        B, D = x.shape
        H, hd, S = self.n_heads, self.head_dim, s0 + 1
        h = self.attn_norm(x)  # [B, D]
        qk, v = self.project(h, state.qk)  # [2, B, D], [B, D]
        qk = rotate(qk, cos, sin, H, self.swap)  # [2, B, D]
        k_cache.select(1, s0).copy_(qk[1].view(B * H, hd))
        v_cache.select(1, s0).copy_(v.view(B * H, hd))
        q = qk[0].view(B * H, 1, hd)
        if self.full_att:
            # Native 16-bit bmm (oneDNN) copies any operand whose batches are not dense, as
            # the [:, :S] views of the cache are: it reads the whole cache instead. The scores
            # of slots >= S are dropped before the softmax, and the probabilities' buffer is
            # zero there (V too: DecodeState), so those slots add exact zeros to each output.
            # The bits of the sliced call (tests/embedded/test_decode.py).
            att = torch.bmm(q, k_cache.transpose(1, 2))[..., :S] * self.scale + bias  # [B * H, 1, S]
            p = state.p
            p[..., :S] = torch.softmax(att, -1, dtype=torch.float32)  # cast to the cache's dtype
            y = torch.bmm(p, v_cache)  # [B * H, 1, hd]
        else:
            y = self.attend(q, k_cache[:, :S], v_cache[:, :S], bias)  # [B * H, 1, hd]
        x = x.add_(self.wo(y.view(B, D)))
        return self.mlp(x)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T * scale + bias) v for q [N, T, hd], k, v [N, S, hd] (views of the cache),
        bias [N, T, S]: ``Attention.forward``'s arithmetic, as decode and prefill run it."""
        kt = k.transpose(1, 2)  # [N, hd, S] view
        if self.fast_att:
            if self.scale_exact:
                att = torch.baddbmm(bias, q, kt, alpha=self.scale)  # [N, T, S]
            else:
                att = torch.baddbmm(bias, q, kt).mul_(self.scale)
            return torch.bmm(torch.softmax(att, -1), v)  # [N, T, hd]
        att = self.matmul(q, kt) * self.scale + bias  # [N, T, S]
        att = torch.softmax(att, -1, dtype=torch.float32).to(self.dtype)
        return self.matmul(att, v)  # [N, T, hd]

    def project(self, h: torch.Tensor, qk: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """h [M, D] -> (q and k [2, M, D], v [M, D]); plain linears write q and k with
        ``mm(..., out=)`` into ``qk``: a [2, M, D] buffer and its two [M, D] halves (views taken
        once per call of generate, not per layer)."""
        if self.qk_t is not None:
            torch.mm(h, self.qk_t[0], out=qk[1])
            torch.mm(h, self.qk_t[1], out=qk[2])
            return qk[0], self.wv(h)
        return torch.stack([self.wq(h), self.wk(h)]), self.wv(h)  # [2, M, D], [M, D]

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """x + w_down(silu(w_gate h) * w_up h) with h = mlp_norm(x), x [M, D] updated in place."""
        h = self.mlp_norm(x)
        g = self.w_gate(h)
        return x.add_(self.w_down(F.silu(g, inplace=True).mul_(self.w_up(h))))
