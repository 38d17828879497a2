"""QaRL's rollout-aligned training forward inside verl's FSDP actor (``correction.aligned_forward``).

The embedded trainer (suite.embedded.trainer ``_logprobs(aligned=True)``) computes the actor's
log-probs -- the update's pi_theta and the recomputed pi_prox -- with every block linear weight
fake-quantized by the rollout's own quantizer and a straight-through estimator
(``suite.core.quant.fake_quant(w, scheme, ste=True)``), and for int8 / fp8 its input too, per
token (``fake_quant_act``). This module does the same in verl 0.9.1 without forking it:

- :func:`apply_aligned_forward` turns each block linear of a Hugging Face model
  (``q/k/v/o_proj``, ``gate/up/down_proj``: exactly the layers the rollout quantizes,
  suite.verl.int8_hook ``is_quantized_linear``) into an :class:`AlignedLinear`: the same module
  and parameters (its class is swapped, so parameter names, the optimizer state, FSDP sharding
  and the weight sync to vLLM are unchanged), whose forward is
  ``F.linear(fake_quant_act(x, scheme, ste=True), fake_quant(weight, scheme, ste=True), bias)``:
  W8A8 for int8 / fp8, whose rollout also quantizes each token's activations (per token for
  INT8 and per-channel FP8; per token and 128-wide group for verl's block FP8, as vLLM does), weight-only for
  bf16 / w4a16 (16-bit activations: ``fake_quant_act`` is the identity). Under FSDP the
  forward sees the unsharded weight in the mixed-precision ``param_dtype`` (bf16): the same
  bf16 weights that verl syncs to vLLM and that the rollout quantizes, so both sides quantize
  the same numbers.
  Embeddings, norms and ``lm_head`` stay as they are (the rollout keeps them in bf16).
- :func:`install` (called by the plugin, suite.verl.plugin, when ``SUITE_ALIGNED_FORWARD`` is set
  in a worker's environment) replaces verl's FSDP language-model engines in
  ``verl.workers.engine.EngineRegistry`` (backends ``fsdp``, ``fsdp2``, ``fsdp_turbo``) by
  subclasses whose ``_build_module`` applies :func:`apply_aligned_forward` to the model verl has
  just loaded, before FSDP wraps it -- the place verl applies its own QAT (``_apply_qat``). Only
  trainable engines are aligned (``engine_config.forward_only`` is false: the actor, whose
  ``compute_log_prob`` gives pi_prox and whose update gives pi_theta); the reference policy
  (forward-only) and the critic (value model) keep the plain forward, as in the embedded backend.

The scheme travels as one string (:func:`scheme_spec` / :func:`parse_spec`): ``bf16``,
``int8`` (per-output-channel weights and per-token activations, as the INT8 rollout),
``w4a16:<group_size>:<sym|asym>``, ``fp8:per_channel`` (QuRL's FP8: compressed-tensors, per-token
activations) and ``fp8:block:<block>`` (verl's native FP8 rollout quantizes 128x128 weight blocks
and 1x128 activation groups; the aligned forward follows the rollout).

verl's own QAT (``actor.qat``) is NVFP4 (W4A4 / W4A16 with FP4 E2M1 codes): a different grid
from the rollouts the suite runs, so it is not used here.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

from suite.core.quant import QUANTIZERS, QuantScheme, fake_quant, fake_quant_act
from suite.verl.config import VERL_ALIGNED_STRATEGIES
from suite.verl.int8_hook import QUANTIZED_LINEARS
from suite.verl.rollout_quant import parse_spec as _parse_spec
from suite.verl.rollout_quant import scheme_spec

log = logging.getLogger(__name__)

ALIGNED_ENV = "SUITE_ALIGNED_FORWARD"  # the scheme spec; set by suite.verl.translate in every Ray worker
ALIGNED_BACKENDS = VERL_ALIGNED_STRATEGIES  # verl engine backends whose _build_module we extend


def parse_spec(spec: str) -> QuantScheme:
    """The scheme of an ``SUITE_ALIGNED_FORWARD`` value (suite.verl.rollout_quant ``scheme_spec``);
    a malformed one raises ``ValueError`` naming the variable and the forms allowed."""
    return _parse_spec(spec, ALIGNED_ENV)


class AlignedLinear(nn.Linear):
    """An ``nn.Linear`` whose forward uses the rollout-quantized weight, and for int8 / fp8 the
    rollout-quantized input (STE gradients).

    Made by swapping the class of an existing ``nn.Linear`` (:func:`apply_aligned_forward`); the
    scheme is an attribute, the parameters are untouched (``state_dict`` keeps the full-precision
    weights, which the optimizer updates and verl syncs to the rollout).
    """

    suite_scheme: QuantScheme

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.suite_scheme
        # int8 / fp8 rollouts are W8A8: vLLM quantizes each token's input dynamically
        # (compressed-tensors W8A8 INT8: one scale per token; block FP8: one per token and per
        # 1 x block group, its W8A8BlockFp8LinearOp). bf16 / w4a16: x passes unchanged.
        group = s.block_size if s.precision == "fp8" and s.fp8_granularity == "block" else None
        x = fake_quant_act(x, s, ste=True, group_size=group)
        return F.linear(x, fake_quant(self.weight, s, ste=True), self.bias)


def apply_aligned_forward(model: nn.Module, scheme: QuantScheme) -> list[str]:
    """Make every block linear of ``model`` an :class:`AlignedLinear`; returns their names.

    Raises ``ValueError`` when the model has none (an architecture whose layer names the rollout
    quantizer does not know: nothing would be aligned) or when a block linear is not a plain
    ``nn.Linear`` (a LoRA or fused layer whose forward this cannot take over).
    """
    if QUANTIZERS[scheme.precision].lossless:
        raise ValueError(f"aligned forward with quant.precision={scheme.precision}: nothing to align")
    names = []
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in QUANTIZED_LINEARS:
            continue
        if type(module) not in (nn.Linear, AlignedLinear):
            raise ValueError(
                f"aligned forward: {name} is a {type(module).__name__}, not a plain nn.Linear; the QaRL aligned "
                "forward supports plain Hugging Face linears (no LoRA, no fused layers)"
            )
        module.__class__ = AlignedLinear
        module.suite_scheme = scheme
        names.append(name)
    if not names:
        raise ValueError(
            f"aligned forward: {type(model).__name__} has no block linears named {', '.join(QUANTIZED_LINEARS)}; "
            "the rollout quantizer (suite.verl.int8_hook) would not quantize it either"
        )
    return names


def _aligned_engine(base: type, scheme: QuantScheme) -> type:
    """A subclass of verl engine ``base`` whose trainable model uses the aligned forward."""

    class Aligned(base):
        suite_aligned_scheme = scheme

        def _build_module(self):
            module = super()._build_module()
            if not self.engine_config.forward_only:
                names = apply_aligned_forward(module, self.suite_aligned_scheme)
                log.info("suite aligned forward (%s): %d block linears fake-quantized", self.suite_aligned_scheme,
                         len(names))
            return module

    Aligned.__name__ = Aligned.__qualname__ = f"SuiteAligned{base.__name__}"
    Aligned.__module__ = __name__
    return Aligned


def install(spec: str | None = None) -> list[str]:
    """Swap verl's FSDP language-model engines for aligned ones; returns the backends swapped.

    ``spec`` defaults to ``$SUITE_ALIGNED_FORWARD``; nothing happens when it is empty. Idempotent.
    """
    spec = os.environ.get(ALIGNED_ENV, "") if spec is None else spec
    if not spec:
        return []
    scheme = parse_spec(spec)
    from verl.workers.engine import EngineRegistry

    engines = EngineRegistry._engines.get("language_model", {})
    swapped = []
    for backend in ALIGNED_BACKENDS:
        registry = engines.get(backend, {})
        for key, cls in list(registry.items()):
            if getattr(cls, "suite_aligned_scheme", None) is not None:
                cls = cls.__mro__[1]  # installed before: rebuild from verl's own class
            registry[key] = _aligned_engine(cls, scheme)
        if registry:
            swapped.append(backend)
    if not swapped:
        raise RuntimeError(
            f"{ALIGNED_ENV}={spec!r} but verl registers no FSDP language-model engine ({', '.join(ALIGNED_BACKENDS)}); "
            "the aligned forward supports verl's FSDP engines only"
        )
    return swapped


__all__ = ["ALIGNED_ENV", "AlignedLinear", "apply_aligned_forward", "install", "parse_spec", "scheme_spec"]
