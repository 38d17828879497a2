"""Rollout engine: a quantized copy of the actor, its weight sync, and batched KV-cache sampling.

As in QuRL (arXiv 2602.13953) and vLLM's quantized serving, the engine holds its own copy of
the actor in which every block linear (``wq, wk, wv, wo, w_gate, w_up, w_down``) is a
quantized linear, while the embeddings, norms and ``lm_head`` stay in the engine's compute
dtype. :meth:`RolloutEngine.sync` re-quantizes that copy from the full-precision actor at
every RL step (timed on its own: SPEC.md, "weight sync"), writing into buffers allocated
once, so a sync re-allocates no module and would trigger no recompilation.

Precisions (``QuantScheme.precision``; every quantizer comes from :mod:`suite.core.quant`):

- ``fp32``: a plain float32 copy (the reference; its log-probs equal the trainer's).
- ``bf16``: the whole copy in bfloat16 (the papers' baseline rollout); logits go to float32
  for sampling and log-probs.
- ``int8``: W8A8 as QuRL / vLLM: per-output-channel int8 weights, activations quantized
  dynamically *per token* (one scale per row, so a sequence never depends on its
  batch-mates), an int8 x int8 -> int32 GEMM, rescaled by ``act_scale * weight_scale``,
  output in bfloat16. Embeddings, norms, attention and ``lm_head`` in bfloat16, as in vLLM,
  whose quantized models keep ``dtype=bfloat16`` outside the W8A8 GEMMs: an INT8 rollout
  carries the BF16 rollout's rounding *plus* its quantization error, which is why QuRL's
  INT8/FP8 mismatch sits above BF16's.
- ``fp8``: E4M3 weights (``QuantScheme.fp8_granularity``) and per-token dynamic E4M3
  activations (W8A8-FP8); the rest in bfloat16, as for int8.
- ``w4a16``: QaRL's group-wise 4-bit weights dequantized once per sync into bfloat16; the
  whole copy computes in bfloat16 (a W4A16 kernel's numerics; no 4-bit kernel is used).

Kernels (``kernels=``): "native" runs the low-precision GEMMs with low-precision kernels:
``torch._int_mm`` for int8, bf16 GEMMs for bf16 / w4a16, ``torch._scaled_mm`` for fp8
(row-wise scales; "block" fp8 is always dequantized). "emulated" runs the same arithmetic as
float32 GEMMs with identical numerics: int8 codes as floats (products are exact integers and
their float32 sums stay exact while ``K * 127**2 < 2**24``, i.e. K <= 1040, beyond that up to
a relative 2**-24), bf16 values as floats (exact products, float32 accumulation, output
rounded to bf16 -- what a bf16 GEMM does), fp8 weights dequantized at sync and activations
fake-quantized per token. "auto" (default) picks native where it is fast -- CUDA; on CPU
int8 with VNNI (AVX512-VNNI / AMX), bf16 with AVX512-BF16 / AMX, fp8 never -- and emulated
elsewhere: on an AVX2-only CPU ``_int_mm`` and bf16 GEMMs fall back to reference loops 5-30x
slower than float32 (measured here), which would invert every speed comparison.

Sampling (:meth:`RolloutEngine.generate`): left-padded prompts; each distinct prompt is
prefilled once and its KV cache fanned out to its copies (a GRPO group); then one token per
step from a preallocated KV cache, through the engine's own one-token path
(:meth:`RolloutEngine._decode`: ~410 aten calls per step instead of the general forward's
~1,040, the same bits, issue 7); finished sequences emit ``pad_id`` (masked) and the loop
exits once every sequence has emitted ``stop_id``. ``behav_logp`` is the log-prob of each
sampled token under ``softmax(logits / temperature)`` of the *engine's* (quantized) model --
of the full tempered distribution even when ``top_p < 1`` truncates the sampling
distribution, so it is directly comparable with the trainer's ``response_logprobs``
(pi_prox) and the mismatch ``pi_prox / pi_behav`` measures the quantization alone (the
nucleus truncation is, as in verl + vLLM, not corrected for). ``temperature == 0`` is greedy
decoding, and ``behav_logp`` is then of the un-tempered (temperature 1) distribution, the
same convention as ``response_logprobs``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from suite.core.quant import (
    QuantScheme,
    fake_quant,
    quantize_fp8,
    quantize_int8_per_channel,
    quantize_int8_per_token,
)
from suite.embedded.model import Block, KVCache, RMSNorm, Transformer
from suite.hardware import gemm_fast

# The block linears a rollout engine quantizes (vLLM keeps embeddings, norms, lm_head in 16 bit).
QUANTIZED_LINEARS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w_gate", "mlp.w_up", "mlp.w_down")
KERNELS = ("auto", "native", "emulated")
# Linears that read the same input share one activation quantizer (see SharedActQuant).
_SAME_INPUT = {"wq": "qkv", "wk": "qkv", "wv": "qkv", "wo": "wo", "w_gate": "gate_up", "w_up": "gate_up",
               "w_down": "w_down"}
# Activations [M, K] with "per_channel" scales: one scale per row, i.e. per token.
_FP8_PER_TOKEN = QuantScheme(precision="fp8", fp8_granularity="per_channel")


@dataclass
class Rollout:
    """A batch of sampled sequences: left-padded prompts, then right-padded responses.

    R is the number of decode steps run (<= max_new_tokens: the loop stops early once every
    sequence has emitted the stop token).
    """

    tokens: torch.Tensor  # [B, P + R] long
    attention_mask: torch.Tensor  # [B, P + R] bool, False on padding
    response_start: int  # P, the first response column
    response_mask: torch.Tensor  # [B, R] bool, valid response tokens incl. the stop token
    behav_logp: torch.Tensor  # [B, R] float32, log pi_behav of each sampled token (0 where masked)
    response_len: torch.Tensor  # [B] long, response_mask.sum(-1)


# ----------------------------------------------------------------------------- kernel choice


def native_is_fast(precision: str, device: torch.device, scheme: QuantScheme | None = None) -> bool:
    """Whether this device has a fast low-precision kernel for ``precision`` ("auto" kernels;
    the rule is suite.hardware.gemm_fast, which honours an ISA cap)."""
    return gemm_fast(precision, scheme.fp8_granularity if scheme is not None else "per_channel", device)


# ----------------------------------------------------------------------------- low-precision linears


class SharedActQuant:
    """Dynamic per-token activation quantizer shared by the linears that read the same input
    (``wq, wk, wv`` read the attention norm's output, ``w_gate, w_up`` the MLP norm's): the
    input is quantized once, as a fused QKV / gate-up kernel does. Per-token scales make this
    exactly the same as quantizing it for each linear separately."""

    def __init__(self, fn: Callable):
        self.fn = fn  # x [M, K] -> the quantized activation its linears consume
        self._x: torch.Tensor | None = None
        self._out = None

    def __call__(self, x: torch.Tensor):
        # Identity, not value: the same tensor object is passed to each sibling linear within
        # one forward; holding the reference keeps a later tensor from reusing its id.
        if x is not self._x:
            self._x, self._out = x, self.fn(x.reshape(-1, x.shape[-1]))  # [M, K]
        return self._out

    def clear(self) -> None:
        self._x = self._out = None


def _int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 [M, K] x int8 [K, N] -> int32 [M, N]. cuBLAS needs M > 16 and K, N multiples of 8
    (as torchao's ``safe_int_mm``): pad M with zero rows on CUDA. The CPU kernel takes any shape."""
    m = a.shape[0]
    if a.is_cuda and m <= 16:
        return torch._int_mm(F.pad(a, (0, 0, 0, 17 - m)), b)[:m]  # [M, N]
    return torch._int_mm(a, b)


class Int8Linear(nn.Module):
    """W8A8 linear (QuRL Sec. 3; SmoothQuant / vLLM W8A8 layout): int8 per-output-channel
    weights, int8 per-token dynamic activations, integer GEMM, float rescale."""

    def __init__(self, in_features: int, out_features: int, native: bool, act_quant: SharedActQuant, device=None):
        super().__init__()
        self.in_features, self.out_features, self.native, self.act_quant = in_features, out_features, native, act_quant
        # Emulated: the int8 codes stored as float32, for a float32 GEMM over integers.
        code_dtype = torch.int8 if native else torch.float32
        self.register_buffer("codes", torch.zeros(out_features, in_features, dtype=code_dtype, device=device))
        self.register_buffer("scale", torch.zeros(1, out_features, device=device))  # [1, N] f32

    @torch.no_grad()
    def load(self, w: torch.Tensor) -> None:
        codes, scales = quantize_int8_per_channel(w)  # int8 [N, K], f32 [N, 1]
        self.codes.copy_(codes)
        self.scale.copy_(scales.view(1, -1))  # [1, N]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, xs = self.act_quant(x)  # int8 [M, K], f32 [M, 1]
        if self.native:
            acc = _int_mm(xq, self.codes.t()).float()  # [M, N] int32 -> f32
        else:
            acc = F.linear(xq.float(), self.codes)  # [M, N], exact integer sums (module doc)
        y = acc.mul_(xs).mul_(self.scale)  # [M, N]
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)  # [..., N]


class Fp8Linear(nn.Module):
    """W8A8-FP8 linear (QuRL FP8 rollout): E4M3 weights, per-token dynamic E4M3 activations.

    Native: ``torch._scaled_mm`` on the float8 codes with row-wise scales (bf16 output on CUDA,
    where row-wise scaling requires it; float32 on CPU). Emulated: weights dequantized at
    load, activations fake-quantized per token, float32 GEMM.
    """

    def __init__(self, in_features: int, out_features: int, scheme: QuantScheme, native: bool,
                 act_quant: SharedActQuant, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.scheme, self.native, self.act_quant = scheme, native, act_quant
        if native:
            self.register_buffer("codes", torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn,
                                                      device=device))
            self.register_buffer("scale", torch.zeros(1, out_features, device=device))  # [1, N]
        else:
            self.register_buffer("weight", torch.zeros(out_features, in_features, device=device))  # [N, K]

    @torch.no_grad()
    def load(self, w: torch.Tensor) -> None:
        if self.native:
            codes, scales = quantize_fp8(w, self.scheme.fp8_granularity, self.scheme.block_size)
            self.codes.copy_(codes)
            self.scale.copy_(scales.reshape(-1, 1).expand(self.out_features, 1).reshape(1, -1))  # [1, N]
        else:
            self.weight.copy_(fake_quant(w.float(), self.scheme))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native:
            xq, xs = self.act_quant(x)  # fp8 [M, K], f32 [M, 1]
            out_dtype = torch.bfloat16 if xq.is_cuda else torch.float32
            y = torch._scaled_mm(xq, self.codes.t(), scale_a=xs.float(), scale_b=self.scale,
                                 out_dtype=out_dtype)  # [M, N]
        else:
            y = F.linear(self.act_quant(x), self.weight)  # [M, N], fake-quantized activations
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)  # [..., N]


class Bf16EmulatedLinear(nn.Module):
    """A bf16 linear run as a float32 GEMM over bf16 values: products of bf16 numbers are exact
    in float32, the sum is accumulated in float32 and the output rounded to bf16 -- what a
    native bf16 GEMM computes (up to summation order), at float32 speed on CPUs without bf16
    GEMM kernels. ``weight`` holds bf16-representable values in float32."""

    def __init__(self, in_features: int, out_features: int, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, device=device))  # [N, K]

    @torch.no_grad()
    def load(self, w: torch.Tensor) -> None:
        self.weight.copy_(w.to(torch.bfloat16))  # round to bf16 (nearest even), keep as float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight).to(torch.bfloat16)


def _bf16_matmul_emulated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Attention's bf16 matmuls, emulated as Bf16EmulatedLinear does."""
    return torch.matmul(a.float(), b.float()).to(torch.bfloat16)


# ----------------------------------------------------------------------------- engine


class RolloutEngine:
    """The rollout actor: a (quantized) copy of ``model``, re-synced each RL step, that samples.

    ``kernels``: "auto" | "native" | "emulated" (module docstring) for the quantized GEMMs;
    ``bf16_kernels`` the same for the bf16 matmuls outside them (attention, lm_head), None = as
    ``kernels``. Only the GEMMs differ. Runs resolve both at compose time (suite.hardware).
    """

    def __init__(self, model: Transformer, scheme: QuantScheme, *, kernels: str = "auto",
                 bf16_kernels: str | None = None):
        bf16_kernels = kernels if bf16_kernels is None else bf16_kernels
        for key, value in (("kernels", kernels), ("bf16_kernels", bf16_kernels)):
            if value not in KERNELS:
                raise ValueError(f"{key}={value!r}; allowed: {KERNELS}")
        p = scheme.precision
        self.scheme, self.cfg = scheme, model.cfg
        self.device = device = next(model.parameters()).device
        # Outside the quantized GEMMs every low-precision engine computes in bf16 (module doc).
        self.dtype = torch.float32 if p == "fp32" else torch.bfloat16
        self.native = kernels == "native" or (kernels == "auto" and native_is_fast(p, device, scheme))
        # bf16 attention matmuls and lm_head: native bf16 kernels, or the float32 emulation.
        self.bf16_native = bf16_kernels == "native" or (bf16_kernels == "auto" and native_is_fast("bf16", device))
        if p == "fp8" and scheme.fp8_granularity == "block":
            self.native = False  # no row-wise-scaled kernel for 128x128 blocks: dequantize

        # Our own copy (deepcopy: no RNG is consumed, the caller's streams stay untouched).
        m = copy.deepcopy(model).to(self.dtype)
        m.rope_cos, m.rope_sin = model.rope_cos.clone(), model.rope_sin.clone()  # keep float32 tables
        for prm in m.parameters():
            prm.grad = None
            prm.requires_grad_(False)
        m.eval()
        # Sync targets, resolved once so that a sync is a flat loop:
        # (load(full-precision weight) -> None, the source parameter's name).
        self._targets: list[tuple[Callable[[torch.Tensor], None], str]] = []
        self._act_quants: list[SharedActQuant] = []
        replaced: set[str] = set()

        def replace(parent: nn.Module, attr: str, new: nn.Module, name: str, load=None) -> None:
            setattr(parent, attr, new)
            self._targets.append((load or new.load, f"{name}.weight"))
            replaced.add(f"{name}.weight")

        for i, block in enumerate(m.layers):
            shared: dict[str, SharedActQuant] = {}
            for path in QUANTIZED_LINEARS:
                parent_name, attr = path.split(".")
                parent, name = getattr(block, parent_name), f"layers.{i}.{path}"
                lin: nn.Linear = getattr(parent, attr)
                n_in, n_out = lin.in_features, lin.out_features
                if p in ("int8", "fp8"):
                    if _SAME_INPUT[attr] not in shared:
                        shared[_SAME_INPUT[attr]] = SharedActQuant(self._act_quant_fn())
                        self._act_quants.append(shared[_SAME_INPUT[attr]])
                    aq = shared[_SAME_INPUT[attr]]
                    if p == "int8":
                        replace(parent, attr, Int8Linear(n_in, n_out, self.native, aq, device), name)
                    else:
                        replace(parent, attr, Fp8Linear(n_in, n_out, scheme, self.native, aq, device), name)
                elif p == "w4a16":
                    target = lin if self.native else Bf16EmulatedLinear(n_in, n_out, device)
                    replace(parent, attr, target, name, load=_w4_loader(target, scheme))
                elif p == "bf16" and not self.native:
                    replace(parent, attr, Bf16EmulatedLinear(n_in, n_out, device), name)
            if self.dtype == torch.bfloat16 and not self.bf16_native:
                block.attn.matmul = _bf16_matmul_emulated
        if self.dtype == torch.bfloat16 and not self.bf16_native:
            replace(m, "lm_head", Bf16EmulatedLinear(self.cfg.d_model, self.cfg.vocab_size, device), "lm_head")
        # Everything else (embeddings, norms, and unquantized linears) is copied (and cast).
        self._plain = [(prm, name) for name, prm in m.named_parameters() if name not in replaced]
        self.model = m
        self._cache: KVCache | None = None
        self._layers = [_DecodeLayer(block, self.dtype) for block in m.layers]
        self._norm, self._lm_head = _Norm(m.norm, self.dtype), _linear_fn(m.lm_head)
        self.sync(model)

    def _act_quant_fn(self) -> Callable:
        # Scales are computed in float32 from the bf16 activations, as vLLM's quant kernels do.
        if self.scheme.precision == "int8":
            return lambda x: quantize_int8_per_token(x.float())  # -> (int8 codes [M, K], scales [M, 1])
        if self.native:
            return lambda x: quantize_fp8(x.float(), "per_channel")  # -> (fp8 codes [M, K], scales [M, 1])
        return lambda x: fake_quant(x.float(), _FP8_PER_TOKEN)  # -> dequantized [M, K]

    # ---------------------------------------------------------------- weight sync
    @torch.no_grad()
    def sync(self, model: Transformer) -> float:
        """Re-quantize every weight of the copy from ``model``'s full-precision weights, in
        place; returns the wall seconds it took (``timing_s/update_weights``)."""
        t0 = time.perf_counter()
        src = dict(model.named_parameters())
        for dst, name in self._plain:
            dst.copy_(src[name])  # a cast to the engine's dtype when it is bf16
        for load, name in self._targets:
            load(src[name].detach())
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    # ---------------------------------------------------------------- forward helpers
    def logits(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Full-sequence float32 logits [B, T, V] of the engine's (quantized) model."""
        if attention_mask is not None:
            attention_mask = attention_mask.to(self.device)
        with torch.no_grad():
            out = self.model(tokens.to(self.device), attention_mask=attention_mask).float()
        self._release()
        return out

    def _release(self) -> None:
        for aq in self._act_quants:  # drop the last activations the shared quantizers hold
            aq.clear()

    def _get_cache(self, batch: int, length: int) -> KVCache:
        c = self._cache
        if c is None or c.k.shape[1] != batch or c.max_len < length:
            c = self._cache = KVCache(self.cfg, batch, length, dtype=self.dtype, device=self.device)
        c.reset()
        return c

    # ---------------------------------------------------------------- sampling
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 stop_id: int, pad_id: int, generator: torch.Generator) -> Rollout:
        """Sample up to ``max_new_tokens`` tokens after each prompt; see the module docstring."""
        B = len(prompts)
        if B == 0 or min(len(p) for p in prompts) == 0:
            raise ValueError("generate needs at least one prompt, and every prompt at least one token")
        if max_new_tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} (>= 1), temperature={temperature} (>= 0), "
                             f"top_p={top_p} (in (0, 1]) out of range")
        P = max(len(p) for p in prompts)
        S = P + max_new_tokens
        if S > self.cfg.max_seq_len:
            raise ValueError(f"longest prompt {P} + max_new_tokens {max_new_tokens} > "
                             f"max_seq_len {self.cfg.max_seq_len}")
        # Distinct prompts (GRPO repeats every prompt G times): each is prefilled once.
        first: dict[tuple[int, ...], int] = {}  # prompt -> its id among the distinct prompts
        src: list[int] = []  # row -> distinct-prompt id
        rep: list[int] = []  # distinct-prompt id -> its first row
        for i, p in enumerate(prompts):
            if tuple(p) not in first:
                first[tuple(p)] = len(rep)
                rep.append(i)
            src.append(first[tuple(p)])

        dev = self.device
        tokens = torch.full((B, S), pad_id, dtype=torch.long)  # [B, S]
        tokens[:, :P] = torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in prompts])  # [B, P]
        mask = torch.zeros(B, S, dtype=torch.bool)  # [B, S]
        mask[:, :P] = torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p in prompts])  # [B, P]
        tokens, mask = tokens.to(dev), mask.to(dev)
        behav = torch.zeros(B, max_new_tokens, device=dev)  # [B, R]
        done = torch.zeros(B, dtype=torch.bool, device=dev)  # [B]

        # Inference mode: no version counters or view tracking on the ~400 aten calls of a
        # decode step (3-5 % of a tiny-model rollout). Only the KV cache, the logits and the
        # sampled tokens live inside it; the Rollout's tensors are made outside, updated in place.
        with torch.inference_mode():
            model, cache = self.model, self._get_cache(B, S)
            if len(rep) == B:
                h = model.hidden(tokens[:, :P], attention_mask=mask[:, :P], kv_cache=cache)  # [B, P, D]
                logits = model.lm_head(h[:, -1]).float()  # [B, V]
            else:  # prefill the distinct prompts, then fan their KV cache out to the copies
                src_t, rep_t = torch.tensor(src, device=dev), torch.tensor(rep, device=dev)  # [B], [U]
                h = model.hidden(tokens[rep_t, :P], attention_mask=mask[rep_t, :P],
                                 kv_cache=cache.rows(len(rep)))  # [U, P, D]
                logits = model.lm_head(h[:, -1]).float()[src_t]  # [B, V]
                cache.gather_rows(src_t, P)

            state = _DecodeState(cache)  # per-call buffers and views of the cache

            n = 0
            for t in range(max_new_tokens):
                tok, logp = _sample(logits, temperature, top_p, generator)  # [B], [B]
                tok.masked_fill_(done, pad_id)
                col = P + t
                tokens[:, col] = tok
                mask[:, col] = ~done
                behav[:, t] = logp
                done |= tok == stop_id
                n = t + 1
                if n == max_new_tokens or bool(done.all()):
                    break
                logits = self._decode(tok, mask[:, col], state)  # [B, V]
        self._release()

        response_mask = mask[:, P : P + n].clone()  # [B, R]
        return Rollout(
            tokens=tokens[:, : P + n].clone(),
            attention_mask=mask[:, : P + n].clone(),
            response_start=P,
            response_mask=response_mask,
            behav_logp=behav[:, :n].masked_fill(~response_mask, 0.0),
            response_len=response_mask.sum(-1),
        )


    def _decode(self, tok: torch.Tensor, valid: torch.Tensor, state: "_DecodeState") -> torch.Tensor:
        """One decode step: float32 logits [B, V] of ``tok [B]`` appended at slot ``cache.length``
        (``valid [B]`` False = pad), the same numbers as ``model.hidden`` + ``lm_head``.

        Why not ``model.hidden``: at decode batch sizes on a CPU every aten call costs a few
        microseconds of dispatch whatever its size, and the general forward spends ~1,000 of
        them per token on [B, T, ...] views, masks rebuilt per layer, rotary slices and
        no-op casts (issue 7). Here the per-step work (positions, rotary table, mask) is done
        once, the layers run on [B, D] rows with in-place ops, and every op that remains
        computes its elements exactly as the general forward does.
        """
        m, cache, f32 = self.model, state.cache, self.dtype == torch.float32
        s0 = cache.length
        # positions: the cumsum rule of Transformer.hidden for one token, n_valid + valid - 1 >= 0.
        v = valid.long()  # [B]
        pos = (cache.n_valid + v).sub_(1).clamp_(min=0)  # [B]
        cache.key_valid[:, s0] = valid
        cache.n_valid.add_(v)
        x = m.tok_emb.weight.index_select(0, tok)  # [B, D], = the embedding lookup
        cos, sin = m.rope_cos.index_select(0, pos), m.rope_sin.index_select(0, pos)  # [B, hd/2] float32
        if not f32:
            cos, sin = cos.to(self.dtype), sin.to(self.dtype)
        # Full-width tables for x * cos + rotate_half(x) * sin: x1 cos - x2 sin is x1 cos + x2 (-sin)
        # bit for bit (negation is exact), so apply_rope's values are reproduced.
        cos = torch.cat([cos, cos], -1).unsqueeze_(1)  # [B, 1, hd]
        sin = torch.cat([sin.neg(), sin], -1).unsqueeze_(1)  # [B, 1, hd]
        bias = state.bias[..., : s0 + 1]  # [B * H, 1, S] view
        for layer, (k, v) in zip(self._layers, state.kv):
            x = layer(x, k, v, s0, cos, sin, bias, state)
        cache.length = s0 + 1
        # The query saw its own slot; later queries must not see it if it is padding.
        state.bias4[:, :, 0, s0].masked_fill_(valid.logical_not().unsqueeze_(1), float("-inf"))
        return self._lm_head(self._norm(x)).float()  # [B, V]


class _DecodeState:
    """Per-``generate`` buffers of the decode loop, allocated once per call: the keys' additive
    mask (0 = seen, -inf = padding), kept up to date slot by slot rather than rebuilt per
    step and layer; the q / k projections' outputs (see _DecodeLayer); per-layer views of
    the KV cache as [B * H, max_len, hd] batches."""

    def __init__(self, cache: KVCache):
        L, B, H, S, hd = cache.k.shape
        self.cache = cache
        self.bias4 = torch.zeros(B, H, 1, S, dtype=cache.k.dtype, device=cache.k.device)  # [B, H, 1, S]
        filled = cache.length  # the prefilled prompt slots
        self.bias4[:, :, 0, :filled].masked_fill_(~cache.key_valid[:, None, :filled], float("-inf"))
        self.bias = self.bias4.view(B * H, 1, S)
        self.qk = torch.empty(2, B, H * hd, dtype=cache.k.dtype, device=cache.k.device)  # [2, B, D]
        self.q, self.k = self.qk[0], self.qk[1]  # [B, D] views
        self.kv = [(cache.k[i].view(B * H, S, hd), cache.v[i].view(B * H, S, hd)) for i in range(L)]


class _Norm:
    """``RMSNorm`` as a function of rows x [M, D]. In float32 without its two no-op casts, with
    ``mean`` written out as the ``sum`` and ``div_`` it runs (aten's CPU ``mean``), ``pow(2)``
    as the ``x * x`` it computes, and the scalars as ready 0-dim tensors: 6 aten calls instead
    of ~25, the same bits (an equal-bits test guards it, tests/embedded/test_engine.py)."""

    def __init__(self, norm: RMSNorm, dtype: torch.dtype):
        self.norm, self.f32 = norm, dtype == torch.float32
        w = norm.weight
        self.n = torch.tensor(float(w.shape[0]), device=w.device)  # D, float32
        self.eps = torch.tensor(norm.eps, device=w.device)  # float32, as the scalar the kernel uses

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.f32:
            return self.norm(x)
        r = (x * x).sum(-1, keepdim=True).div_(self.n).add_(self.eps).rsqrt_()  # [M, 1]
        return (x * r).mul_(self.norm.weight)


def _linear_fn(mod: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``mod`` as a function of x [M, K]: a plain bias-free ``nn.Linear`` becomes one ``mm``
    with its weight's transposed view (taken once; a sync writes into the same storage), the
    very call ``F.linear`` reaches after its ``linear -> t -> matmul`` dispatches."""
    if type(mod) is nn.Linear and mod.bias is None:
        wt = mod.weight.t()  # [K, N] view
        return lambda x: torch.mm(x, wt)
    return mod


class _DecodeLayer:
    """One block of the engine's copy for a one-token decode step on rows x [B, D].

    The same arithmetic as ``Block.forward`` with T = 1, fewer dispatches: q and k are written
    by ``mm(..., out=)`` into one [2, B, D] buffer (plain linears; else stacked) and rotated
    together; the key mask enters as an additive 0 / -inf bias of a ``baddbmm`` (x + 0 = x
    and x + -inf = -inf: the same scores as ``masked_fill``) that also applies the
    1 / sqrt(head_dim) scale when it is a power of two (then exact in any order); residual
    adds, SiLU and the gating product are in place.
    """

    def __init__(self, block: Block, dtype: torch.dtype):
        a = block.attn
        self.attn_norm, self.mlp_norm = _Norm(block.attn_norm, dtype), _Norm(block.mlp_norm, dtype)
        self.n_heads, self.head_dim = a.n_heads, a.head_dim
        self.wq, self.wk, self.wv, self.wo = (_linear_fn(a.wq), _linear_fn(a.wk), _linear_fn(a.wv),
                                              _linear_fn(a.wo))
        self.w_gate, self.w_up, self.w_down = (_linear_fn(block.mlp.w_gate), _linear_fn(block.mlp.w_up),
                                               _linear_fn(block.mlp.w_down))
        plain = type(a.wq) is nn.Linear and type(a.wk) is nn.Linear
        self.qk_t = (a.wq.weight.t(), a.wk.weight.t()) if plain else None  # [D, D] views
        self.matmul = a.matmul  # torch.matmul, or the engine's bf16 emulation
        self.fast_att = dtype == torch.float32 and self.matmul is torch.matmul
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.scale_exact = math.frexp(self.scale)[0] == 0.5  # a power of two

    def __call__(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, s0: int,
                 cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor, state: _DecodeState) -> torch.Tensor:
        """x [B, D] (updated in place and returned); k_cache, v_cache [B * H, max_len, hd] views
        of this layer's cache; the new token goes to slot s0; cos, sin [B, 1, hd]; bias
        [B * H, 1, s0 + 1]; ``state.qk`` the q / k buffer."""
        B, D = x.shape
        H, hd, S = self.n_heads, self.head_dim, s0 + 1
        h = self.attn_norm(x)  # [B, D]
        if self.qk_t is not None:
            torch.mm(h, self.qk_t[0], out=state.q)
            torch.mm(h, self.qk_t[1], out=state.k)
            qk = state.qk  # [2, B, D]
        else:
            qk = torch.stack([self.wq(h), self.wk(h)])  # [2, B, D]
        v = self.wv(h)  # [B, D]
        qk = qk.view(2, B, H, hd)
        rot = qk.view(2, B, H, 2, hd // 2).flip(3).view(2, B, H, hd)  # rotate_half without the sign
        qk = qk * cos + rot * sin  # [2, B, H, hd]
        k_cache.select(1, s0).copy_(qk[1].view(B * H, hd))
        v_cache.select(1, s0).copy_(v.view(B * H, hd))
        q = qk[0].view(B * H, 1, hd)
        kt = k_cache[:, :S].transpose(1, 2)  # [B * H, hd, S] view
        vv = v_cache[:, :S]  # [B * H, S, hd] view
        if self.fast_att:
            if self.scale_exact:
                att = torch.baddbmm(bias, q, kt, alpha=self.scale)  # [B * H, 1, S]
            else:
                att = torch.baddbmm(bias, q, kt).mul_(self.scale)
            y = torch.bmm(torch.softmax(att, -1), vv)  # [B * H, 1, hd]
        else:
            att = self.matmul(q, kt) * self.scale + bias  # [B * H, 1, S]
            att = torch.softmax(att, -1, dtype=torch.float32).to(vv.dtype)
            y = self.matmul(att, vv)  # [B * H, 1, hd]
        x = x.add_(self.wo(y.view(B, D)))
        h = self.mlp_norm(x)
        g = self.w_gate(h)
        return x.add_(self.w_down(F.silu(g, inplace=True).mul_(self.w_up(h))))


def _w4_loader(target: nn.Module, scheme: QuantScheme) -> Callable[[torch.Tensor], None]:
    """Sync of a w4a16 linear: the group-wise 4-bit fake-quant weight (QaRL), rounded to bf16
    (into a bf16 ``nn.Linear``, or a Bf16EmulatedLinear's float32 buffer), in place."""

    def load(w: torch.Tensor) -> None:
        target.weight.copy_(fake_quant(w.float(), scheme).to(torch.bfloat16))

    return load


def _sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits [B, V]`` (float32) -> (tokens [B], log-probs [B]).

    Greedy when ``temperature == 0`` (log-probs at temperature 1); otherwise a draw from
    ``softmax(logits / temperature)`` restricted to the nucleus ``top_p`` (Holtzman et al.
    2020), with the log-prob taken under the full tempered distribution (module docstring).
    """
    if temperature == 0:
        logp_all = torch.log_softmax(logits, dim=-1)  # [B, V]
        tok = logits.argmax(-1)  # [B]
    else:
        logp_all = torch.log_softmax(logits / temperature, dim=-1)  # [B, V]
        probs = logp_all.exp()  # [B, V]
        if top_p < 1.0:
            p_sorted, idx = probs.sort(-1, descending=True)  # [B, V]
            # Drop a token once the mass before it already reaches top_p (the top token stays).
            drop = (p_sorted.cumsum(-1) - p_sorted) >= top_p  # [B, V]
            probs = probs.scatter(-1, idx, p_sorted.masked_fill(drop, 0.0))  # [B, V]
        if probs.device != generator.device:  # e.g. a CPU generator for a CUDA engine
            tok = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(probs.device)  # [B]
        else:
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # [B]
    return tok, logp_all.gather(-1, tok[:, None]).squeeze(-1)
