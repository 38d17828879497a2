"""suite.core.outliers: the activation-outlier transform (inverse SmoothQuant) by hand, its
invariance (fp32 logits and gradients) and what it does to per-token INT8 activations."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from suite.core.outliers import (
    apply_outliers,
    outlier_channels,
    outlier_pairs,
    outlier_scale,
    outlier_transform,
    undo_outliers,
)
from suite.core.quant import QuantScheme, fake_quant_act
from suite.embedded.model import PRESETS, ModelConfig, Transformer


def test_channels_and_scale_by_hand() -> None:
    assert outlier_channels(10, 3).tolist() == [0, 3, 6]
    assert outlier_channels(8, 0).tolist() == []
    assert outlier_scale(4, 2, 8.0).tolist() == [8.0, 1.0, 8.0, 1.0]
    with pytest.raises(ValueError, match="k=9"):
        outlier_channels(8, 9)
    with pytest.raises(ValueError, match="alpha"):
        outlier_scale(4, 2, 0.0)


def test_transform_by_hand() -> None:
    params = {"n.weight": torch.tensor([1.0, 2.0, 3.0, 4.0]), "a.weight": torch.tensor([[1.0, 2.0, 3.0, 4.0]]),
              "other": torch.tensor([5.0])}
    out = outlier_transform(params, [("n", ["a"])], alpha=2.0, k=2)  # channels 0, 2
    assert out["n.weight"].tolist() == [2.0, 2.0, 6.0, 4.0]
    assert out["a.weight"].tolist() == [[0.5, 2.0, 1.5, 4.0]]
    assert out["other"] is params["other"] and params["n.weight"].tolist() == [1.0, 2.0, 3.0, 4.0]
    # a dict of the fed weights alone is transformed as in the full model
    assert outlier_transform({"a.weight": params["a.weight"]}, [("n", ["a"])], 2.0, 2)["a.weight"].tolist() == \
        [[0.5, 2.0, 1.5, 4.0]]


def _model() -> Transformer:
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=40, **PRESETS["tiny"]))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(4.0)  # away from the near-uniform init, as tests/embedded/test_engine.py
    return m.eval()


TOKENS = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("alpha", [16.0, 10.0])
def test_fp32_logits_and_gradients_unchanged(alpha: float) -> None:
    m = _model()
    ref = m(TOKENS)
    pairs = outlier_pairs(m)
    assert sorted(n for n, _ in pairs) == sorted(f"layers.{i}.{s}" for i in range(4) for s in ("attn_norm", "mlp_norm"))
    params = dict(m.named_parameters())
    out = torch.func.functional_call(m, outlier_transform(params, pairs, alpha, 4), (TOKENS,))
    assert_close(out, ref)  # float32 rounding at most (a power of two: bit for bit)
    if alpha == 16.0:
        assert torch.equal(out, ref)
    # the gradients that reach the untransformed weights through the transform are the plain ones
    g_ref = torch.autograd.grad(ref.logsumexp(-1).sum(), list(params.values()))
    g = torch.autograd.grad(out.logsumexp(-1).sum(), list(params.values()))
    for a, b in zip(g, g_ref):
        assert_close(a, b)


def _attn_norm_out(m: Transformer) -> torch.Tensor:
    seen = []
    h = m.layers[0].attn_norm.register_forward_hook(lambda mod, args, out: seen.append(out.detach()))
    with torch.no_grad():
        m(TOKENS)
    h.remove()
    return seen[0].reshape(-1, seen[0].shape[-1])  # [M, D]


def test_in_place_round_trip_and_int8_activation_error_grows() -> None:
    m = _model()
    ref = m(TOKENS).detach()
    state = {k: v.clone() for k, v in m.state_dict().items()}
    int8 = QuantScheme("int8")

    def rel_err(x: torch.Tensor) -> float:  # per-token INT8 round trip of what q/k/v read
        return float((fake_quant_act(x, int8) - x).norm() / x.norm())

    x0 = _attn_norm_out(m)
    errs = []
    for alpha in (4.0, 16.0, 64.0):
        apply_outliers(m, alpha, 4)
        with torch.no_grad():
            assert_close(m(TOKENS), ref)
        x = _attn_norm_out(m)
        a = outlier_scale(x.shape[-1], 4, alpha)
        assert_close(x / a, x0)  # the same activations, the chosen channels alpha times larger
        # what the fed linear computes from them: its input columns carry 1 / a, so (x / a) is the
        # signal; per-token INT8 sees x, whose scale the outlier channels set
        errs.append(float(((fake_quant_act(x, int8) - x) / a).norm() / x0.norm()))
        undo_outliers(m, alpha, 4)
        for k, v in m.state_dict().items():
            assert torch.equal(v, state[k]), k  # powers of two: bit-exact round trip
    base = rel_err(x0)
    assert base < errs[0] < errs[1] < errs[2]
    assert errs[2] > 10 * base
