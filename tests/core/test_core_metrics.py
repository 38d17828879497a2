"""suite.core.metrics: rollout_corr/* by hand, weight-update visibility by hand and properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from suite.core.metrics import model_update_visibility, rollout_corr_metrics, update_visibility
from suite.core.quant import QuantScheme

D = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=D)


def test_rollout_corr_hand() -> None:
    # one sequence, two tokens: rho = prox / behav = [2, 1]
    prox = t([[math.log(0.5), math.log(0.25)]])
    behav = t([[math.log(0.25), math.log(0.25)]])
    m = rollout_corr_metrics(prox, behav, torch.ones(1, 2, dtype=torch.bool))
    assert math.isclose(m["rollout_corr/kl"], -math.log(2) / 2, rel_tol=1e-12)
    assert math.isclose(m["rollout_corr/k3_kl"], (2 - math.log(2) - 1) / 2, rel_tol=1e-12)
    assert math.isclose(m["rollout_corr/chi2_token"], (4 + 1) / 2 - 1, rel_tol=1e-12)
    assert math.isclose(m["rollout_corr/chi2_seq"], 2.0**2 - 1, rel_tol=1e-12)
    # mean log-probs: prox = log(0.5*0.25)/2, behav = log(0.25); diff = behav - prox = -log(2)/2
    assert math.isclose(m["rollout_corr/log_ppl_diff"], -math.log(2) / 2, rel_tol=1e-12)
    assert math.isclose(m["rollout_corr/training_ppl"], math.sqrt(8), rel_tol=1e-12)
    assert math.isclose(m["rollout_corr/rollout_ppl"], 4.0, rel_tol=1e-12)
    assert math.isclose(m["rollout_corr/ppl_ratio"], 2**-0.5, rel_tol=1e-12)


def test_rollout_corr_zero_when_policies_agree() -> None:
    lp = -torch.rand(3, 5, generator=torch.Generator().manual_seed(0), dtype=D)
    m = rollout_corr_metrics(lp, lp.clone(), torch.ones(3, 5))
    for k in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff", "log_ppl_abs_diff"):
        assert m[f"rollout_corr/{k}"] == 0.0, k
    with pytest.raises(ValueError):
        rollout_corr_metrics(lp, lp, torch.zeros(3, 5))


def test_visibility_int8_hand() -> None:
    s = QuantScheme("int8")
    before = torch.tensor([[127.0, 1.0, 0.0]])  # scale 1
    # +0.3 and +0.4 stay on the same code: nothing visible
    m = update_visibility(before, torch.tensor([[127.0, 1.3, 0.4]]), s)
    assert m["quant/update_fp_changed_frac"] == pytest.approx(2 / 3, rel=1e-12)
    assert m["quant/update_visible_frac"] == 0.0
    assert m["quant/update_code_changed_frac"] == 0.0
    assert m["quant/update_step_ratio"] == pytest.approx((0.3 + 0.4) / 3, rel=1e-6)
    assert m["quant/update_norm_ratio"] == pytest.approx(math.sqrt((0.09 + 0.16) / 3), rel=1e-6)
    # +0.6 crosses the half-step: one visible entry
    m = update_visibility(before, torch.tensor([[127.0, 1.6, 0.0]]), s)
    assert m["quant/update_visible_frac"] == pytest.approx(1 / 3, rel=1e-12)
    assert m["quant/update_code_changed_frac"] == pytest.approx(1 / 3, rel=1e-12)
    # the row max moves: scale changes, every code stays, the big entry's value moves
    m = update_visibility(torch.tensor([[127.0, 0.0]]), torch.tensor([[128.0, 0.0]]), s)
    assert m["quant/update_visible_frac"] == 0.5
    assert m["quant/update_code_changed_frac"] == 0.0


def test_visibility_zero_row_has_no_step() -> None:
    before = torch.tensor([[0.0, 0.0], [2.0, 1.0]])
    after = torch.tensor([[0.5, 0.0], [2.0, 1.0]])
    m = update_visibility(before, after, QuantScheme("int8"))
    assert m["quant/update_step_ratio"] == 0.0  # the step-0 entries are left out of the mean
    # norm ratio: ||dW|| = 0.5 over ||step|| = sqrt(2) * 2/127 (row 1 only; row 0 has step 0)
    assert m["quant/update_norm_ratio"] == pytest.approx(0.5 / (math.sqrt(2) * 2 / 127), rel=1e-6)
    assert m["quant/update_visible_frac"] == 0.25


def test_model_visibility_is_entry_weighted() -> None:
    g = torch.Generator().manual_seed(0)
    before = {"a": torch.randn(4, 8, generator=g), "b": torch.randn(2, 16, generator=g) * 3, "c": torch.randn(1, 8, generator=g)}
    after = {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in before.items()}
    s = QuantScheme("int8")
    per = {k: update_visibility(before[k], after[k], s) for k in before}
    n = {k: before[k].numel() for k in before}
    pooled = model_update_visibility(before, after, s)
    for key in ("quant/update_visible_frac", "quant/update_step_ratio", "quant/update_fp_changed_frac"):
        ref = sum(per[k][key] * n[k] for k in before) / sum(n.values())
        assert pooled[key] == pytest.approx(ref, rel=1e-12), key
    upd = sum(per[k]["quant/update_rms"] ** 2 * n[k] for k in before)
    step = sum(per[k]["quant/step_rms"] ** 2 * n[k] for k in before)
    assert pooled["quant/update_norm_ratio"] == pytest.approx(math.sqrt(upd / step), rel=1e-12)
    with pytest.raises(ValueError, match="differ"):
        model_update_visibility(before, {"a": after["a"]}, s)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), s=st.floats(1.1, 3.0), scheme=st.sampled_from([
    QuantScheme("int8"), QuantScheme("w4a16", group_size=8), QuantScheme("fp8", "per_channel")]))
def test_uaq_sgd_update_step_ratio_grows_by_s_squared(seed: int, s: float, scheme: QuantScheme) -> None:
    """QuRL Sec. 3.3: under UAQ the weight is W/s and an SGD update (gradient x s) is s dW, so
    |update| / step grows by s**2 (exactly for the uniform int8/w4 grids; for FP8 the step
    at W/s is the step at W divided by s too, since scales are per channel)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(6, 16, generator=g, dtype=D) * 0.05
    dw = torch.randn(6, 16, generator=g, dtype=D) * 1e-4
    plain = update_visibility(w, w + dw, scheme)
    uaq = update_visibility(w / s, w / s + s * dw, scheme)
    assert uaq["quant/update_step_ratio"] == pytest.approx(s**2 * plain["quant/update_step_ratio"], rel=1e-9)
    assert uaq["quant/update_norm_ratio"] == pytest.approx(s**2 * plain["quant/update_norm_ratio"], rel=1e-9)


def test_visibility_fp32_sees_everything() -> None:
    before = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    after = before.clone()
    after[0, 0] += 1e-3
    m = update_visibility(before, after, QuantScheme("fp32"))
    assert m["quant/update_visible_frac"] == 1 / 12 and m["quant/update_fp_changed_frac"] == 1 / 12
