"""Rollout engine: a quantized copy of the actor, its weight sync, and batched KV-cache sampling.

As in QuRL (arXiv 2602.13953) and vLLM's quantized serving, the engine holds its own copy of
the actor in which every block linear (``wq, wk, wv, wo, w_gate, w_up, w_down``) is a
quantized linear, while the embeddings, norms and ``lm_head`` stay in the engine's compute
dtype. :meth:`RolloutEngine.sync` re-quantizes that copy from the full-precision actor at
every RL step (timed on its own, ``timing_s/update_weights``: docs/metrics.md), writing into buffers allocated
once, so a sync re-allocates no module and would trigger no recompilation.

Precisions and kernels: each precision's block linears are built by its entry of
suite.embedded.qlinear ``ENGINE_LINEARS`` (that module says what each one computes).
``kernels=`` "native" runs the low-precision GEMMs with low-precision kernels, "emulated" the
same arithmetic as float32 GEMMs with identical numerics; "auto" (default) picks native where it
is fast -- CUDA; on CPU int8 with VNNI (AVX512-VNNI / AMX: ``_int_mm``) or AVX2 (the suite's
exact packed kernel, qlinear ``INT8_GEMMS``), bf16 with AVX512-BF16 / AMX, fp8 never
(suite.hardware ``gemm_fast``) -- and emulated elsewhere: on an AVX2-only CPU bf16 GEMMs fall
back to reference loops far slower than float32 (docs/bench.md, "Measurements behind the code"),
which would invert every speed comparison.

Sampling (:meth:`RolloutEngine.generate`): left-padded prompts; each distinct prompt is
prefilled once (suite.embedded.prefill ``Prefill``: the general forward's bits, re-fused) and
its KV cache fanned out to its copies (a GRPO group); then one token per
step from a preallocated KV cache, through the engine's own one-token path
(suite.embedded.decode ``Decoder``: far fewer aten calls per step than the general forward,
the same bits; docs/bench.md, "Measurements behind the code"); finished sequences emit ``pad_id`` (masked) and the loop
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
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from suite.core.outliers import outlier_pairs, outlier_transform
from suite.core.quant import QUANTIZERS, QuantScheme
from suite.embedded.decode import Decoder, DecodeState, NativeLayers
from suite.embedded.model import KVCache, Transformer
from suite.embedded.prefill import Prefill
from suite.embedded.qlinear import (
    ENGINE_LINEARS,
    QUANTIZED_LINEARS,
    SAME_INPUT,
    Bf16EmulatedLinear,
    SharedActQuant,
    bf16_matmul_emulated,
    set_int8_gemm,
)
from suite.hardware import gemm_fast

KERNELS = ("auto", "native", "emulated")


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


# ----------------------------------------------------------------------------- engine


class RolloutEngine:
    """The rollout actor: a (quantized) copy of ``model``, re-synced each RL step, that samples.

    ``kernels``: "auto" | "native" | "emulated" (module docstring) for the quantized GEMMs;
    ``bf16_kernels`` the same for the bf16 matmuls outside them (attention, lm_head), None = as
    ``kernels``. Only the GEMMs differ. Runs resolve both at compose time (suite.hardware).
    ``lm_head``: quantize ``lm_head`` as a block linear of the precision (vLLM keeps it 16-bit).
    ``outlier_alpha`` != 1: every sync puts the activation-outlier transform on the copy's weights
    (suite.core.outliers: ``outlier_channels`` channels of each block norm's gain times alpha, the
    fed q/k/v/gate/up input columns divided by it), the same function with INT8-hostile activations.
    """

    def __init__(self, model: Transformer, scheme: QuantScheme, *, kernels: str = "auto",
                 bf16_kernels: str | None = None, lm_head: bool = False, outlier_alpha: float = 1.0,
                 outlier_channels: int = 0):
        bf16_kernels = kernels if bf16_kernels is None else bf16_kernels
        for key, value in (("kernels", kernels), ("bf16_kernels", bf16_kernels)):
            if value not in KERNELS:
                raise ValueError(f"{key}={value!r}; allowed: {KERNELS}")
        p = scheme.precision
        self.scheme, self.cfg = scheme, model.cfg
        self.device = device = next(model.parameters()).device
        # Outside the quantized GEMMs every low-precision engine computes in bf16 (qlinear's doc).
        self.dtype = torch.float32 if QUANTIZERS[p].lossless else torch.bfloat16
        linears = ENGINE_LINEARS[p]
        self.native = (kernels == "native" or (kernels == "auto" and native_is_fast(p, device, scheme))) \
            and linears.native_ok(scheme)
        # bf16 attention matmuls and lm_head: native bf16 kernels, or the float32 emulation.
        self.bf16_native = bf16_kernels == "native" or (bf16_kernels == "auto" and native_is_fast("bf16", device))
        bf16_emulated = self.dtype == torch.bfloat16 and not self.bf16_native
        # The KV cache's dtype. Emulated bf16 attention multiplies float32 copies of bf16 values, so
        # its cache holds the bf16-rounded keys and values in float32 (as Bf16EmulatedLinear holds
        # its weight): the same values and bits, read without a bf16 -> float32 copy of every
        # cached slot per layer and step (docs/bench.md, "Measurements behind the code").
        self.cache_dtype = torch.float32 if bf16_emulated else self.dtype

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
                aq = None
                if linears.act_quant is not None:
                    if SAME_INPUT[attr] not in shared:
                        shared[SAME_INPUT[attr]] = SharedActQuant(linears.act_quant(scheme, self.native))
                        self._act_quants.append(shared[SAME_INPUT[attr]])
                    aq = shared[SAME_INPUT[attr]]
                built = linears.build(getattr(parent, attr), scheme, self.native, aq, device)
                if built is not None:
                    replace(parent, attr, built[0], name, load=built[1])
            if bf16_emulated:
                block.attn.matmul = bf16_matmul_emulated
        built = None
        if lm_head and not QUANTIZERS[p].lossless:
            aq = SharedActQuant(linears.act_quant(scheme, self.native)) if linears.act_quant is not None else None
            self._act_quants += [aq] if aq is not None else []
            built = linears.build(m.lm_head, scheme, self.native, aq, device)
        if built is not None:
            replace(m, "lm_head", built[0], "lm_head", load=built[1])
        elif bf16_emulated:
            replace(m, "lm_head", Bf16EmulatedLinear(self.cfg.d_model, self.cfg.vocab_size, device), "lm_head")
        # The outlier transform's (norm, fed linears) of the source model (the copy's linears are replaced).
        self._outliers = (outlier_pairs(model), float(outlier_alpha), int(outlier_channels)) \
            if outlier_alpha != 1.0 and outlier_channels > 0 else None
        # Everything else (embeddings, norms, and unquantized linears) is copied (and cast).
        self._plain = [(prm, name) for name, prm in m.named_parameters() if name not in replaced]
        self.model = m
        self._cache: KVCache | None = None
        self.decoder = Decoder(m, self.dtype)  # the one-token path of generate (suite.embedded.decode)
        self.prefill = Prefill(self.decoder)  # generate's prompt path (suite.embedded.prefill)
        self.sync(model)

    # ---------------------------------------------------------------- weight sync
    @torch.no_grad()
    def sync(self, model: Transformer) -> float:
        """Re-quantize every weight of the copy from ``model``'s full-precision weights, in
        place; returns the wall seconds it took (``timing_s/update_weights``)."""
        t0 = time.perf_counter()
        src = dict(model.named_parameters())
        if self._outliers is not None:
            src = outlier_transform(src, *self._outliers)
        for dst, name in self._plain:
            dst.copy_(src[name])  # a cast to the engine's dtype when it is bf16
        for load, name in self._targets:
            load(src[name].detach())
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def set_int8_gemm(self, gemm: str) -> None:
        """Run every int8 linear's integer GEMM as ``gemm`` (qlinear.set_int8_gemm: "int_mm" or
        "packed", the same exact sums), e.g. to time both side by side; a C++ layer loop, where
        on, is rebuilt on the new weight operands."""
        set_int8_gemm(self.model, gemm)
        if self.decoder.native is not None:
            self.decoder.native = NativeLayers.build(self.decoder.layers)

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
            c = self._cache = KVCache(self.cfg, batch, length, dtype=self.cache_dtype, device=self.device)
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

        # Inference mode: no version counters or view tracking on the many aten calls of a
        # decode step (docs/bench.md, "Measurements behind the code"). Only the KV cache, the logits and the
        # sampled tokens live inside it; the Rollout's tensors are made outside, updated in place.
        with torch.inference_mode():
            cache = self._get_cache(B, S)
            if len(rep) == B:
                logits = self.prefill(tokens[:, :P], mask[:, :P], cache)  # [B, V]
            else:  # prefill the distinct prompts, then fan their KV cache out to the copies
                src_t, rep_t = torch.tensor(src, device=dev), torch.tensor(rep, device=dev)  # [B], [U]
                logits = self.prefill(tokens[rep_t, :P], mask[rep_t, :P], cache.rows(len(rep)))[src_t]  # [B, V]
                cache.gather_rows(src_t, P)

            state = DecodeState(cache, self.dtype)  # per-call buffers and views of the cache

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
                logits = self.decoder(tok, mask[:, col], state)  # [B, V]
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
