"""The embedded run's parts, each built from plain arguments (torchtune's recipe shape).

`suite.embedded.trainer.EmbeddedRun` reads the config once and calls these; each takes only
the values it needs, so a test or a notebook builds one part without composing a config.
The order of the calls is part of the numerics: `policy` seeds torch's global generator
before it builds the actor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from suite.core.quant import QuantScheme
from suite.core.uaq import apply_uaq, uaq_param_groups
from suite.embedded.actor import Critic, quantized_weight_names
from suite.embedded.engine import RolloutEngine
from suite.embedded.model import ModelConfig, Transformer


def policy(model_cfg: ModelConfig, state: dict, *, seed: int, uaq_s: float,
           lm_head: bool = False) -> tuple[Transformer, set[str]]:
    """The actor from a warm-start state, UAQ-rescaled when ``uaq_s != 1``, and the names of
    its quantized weights (the ones the rollout copy quantizes; ``lm_head`` too when it is)."""
    torch.manual_seed(seed)
    actor = Transformer(model_cfg)
    actor.load_state_dict(state)
    # UAQ: one-time invariant rescaling before RL (QuRL §4.2); exact in real arithmetic.
    if uaq_s != 1.0:
        apply_uaq(actor, uaq_s, "embedded")
    return actor, quantized_weight_names(actor, lm_head)


def optimizer(actor: Transformer, *, lr: float, betas: Sequence[float], weight_decay: float,
              group_lr_s: float = 1.0) -> torch.optim.AdamW:
    """AdamW over the actor; ``group_lr_s != 1`` is the UAQ control: UAQ's per-group Adam
    rates without the rescaling (suite.core.uaq.uaq_param_groups)."""
    params = actor.parameters()
    if group_lr_s != 1.0:
        params = uaq_param_groups(actor, lr, group_lr_s, "embedded", weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)


def reference(actor: Transformer, model_cfg: ModelConfig) -> Transformer:
    """A frozen copy of the actor at the start of RL (the KL-to-reference term)."""
    ref = Transformer(model_cfg)
    ref.load_state_dict(actor.state_dict())
    ref.requires_grad_(False)
    return ref


def critic(model_cfg: ModelConfig, state: dict, *, lr: float,
           betas: Sequence[float]) -> tuple[Critic, torch.optim.AdamW]:
    """PPO's critic, its trunk from the warm-start state, and its AdamW."""
    c = Critic(model_cfg)
    c.trunk.load_state_dict(state)
    return c, torch.optim.AdamW(c.parameters(), lr=lr, betas=tuple(betas))


def engines(actor: Transformer, scheme: QuantScheme, *, kernels: str, bf16_kernels: str, lm_head: bool = False,
            outlier_alpha: float = 1.0, outlier_channels: int = 0) -> tuple[RolloutEngine, RolloutEngine]:
    """The quantized rollout copy (its lm_head quantized, its weights outlier-transformed at each
    sync when asked: RolloutEngine) and the full-precision copy that scores held-out prompts."""
    return (RolloutEngine(actor, scheme, kernels=kernels, bf16_kernels=bf16_kernels, lm_head=lm_head,
                          outlier_alpha=outlier_alpha, outlier_channels=outlier_channels),
            RolloutEngine(actor, QuantScheme(precision="fp32")))


def generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """The run's two RNG streams: rollout sampling, and mini-batch shuffling."""
    return (torch.Generator().manual_seed(seed * 1_000_003 + 1),
            torch.Generator().manual_seed(seed * 1_000_003 + 2))
