"""suite.core.metrics: rollout_corr/* by hand, ratio quantiles and error tokens by hand and
against independent references, weight-update visibility by hand and properties."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from suite.core.metrics import (
    error_token_metrics,
    longest_token_run,
    masked_quantiles,
    mismatch_ratio_metrics,
    model_update_visibility,
    ngram_repetition_rate,
    policy_ratio_metrics,
    rollout_corr_metrics,
    update_visibility,
)
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


# ----------------------------------------------------------------------------- ratio distribution


def _shuffled_log_ratios(n_pad: int = 7):
    """101 valid tokens with log ratio (k - 50) / 25, k = 0..100, in a shuffled [3, 36] layout;
    the padding holds log ratio 30, which a quantile over the mask must never see."""
    vals = [(k - 50) / 25 for k in range(101)]
    random.Random(0).shuffle(vals)
    log_ratio = torch.full((3, 36), 30.0, dtype=D)  # [B, T]
    mask = torch.zeros(3, 36, dtype=torch.bool)
    lengths = [36, 36, 29]  # 101 valid tokens, right-padded
    i = 0
    for b, n in enumerate(lengths):
        log_ratio[b, :n] = t(vals[i : i + n])
        mask[b, :n] = True
        i += n
    return log_ratio, mask


def test_mismatch_ratio_quantiles_and_tails_hand() -> None:
    log_r, mask = _shuffled_log_ratios()
    behav = -torch.rand(3, 36, generator=torch.Generator().manual_seed(1), dtype=D) * 4
    m = mismatch_ratio_metrics(behav + log_r, behav, mask)
    # 101 sorted values: the q-quantile sits exactly on rank 100 q, i.e. k = 1, 50, 99
    assert m["rollout_corr/ratio_p1"] == pytest.approx(math.exp(-49 / 25), rel=1e-12)
    assert m["rollout_corr/ratio_p50"] == pytest.approx(1.0, rel=1e-12)
    assert m["rollout_corr/ratio_p99"] == pytest.approx(math.exp(49 / 25), rel=1e-12)
    # r < 0.5 <=> (k - 50)/25 < -log 2 = -0.693 <=> k <= 32: 33 tokens; r > 2 <=> k >= 68: 33 tokens
    assert m["rollout_corr/ratio_frac_below_0.5"] == pytest.approx(33 / 101, rel=1e-12)
    assert m["rollout_corr/ratio_frac_above_2"] == pytest.approx(33 / 101, rel=1e-12)
    assert set(m) == {"rollout_corr/ratio_p1", "rollout_corr/ratio_p50", "rollout_corr/ratio_p99",
                      "rollout_corr/ratio_frac_below_0.5", "rollout_corr/ratio_frac_above_2"}


def test_policy_ratio_quantiles_hand() -> None:
    log_R, mask = _shuffled_log_ratios()
    prox = -torch.rand(3, 36, generator=torch.Generator().manual_seed(2), dtype=D) * 4
    m = policy_ratio_metrics((prox + log_R).requires_grad_(True), prox, mask)
    assert m == pytest.approx({"actor/ratio_p1": math.exp(-49 / 25), "actor/ratio_p50": 1.0,
                               "actor/ratio_p99": math.exp(49 / 25)}, rel=1e-12)


def test_masked_quantiles_equal_numpy_and_torch_with_interpolation() -> None:
    g = torch.Generator().manual_seed(3)
    values = torch.randn(5, 13, generator=g, dtype=D)
    mask = torch.rand(5, 13, generator=g) < 0.6  # ragged, not a prefix
    qs = [0.0, 0.01, 0.37, 0.5, 0.99, 1.0]
    ours = masked_quantiles(values, mask, qs)
    valid = values[mask]
    torch.testing.assert_close(ours, torch.quantile(valid, torch.tensor(qs, dtype=D)))
    torch.testing.assert_close(ours, torch.from_numpy(np.quantile(valid.numpy(), qs)))
    # a ratio quantile is taken on r itself (linear between neighbouring r), not on log r
    log_r = torch.log(t([[1.0, 2.0, 4.0, 8.0]]))
    p50 = mismatch_ratio_metrics(log_r, torch.zeros_like(log_r), torch.ones(1, 4))["rollout_corr/ratio_p50"]
    assert p50 == pytest.approx(3.0, rel=1e-12)
    with pytest.raises(ValueError, match="no valid token"):
        masked_quantiles(values, torch.zeros_like(mask), qs)


def test_ratio_quantiles_clamp_log_ratio_like_verl() -> None:
    m = policy_ratio_metrics(t([[25.0, -25.0, 0.0]]), torch.zeros(1, 3, dtype=D), torch.ones(1, 3))
    assert m["actor/ratio_p1"] == pytest.approx(math.exp(-20) + 0.02 * (1 - math.exp(-20)), rel=1e-12)
    assert m["actor/ratio_p99"] == pytest.approx(1 + 0.98 * (math.exp(20) - 1), rel=1e-12)


# ----------------------------------------------------------------------------- error tokens


def _reference_rep_rate(ids: list[int], valid: list[bool], n: int) -> float:
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1) if all(valid[i : i + n])]
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def test_ngram_repetition_rate_hand() -> None:
    pad = 0
    rows = [
        [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8],  # 9 windows, 4 distinct: 5/9
        [1, 2, 3, 4, 1, 2, 3, 4, 9, pad, pad, pad],  # 1234 2341 3412 4123 1234 2349: 1/6
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],  # one token 12 times: 8/9
        [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3],  # valid 1 2 3 1 2 3 only: 1231 2312 3123, all distinct
        [4, 4, 4, pad, pad, pad, pad, pad, pad, pad, pad, pad],  # fewer than 4 tokens: no 4-gram
    ]
    lengths = [12, 9, 12, 6, 3]
    tokens = torch.tensor(rows)  # [5, 12]
    mask = torch.arange(12)[None, :] < torch.tensor(lengths)[:, None]  # [5, 12]
    rate = ngram_repetition_rate(tokens, mask)
    torch.testing.assert_close(rate, t([5 / 9, 1 / 6, 8 / 9, 0.0, 0.0]), rtol=0, atol=1e-15)
    # other n: [5 6 7 8]*3 has 11 bigrams, 4 distinct -> 7/11
    assert float(ngram_repetition_rate(tokens[:1], mask[:1], n=2)) == pytest.approx(7 / 11, rel=1e-15)
    # a response shorter than the window array is not an error
    assert ngram_repetition_rate(tokens[:, :3], mask[:, :3]).tolist() == [0.0] * 5


def test_ngram_repetition_rate_equals_a_set_reference() -> None:
    rng = random.Random(4)
    B, R = 12, 40
    ids = [[rng.randrange(3) for _ in range(R)] for _ in range(B)]  # vocabulary of 3: many repeats
    valid = [[rng.random() < 0.85 for _ in range(R)] for _ in range(B)]  # holes, not only a prefix
    for n in (1, 3, 4):
        ours = ngram_repetition_rate(torch.tensor(ids), torch.tensor(valid), n)
        ref = t([_reference_rep_rate(ids[b], valid[b], n) for b in range(B)])
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-15)
        assert 0 < float(ours.mean()) < 1  # non-trivial rates


def test_longest_token_run_hand() -> None:
    tokens = torch.tensor([[3, 3, 3, 4, 4, 0], [7, 7, 7, 7, 7, 7], [1, 2, 1, 2, 1, 2], [9, 9, 9, 9, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1] * 6, [0] * 6]).bool()
    # row 1: the masked-out 7s do not extend the run; row 3: empty response
    assert longest_token_run(tokens, mask).tolist() == [3, 4, 1, 0]
    # a hole splits a run: 5 5 _ 5 5 5
    assert longest_token_run(torch.tensor([[5] * 6]), torch.tensor([[1, 1, 0, 1, 1, 1]]).bool()).tolist() == [3]


def test_error_token_metrics_hand() -> None:
    loop = [5, 6, 7, 8] * 3  # rate 5/9 >= 0.5
    tokens = torch.tensor([loop, loop, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1] * 12, [1] * 12, [1] * 12, [1] * 5 + [0] * 7]).bool()
    # row 3: 2 2 2 2 2 has two 4-grams, one distinct: rate exactly 0.5, flagged (>=) when truncated
    truncated = torch.tensor([True, False, True, True])
    m = error_token_metrics(tokens, mask, truncated)
    assert m["response/rep4_rate/mean"] == pytest.approx((5 / 9 + 5 / 9 + 0 + 0.5) / 4, rel=1e-15)
    assert m["response/rep4_rate/max"] == pytest.approx(5 / 9, rel=1e-15)
    assert m["response/longest_run/mean"] == pytest.approx((1 + 1 + 1 + 5) / 4, rel=1e-15)
    assert m["response/longest_run/max"] == 5.0
    # flagged: row 0 (truncated loop) and row 3; row 1 loops but stopped; row 2 truncated, no repeats
    assert m["response/error_ratio"] == 0.5
    assert error_token_metrics(tokens, mask, torch.zeros(4, dtype=torch.bool))["response/error_ratio"] == 0.0


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
    before = {"a": torch.randn(4, 8, generator=g), "b": torch.randn(2, 16, generator=g) * 3,
              "c": torch.randn(1, 8, generator=g)}
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
