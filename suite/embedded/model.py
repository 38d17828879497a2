"""A small Llama-style decoder, in reading order: config, norm, rotary positions, attention
with a KV cache, SwiGLU MLP, block, model, and the log-prob helper the trainer uses.

Architecture as Llama (Touvron et al. 2023, arXiv 2302.13971): pre-norm RMSNorm (Zhang &
Sennrich 2019), rotary position embeddings (Su et al. 2021, arXiv 2104.09864) in the
"rotate half" layout of Hugging Face's ``LlamaForCausalLM``, SwiGLU MLP (Shazeer 2020,
arXiv 2002.05202), bias-free linears, untied ``lm_head``. The weights map one to one onto
``LlamaForCausalLM`` (``wq`` -> ``q_proj``, ``attn_norm`` -> ``input_layernorm``, ...), so
the same model can be run by Hugging Face ``generate`` for a side-by-side benchmark.
Written in the spirit of nanoGPT's ``model.py`` (Karpathy).

Sequences are left-padded prompts followed by right-padded responses
(docs/architecture.md): ``positions = attention_mask.cumsum(-1) - 1`` clamped at 0, so a
left-padded prompt gets the same rotary positions as an unpadded one, and padded keys are
masked out, so a sequence's logits never depend on its padding or its batch-mates.

Attention is written with plain matmuls: on the 2-core CPUs this suite targets,
``scaled_dot_product_attention`` was slower than two matmuls, both with one query token (suite bench peer)
and in a training forward + backward with a padding mask (docs/bench.md, "Measurements behind the code").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------- config


@dataclass
class ModelConfig:
    vocab_size: int  # number of token ids (the tokenizer's vocab_size)
    d_model: int  # residual stream width
    n_layers: int  # number of transformer blocks
    n_heads: int  # attention heads; head_dim = d_model // n_heads
    d_ff: int  # SwiGLU hidden width
    max_seq_len: int  # longest sequence (prompt + response, tokens) the rotary table covers
    rope_theta: float = 10000.0  # rotary base (Llama 1/2)
    norm_eps: float = 1e-5  # RMSNorm epsilon

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"d_model={self.d_model} must split into n_heads={self.n_heads} heads of even size"
            )


# Size presets: every ModelConfig field except vocab_size (it comes from the tokenizer):
#   ModelConfig(vocab_size=tokenizer.vocab_size, **PRESETS["small"]).
# Parameter counts are for the 80-symbol character vocabulary. d_ff is 2.7-3x d_model (Llama:
# 8/3), a multiple of 64; head_dim 64 throughout.
PRESETS: dict[str, dict] = {
    # 0.87M: the default of `suite run` (a fresh run, warm start included, fits 5 CPU minutes) and the tests'.
    "tiny": dict(d_model=128, n_layers=4, n_heads=2, d_ff=384, max_seq_len=256),
    # 3.25M: a strong warm start does not fit 5 CPU minutes (docs/bench.md, "Measurements behind the code").
    "small": dict(d_model=256, n_layers=4, n_heads=4, d_ff=704, max_seq_len=256),
    # 11.6M
    "base": dict(d_model=384, n_layers=6, n_heads=6, d_ff=1152, max_seq_len=256),
    # 49.7M
    "large": dict(d_model=640, n_layers=10, n_heads=10, d_ff=1728, max_seq_len=256),
    # 13.7M in few wide layers: the INT8 speed benchmark (W8A8 pays off only on wide layers on
    # CPUs with VNNI: suite bench rollout; docs/bench.md, "Measurements behind the code").
    "wide": dict(d_model=512, n_layers=4, n_heads=8, d_ff=1536, max_seq_len=256),
}


# ----------------------------------------------------------------------------- norm


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (Zhang & Sennrich 2019; Llama).

    Normalises in float32 and casts back before the gain, as Hugging Face's
    ``LlamaRMSNorm``, so a bf16 model keeps float32 statistics.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


# ----------------------------------------------------------------------------- rotary positions


def rope_table(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_seq_len, head_dim // 2] of RoPE (Su et al. 2021, Sec. 3.2): pair i of a
    head rotates by the angle ``pos * theta ** (-2i / head_dim)``."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [hd/2]
    angles = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inv_freq  # [S, hd/2]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, H, T, hd]`` by ``cos, sin [B, 1, T, hd/2]``.

    "Rotate half" layout (GPT-NeoX, Hugging Face Llama): the pairs are (i, i + hd/2), not
    interleaved, so weights are interchangeable with ``LlamaForCausalLM``.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # [B, H, T, hd/2] each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)  # [B, H, T, hd]


# ----------------------------------------------------------------------------- KV cache


class KVCache:
    """Preallocated keys and values for incremental decoding: no per-step allocation and no
    ``torch.cat`` growth; each forward writes its T new slots and attends to slots [0, end).

    ``key_valid [B, max_len]`` marks real (non-pad) tokens; ``n_valid [B]`` counts them, so the
    next token's rotary position is ``n_valid`` (the cumsum rule of the full forward).
    """

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        if max_len > cfg.max_seq_len:
            raise ValueError(f"KV cache of {max_len} slots > max_seq_len {cfg.max_seq_len}")
        hd = cfg.d_model // cfg.n_heads
        shape = (cfg.n_layers, batch_size, cfg.n_heads, max_len, hd)  # [L, B, H, S, hd]
        # empty, not zeros: a slot is always written before it is read.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.key_valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)  # [B, S]
        self.n_valid = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]
        self.length = 0  # slots filled so far
        self.max_len = max_len

    def reset(self) -> None:
        self.key_valid.zero_()
        self.n_valid.zero_()
        self.length = 0

    def rows(self, n: int) -> "KVCache":
        """A cache over the first ``n`` rows that shares this one's storage (writes go through)."""
        view = KVCache.__new__(KVCache)
        view.k, view.v = self.k[:, :n], self.v[:, :n]  # [L, n, H, S, hd] views
        view.key_valid, view.n_valid = self.key_valid[:n], self.n_valid[:n]
        view.length, view.max_len = self.length, self.max_len
        return view

    def gather_rows(self, index: torch.Tensor, length: int) -> None:
        """Row i becomes a copy of row ``index[i]`` over slots [0, length): prefix sharing, so a
        prompt repeated G times (a GRPO group) is prefilled once (vLLM's prefix caching)."""
        # The right-hand sides are gathered copies, so overlapping rows are read before written.
        self.k[:, :, :, :length] = self.k[:, index, :, :length]  # [L, B, H, length, hd]
        self.v[:, :, :, :length] = self.v[:, index, :, :length]
        self.key_valid[:, :length] = self.key_valid[index, :length]  # [B, length]
        self.n_valid.copy_(self.n_valid[index])  # [B]
        self.length = length


def attention_blocked(key_valid: torch.Tensor, q_start: int, n_queries: int) -> torch.Tensor:
    """Which keys each query must NOT see: ``[B, 1, T, S]`` bool, True = masked out.

    Query t sits in slot ``q_start + t`` and sees the valid keys at or before its own slot
    (causal), and always itself, so a query on a pad slot has a finite softmax. Because
    every query sees the same keys whether it is computed in a full forward or one step at a
    time from the cache, the two give the same logits at every position.
    """
    n_keys = key_valid.shape[-1]
    dev = key_valid.device
    q_slot = torch.arange(q_start, q_start + n_queries, device=dev)[:, None]  # [T, 1]
    k_slot = torch.arange(n_keys, device=dev)[None, :]  # [1, S]
    seen = (key_valid[:, None, :] & (k_slot <= q_slot)) | (k_slot == q_slot)  # [B, T, S]
    return ~seen[:, None]  # [B, 1, T, S]


# ----------------------------------------------------------------------------- attention


class Attention(nn.Module):
    """Causal multi-head self-attention with rotary positions and an optional KV cache."""

    # The two attention matmuls; the rollout engine may swap in another implementation with
    # the same numerics (a bf16 matmul emulated in float32 on CPUs without bf16 kernels).
    matmul = staticmethod(torch.matmul)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, blocked: torch.Tensor,
                kv_cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, D = x.shape
        H, hd = self.n_heads, self.head_dim
        q = self.wq(x).view(B, T, H, hd).transpose(1, 2)  # [B, H, T, hd]
        k = self.wk(x).view(B, T, H, hd).transpose(1, 2)  # [B, H, T, hd]
        v = self.wv(x).view(B, T, H, hd).transpose(1, 2)  # [B, H, T, hd]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv_cache is not None:
            s0, s1 = kv_cache.length, kv_cache.length + T
            kv_cache.k[layer, :, :, s0:s1] = k
            kv_cache.v[layer, :, :, s0:s1] = v
            k = kv_cache.k[layer, :, :, :s1]  # [B, H, S, hd], a view of the cache
            v = kv_cache.v[layer, :, :, :s1]  # [B, H, S, hd]
        att = self.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # [B, H, T, S]
        att = att.masked_fill(blocked, float("-inf"))
        # softmax statistics in float32 also for a bf16 model (as Hugging Face Llama).
        att = torch.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)  # [B, H, T, S], q's: a cache may be wider
        y = self.matmul(att, v)  # [B, H, T, hd]
        y = y.transpose(1, 2).reshape(B, T, D)  # [B, T, D]
        return self.wo(y)


# ----------------------------------------------------------------------------- MLP


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): ``w_down(silu(w_gate x) * w_up x)``, as Llama."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w_down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


# ----------------------------------------------------------------------------- block


class Block(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, blocked, kv_cache=None, layer=0):
        x = x + self.attn(self.attn_norm(x), cos, sin, blocked, kv_cache, layer)
        return x + self.mlp(self.mlp_norm(x))


# ----------------------------------------------------------------------------- model


class Transformer(nn.Module):
    """Decoder-only language model: ``tok_emb -> layers -> norm -> lm_head``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_table(cfg.d_model // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        # Not persistent: derived from the config, so it stays out of checkpoints.
        self.register_buffer("rope_cos", cos, persistent=False)  # [max_seq_len, hd/2]
        self.register_buffer("rope_sin", sin, persistent=False)  # [max_seq_len, hd/2]
        self.apply(self._init_weights)
        # GPT-2 / nanoGPT: projections that write into the residual stream get
        # std 0.02 / sqrt(2 * n_layers), so the stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith(("attn.wo.weight", "mlp.w_down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
               attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        """Final-normed hidden states ``[B, T, D]`` (``logits = lm_head(hidden)``).

        tokens [B, T] long; attention_mask [B, T] bool (False = pad) or None (all real);
        positions [B, T] or None (then ``cumsum(mask) - 1`` clamped at 0, continuing from the
        cache's count). With ``kv_cache`` the T tokens are appended at slot ``kv_cache.length``
        and attend to everything cached before them.
        """
        B, T = tokens.shape
        if attention_mask is None:
            attention_mask = torch.ones(B, T, dtype=torch.bool, device=tokens.device)  # [B, T]
        attention_mask = attention_mask.bool()
        if kv_cache is None:
            if positions is None:
                positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, T]
            blocked = attention_blocked(attention_mask, 0, T)  # [B, 1, T, T]
        else:
            s0 = kv_cache.length
            if s0 + T > kv_cache.max_len:
                raise ValueError(f"KV cache holds {kv_cache.max_len} slots; {s0} used, {T} more asked")
            if positions is None:
                positions = (kv_cache.n_valid[:, None] + attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, T]
            kv_cache.key_valid[:, s0 : s0 + T] = attention_mask
            kv_cache.n_valid += attention_mask.sum(-1)
            blocked = attention_blocked(kv_cache.key_valid[:, : s0 + T], s0, T)  # [B, 1, T, S]
        if T > self.cfg.max_seq_len:  # (a KV cache is never longer than max_seq_len)
            raise ValueError(f"{T} tokens > max_seq_len {self.cfg.max_seq_len}")
        x = self.tok_emb(tokens)  # [B, T, D]
        cos = self.rope_cos[positions].to(x.dtype)[:, None]  # [B, 1, T, hd/2]
        sin = self.rope_sin[positions].to(x.dtype)[:, None]  # [B, 1, T, hd/2]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, blocked, kv_cache, i)
        if kv_cache is not None:
            kv_cache.length += T
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        """Logits ``[B, T, V]`` (in the model's dtype); arguments as :meth:`hidden`."""
        return self.lm_head(self.hidden(tokens, positions, attention_mask, kv_cache))


# ----------------------------------------------------------------------------- log-probs


def response_logprobs(model: nn.Module, tokens: torch.Tensor, attention_mask: torch.Tensor,
                      response_start: int, temperature: float, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the response tokens ``tokens[:, response_start:]`` under
    ``softmax(logits / temperature)`` (verl's convention, docs/architecture.md), and optionally
    the entropy of that distribution at each response position.

    tokens, attention_mask [B, P + R] -> (logp [B, R] float32, entropy [B, R] float32 | None).
    ``temperature == 0`` (greedy decoding) is scored at temperature 1, as the rollout engine
    does. Only ``model(tokens, attention_mask=...)`` is called, so any callable with the
    Transformer's forward signature works (e.g. a ``functional_call`` wrapper).
    """
    t = temperature if temperature > 0 else 1.0
    logits = model(tokens, attention_mask=attention_mask)  # [B, P + R, V]
    # The logit at position i predicts token i + 1.
    logits = logits[:, response_start - 1 : -1].float() / t  # [B, R, V]
    logp_all = torch.log_softmax(logits, dim=-1)  # [B, R, V]
    logp = logp_all.gather(-1, tokens[:, response_start:, None]).squeeze(-1)  # [B, R]
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, R]
    return logp, entropy


# ----------------------------------------------------------------------------- Hugging Face mapping

_HF_NAMES = {
    "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
    "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
    "attn.wo": "self_attn.o_proj", "mlp.w_gate": "mlp.gate_proj", "mlp.w_up": "mlp.up_proj",
    "mlp.w_down": "mlp.down_proj", "tok_emb": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head",
}


def to_hf_llama(model: Transformer) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(LlamaConfig kwargs, state_dict)`` of the same network as Hugging Face's
    ``LlamaForCausalLM``, for side-by-side benchmarks against ``generate`` (suite bench peer). No
    transformers import here: ``LlamaForCausalLM(LlamaConfig(**kw)).load_state_dict(sd)``."""
    c = model.cfg
    kw = dict(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
              num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_heads,
              max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
              tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    sd = {}
    for name, t in model.state_dict().items():
        module = name.rsplit(".", 1)[0]  # every parameter here is a ".weight"
        if module.startswith("layers."):
            _, i, rest = module.split(".", 2)
            sd[f"model.layers.{i}.{_HF_NAMES[rest]}.weight"] = t
        else:
            sd[f"{_HF_NAMES[module]}.weight"] = t
    return kw, sd
