"""The embedded run's parts built from plain arguments, without a config (suite.embedded.parts)."""

import torch

from suite.core.quant import QuantScheme
from suite.core.uaq import uaq_pairs
from suite.embedded import parts
from suite.embedded.model import PRESETS, ModelConfig, Transformer
from suite.embedded.tokenizer import CharTokenizer


def _model_cfg() -> ModelConfig:
    return ModelConfig(vocab_size=CharTokenizer().vocab_size, **PRESETS["tiny"])


def test_policy_is_seeded_and_uaq_rescales_without_changing_the_function():
    mc = _model_cfg()
    torch.manual_seed(1)
    state = Transformer(mc).state_dict()
    plain, qnames = parts.policy(mc, state, seed=0, uaq_s=1.0)
    scaled, _ = parts.policy(mc, state, seed=0, uaq_s=1.5)
    assert qnames and all(n.endswith(".weight") for n in qnames)
    norm, linears = uaq_pairs(plain, "embedded")[0]
    w = dict(plain.named_parameters())[f"{linears[0]}.weight"]
    w_s = dict(scaled.named_parameters())[f"{linears[0]}.weight"]
    torch.testing.assert_close(w_s, w / 1.5)  # the fed linear is divided by s ...
    g, g_s = dict(plain.named_parameters())[f"{norm}.weight"], dict(scaled.named_parameters())[f"{norm}.weight"]
    torch.testing.assert_close(g_s, g * 1.5)  # ... and its norm gain multiplied: the function is unchanged
    tokens = torch.randint(0, mc.vocab_size, (2, 12))
    mask = torch.ones_like(tokens)
    with torch.no_grad():
        torch.testing.assert_close(scaled(tokens, attention_mask=mask), plain(tokens, attention_mask=mask),
                                   rtol=1e-4, atol=1e-4)


def test_optimizer_control_groups_and_critic_trunk():
    mc = _model_cfg()
    actor, _ = parts.policy(mc, Transformer(mc).state_dict(), seed=0, uaq_s=1.0)
    plain = parts.optimizer(actor, lr=1e-3, betas=[0.9, 0.99], weight_decay=0.0)
    assert [g["lr"] for g in plain.param_groups] == [1e-3] and plain.param_groups[0]["betas"] == (0.9, 0.99)
    control = parts.optimizer(actor, lr=1e-3, betas=[0.9, 0.99], weight_decay=0.1, group_lr_s=2.0)
    by_group = {g["uaq_group"]: (g["lr"], g["weight_decay"]) for g in control.param_groups}
    assert by_group == {"fed_linears": (2e-3, 0.05), "norm_gains": (5e-4, 0.2), "rest": (1e-3, 0.1)}
    state = actor.state_dict()
    critic, critic_opt = parts.critic(mc, state, lr=1e-2, betas=(0.9, 0.99))
    for k, v in critic.trunk.state_dict().items():
        assert torch.equal(v, state[k])
    assert critic_opt.param_groups[0]["lr"] == 1e-2
    ref = parts.reference(actor, mc)
    assert not any(p.requires_grad for p in ref.parameters())


def test_engines_and_generators():
    mc = _model_cfg()
    actor, _ = parts.policy(mc, Transformer(mc).state_dict(), seed=0, uaq_s=1.0)
    rollout, evaluator = parts.engines(actor, QuantScheme(precision="int8"), kernels="emulated",
                                       bf16_kernels="emulated")
    assert rollout.scheme.precision == "int8" and evaluator.scheme.precision == "fp32"
    a, b = parts.generators(3)
    a2, _ = parts.generators(3)
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=a2))
    assert not torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))
