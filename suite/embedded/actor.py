"""The trainer's side of the actor: its log-probs (plain or QaRL's aligned forward) and PPO's critic.

The log-probs are pi_theta of the update and the recomputed pi_prox (decoupled PPO, Hilton et
al. 2021); with the aligned forward they are computed through the rollout's own quantizer
(suite.core.quant), so the ratio sees what the rollout saw.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import torch

from suite.core.quant import W8A8_PRECISIONS, QuantScheme, fake_quant, fake_quant_act
from suite.embedded.batch import Batch
from suite.embedded.model import ModelConfig, Transformer, response_logprobs


class Critic(torch.nn.Module):
    """PPO critic: a decoder trunk (initialised from the warm start) with a scalar head, as verl's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.trunk = Transformer(cfg)
        self.head = torch.nn.Linear(cfg.d_model, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, tokens, attention_mask, start: int) -> torch.Tensor:
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [N, P + R]
        h = self.trunk.hidden(tokens, positions=positions, attention_mask=attention_mask)  # [N, P + R, D]
        v = self.head(h).squeeze(-1).float()  # [N, P + R]
        # V of the state each response token was generated from (verl: values[:, -R-1:-1]).
        return v[:, start - 1 : -1]  # [N, R]


def quantized_weight_names(model: Transformer, lm_head: bool = False) -> list[str]:
    """Weights the rollout engine quantizes: every block linear (not embeddings, norms), and
    ``lm_head`` when it is quantized too (quant.lm_head)."""
    return [
        f"{name}.weight"
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and (name.startswith("layers.") or (lm_head and name == "lm_head"))
    ]


@contextmanager
def act_quant_hooks(model: Transformer, qnames: list[str], scheme: QuantScheme):
    """While open, every block linear of ``model`` fake-quantizes its input per token (STE), as
    the W8A8 rollout's Int8Linear / Fp8Linear do: QaRL's aligned forward for int8 / fp8 is
    W8A8, not weight-only. Other precisions keep 16-bit activations: no hooks."""
    if scheme.precision not in W8A8_PRECISIONS:
        yield
        return

    def hook(_mod, args):
        return (fake_quant_act(args[0], scheme, ste=True), *args[1:])

    handles = [model.get_submodule(n.removesuffix(".weight")).register_forward_pre_hook(hook) for n in qnames]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def trainer_logprobs(model: Transformer, b: Batch, temperature: float, *, bf16: bool, with_entropy: bool = False,
                     aligned_scheme: QuantScheme | None = None, qnames: list[str] = (),
                     transform: Callable[[dict], dict] | None = None):
    """log pi(token) [N, R] (and the entropy) of ``b``'s responses under the trainer's forward: bf16
    autocast like verl's FSDP mixed precision when ``bf16``.

    With QaRL's aligned forward (``aligned_scheme``, arXiv 2604.07853) the block linears
    ``qnames`` compute as the rollout's: weights fake-quantized, and for int8 / fp8 (W8A8) their
    inputs too, per token; STE gradients. ``transform`` (parameter dict -> parameter dict) is what
    the rollout's sync puts on the weights before quantizing them (suite.core.outliers
    ``outlier_transform``); it is differentiable, so the gradients reach the untransformed weights."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        fn, act_hooks = model, nullcontext()
        if aligned_scheme is not None:
            params = dict(model.named_parameters())
            if transform is not None:
                params = transform(params)
            for name in qnames:
                params[name] = fake_quant(params[name], aligned_scheme, ste=True)

            def fn(*args, **kwargs):  # response_logprobs only calls model(...)
                return torch.func.functional_call(model, params, args, kwargs)

            act_hooks = act_quant_hooks(model, qnames, aligned_scheme)
        with act_hooks:
            logp, ent = response_logprobs(fn, b.tokens, b.attention_mask, b.start, temperature,
                                          with_entropy=with_entropy)
    return logp.float(), (ent.float() if ent is not None else None)
