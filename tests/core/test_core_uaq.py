"""suite.core.uaq: invariance of the function, exact inverse, validation before mutation."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from suite.core.uaq import MAPPINGS, apply_uaq, undo_uaq


# ----------------------------------------------------------------------------- stand-in model
# The module names of suite.embedded.model (docs/architecture.md), written here so these tests
# do not depend on the model file. A real (small) forward: RMSNorm, causal attention, SwiGLU.


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attn(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = (w(x).view(B, T, self.h, D // self.h).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))  # [B, H, T, Dh]
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, Dh]
        return self.wo(y.transpose(1, 2).reshape(B, T, D))  # [B, T, D]


class MLP(nn.Module):
    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.w_gate, self.w_up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.w_down = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(nn.functional.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, d: int, h: int, f: int, norm=RMSNorm) -> None:
        super().__init__()
        self.attn_norm, self.attn = norm(d), Attn(d, h)
        self.mlp_norm, self.mlp = norm(d), MLP(d, f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=17, d=16, h=2, f=24, n_layers=2, norm=RMSNorm) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, h, f, norm) for _ in range(n_layers))
        self.norm = norm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def _model(seed: int = 0, norm=RMSNorm) -> TinyLM:
    torch.manual_seed(seed)
    m = TinyLM(norm=norm).double()
    with torch.no_grad():  # non-trivial gains (and biases for LayerNorm)
        for name, p in m.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.2, 0.2)
    return m


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 17, (3, 11), generator=torch.Generator().manual_seed(seed))


def _state(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _assert_rel(a: torch.Tensor, b: torch.Tensor, rel: float) -> None:
    err = (a - b).abs().max().item()
    assert err <= rel * b.abs().max().item(), err / b.abs().max().item()


# ----------------------------------------------------------------------------- embedded names


def test_apply_scales_exactly_the_mapped_parameters() -> None:
    m = _model()
    before = _state(m)
    s = 2.0  # power of two: the scaling is exact in floating point
    apply_uaq(m, s, "embedded")
    after = _state(m)
    scaled_gain = {f"layers.{i}.{n}.weight" for i in range(2) for n in ("attn_norm", "mlp_norm")}
    scaled_w = {
        f"layers.{i}.{n}.weight" for i in range(2) for n in ("attn.wq", "attn.wk", "attn.wv", "mlp.w_gate", "mlp.w_up")
    }
    for k in before:
        if k in scaled_gain:
            assert torch.equal(after[k], before[k] * s), k
        elif k in scaled_w:
            assert torch.equal(after[k], before[k] / s), k
        else:  # wo, w_down, final norm, lm_head, tok_emb untouched
            assert torch.equal(after[k], before[k]), k


@settings(max_examples=15, deadline=None)
@given(s=st.floats(0.25, 4.0), seed=st.integers(0, 1000))
def test_logits_invariant_float64(s: float, seed: int) -> None:
    m = _model(seed)
    tok = _tokens(seed)
    with torch.no_grad():
        ref = m(tok)
        apply_uaq(m, s, "embedded")
        out = m(tok)
    _assert_rel(out, ref, 1e-9)


@settings(max_examples=25, deadline=None)
@given(s=st.floats(0.1, 10.0), seed=st.integers(0, 1000))
def test_undo_restores_every_parameter(s: float, seed: int) -> None:
    m = _model(seed)
    before = _state(m)
    apply_uaq(m, s, "embedded")
    undo_uaq(m, s, "embedded")
    after = _state(m)
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=4e-16, atol=0)  # within 1 ulp (float64)


@pytest.mark.parametrize("k", [-3, -1, 1, 2])
def test_undo_is_bit_exact_for_powers_of_two(k: int) -> None:
    m = _model()
    m.float()
    before = _state(m)
    apply_uaq(m, 2.0**k, "embedded")
    undo_uaq(m, 2.0**k, "embedded")
    for key, v in _state(m).items():
        assert torch.equal(v, before[key]), key


def test_layernorm_bias_is_scaled_too() -> None:
    m = _model(norm=lambda d: nn.LayerNorm(d))
    tok = _tokens()
    with torch.no_grad():
        ref = m(tok)
        apply_uaq(m, 1.5, "embedded")
        out = m(tok)
    _assert_rel(out, ref, 1e-9)


def test_dict_mapping_equals_named_mapping() -> None:
    a, b = _model(3), _model(3)
    apply_uaq(a, 1.5, "embedded")
    apply_uaq(b, 1.5, {"attn_norm": ["attn.wq", "attn.wk", "attn.wv"], "mlp_norm": ["mlp.w_gate", "mlp.w_up"]})
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("s", [0.0, -1.5, float("nan"), float("inf")])
def test_bad_scale_raises(s: float) -> None:
    m = _model()
    before = _state(m)
    with pytest.raises(ValueError, match="s="):
        apply_uaq(m, s, "embedded")
    with pytest.raises(ValueError, match="s="):
        undo_uaq(m, s, "embedded")
    for k, v in _state(m).items():
        assert torch.equal(v, before[k])


@pytest.mark.parametrize(
    "mapping, match",
    [
        ({"attn_norm": ["attn.wq", "attn.w_missing"]}, "attn.w_missing"),  # missing linear
        ({"mlp_norm": ["mlp.w_gate", "mlp.w_down"]}, "in_features"),  # w_down is fed by f, not d
        ({"no_such_norm": ["attn.wq"]}, "matched no norm"),
        ("gpt2", "allowed"),
        ({"attn_norm": ["attn.wq", "attn.wq"]}, "twice"),
    ],
)
def test_bad_mapping_raises_before_any_change(mapping, match: str) -> None:
    m = _model()
    before = _state(m)
    with pytest.raises(ValueError, match=match):
        apply_uaq(m, 1.5, mapping)
    for k, v in _state(m).items():
        assert torch.equal(v, before[k]), k  # no half-transformed model


def test_missing_module_in_last_block_leaves_first_blocks_untouched() -> None:
    m = _model()
    del m.layers[1].mlp.w_up  # the last pair to be processed is broken
    before = _state(m)
    with pytest.raises(ValueError, match="layers.1.mlp.w_up"):
        apply_uaq(m, 1.5, "embedded")
    for k, v in _state(m).items():
        assert torch.equal(v, before[k]), k


# ----------------------------------------------------------------------------- Hugging Face


def _hf(kind: str) -> nn.Module:
    import transformers

    common = dict(
        vocab_size=31, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    model = model.double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_hf_logits_invariant_and_undo(kind: str) -> None:
    model = _hf(kind)
    tok = torch.randint(0, 31, (2, 9), generator=torch.Generator().manual_seed(0))
    before = _state(model)
    with torch.no_grad():
        ref = model(input_ids=tok).logits
        pairs = apply_uaq(model, 1.5, kind)
        out = model(input_ids=tok).logits
    assert len(pairs) == 4  # 2 layers x (input_layernorm, post_attention_layernorm)
    assert pairs[0][1][0].endswith("self_attn.q_proj")
    _assert_rel(out, ref, 1e-9)
    q = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(model.state_dict()[q], before[q] / 1.5)
    undo_uaq(model, 1.5, kind)
    for k, v in _state(model).items():
        torch.testing.assert_close(v, before[k], rtol=4e-16, atol=0)


def test_named_mappings_cover_the_three_families() -> None:
    assert set(MAPPINGS) == {"embedded", "llama", "qwen2"}
    assert MAPPINGS["qwen2"] == MAPPINGS["llama"]


@pytest.mark.parametrize("s, wd", [(1.5, 0.0), (2.0, 0.1)])
def test_uaq_under_adamw_is_a_per_group_learning_rate(s, wd) -> None:
    """UAQ s, trained with AdamW at lr, then undone, equals plain training with the per-group
    learning rates (and decays) of uaq_param_groups: the control that tells UAQ apart from an LR
    change. Exact up to Adam's eps (set tiny here) and float rounding."""
    from suite.core.uaq import uaq_param_groups
    from suite.embedded.model import ModelConfig, Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=17, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=16)
    base = Transformer(cfg)
    uaq, ctrl = copy.deepcopy(base), copy.deepcopy(base)
    apply_uaq(uaq, s, "embedded")
    lr, eps = 1e-2, 1e-14
    opt_u = torch.optim.AdamW(uaq.parameters(), lr=lr, eps=eps, weight_decay=wd)
    opt_c = torch.optim.AdamW(uaq_param_groups(ctrl, lr, s, "embedded", weight_decay=wd), lr=lr, eps=eps)
    assert [g["lr"] for g in opt_c.param_groups] == [lr * s, lr / s, lr]
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        tokens = torch.randint(0, 17, (4, 12), generator=g)
        for model, opt in ((uaq, opt_u), (ctrl, opt_c)):
            loss = torch.nn.functional.cross_entropy(model(tokens)[:, :-1].reshape(-1, 17), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    undo_uaq(uaq, s, "embedded")
    moved = 0.0
    for (name, pu), pc, p0 in zip(uaq.named_parameters(), ctrl.parameters(), base.parameters()):
        torch.testing.assert_close(pu, pc, rtol=1e-4, atol=1e-6, msg=name)
        moved = max(moved, (pc - p0).abs().max().item())
    assert moved > 1e-2  # they trained (5 Adam steps at lr 1e-2)
    # plain AdamW at lr (no per-group rates) is measurably different: the control is not a no-op
    plain = copy.deepcopy(base)
    opt_p = torch.optim.AdamW(plain.parameters(), lr=lr, eps=eps, weight_decay=wd)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        tokens = torch.randint(0, 17, (4, 12), generator=g)
        loss = torch.nn.functional.cross_entropy(plain(tokens)[:, :-1].reshape(-1, 17), tokens[:, 1:].reshape(-1))
        opt_p.zero_grad()
        loss.backward()
        opt_p.step()
    assert max((a - b).abs().max().item() for a, b in zip(plain.parameters(), ctrl.parameters())) > 1e-3
