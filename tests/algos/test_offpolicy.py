"""Policy shaping (LUFFY) and the raw IS statistics against their formulas on hand-made tensors."""

from __future__ import annotations

import math

import pytest
import torch

from toolgrpo.algos.importance import raw_is_stats
from toolgrpo.algos.losses import ppo_policy_loss
from toolgrpo.algos.offpolicy import (
    shaped_policy_loss,
    shaped_token_loss,
    shaping,
    shaping_ratio,
)

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_shaping_is_r_over_r_plus_gamma():
    r = torch.tensor([0.0, 0.1, 1.0, 9.9])
    torch.testing.assert_close(shaping(r, 0.1), torch.tensor([0.0, 0.5, 1 / 1.1, 0.99]))
    with pytest.raises(ValueError, match="gamma"):
        shaping(r, 0.0)


def test_the_ratio_is_pi_or_pi_over_the_fixed_policy():
    lp = torch.log(torch.tensor([[0.2, 0.5]]))
    fixed = torch.log(torch.tensor([[0.4, 0.5]]))
    torch.testing.assert_close(shaping_ratio(lp), torch.tensor([[0.2, 0.5]]))
    torch.testing.assert_close(shaping_ratio(lp, fixed), torch.tensor([[0.5, 1.0]]))


@pytest.mark.parametrize("with_fixed", [False, True])
def test_the_token_gradient_is_gamma_r_over_r_plus_gamma_squared(with_fixed):
    """−A·f(r) with the gradient through f: ∂/∂log π = −A·γ·r/(r + γ)² (no clipping)."""
    gamma = 0.1
    p = torch.tensor([[0.001, 0.05, 0.1, 0.6, 0.99]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.5, 0.2, 0.3, 0.9]], dtype=torch.float64)
    lp = p.log().requires_grad_(True)
    adv = torch.tensor([[1.0, -2.0, 0.5, 3.0, -1.0]], dtype=torch.float64)
    fixed = q.log() if with_fixed else None
    loss = shaped_token_loss(lp, adv, gamma, fixed)
    r = p / q if with_fixed else p
    torch.testing.assert_close(loss.detach(), -adv * r / (r + gamma))
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, -adv * gamma * r / (r + gamma) ** 2)


def test_the_weight_peaks_where_the_ratio_is_gamma():
    r = torch.logspace(-4, 0, 401, dtype=torch.float64)
    weight = 0.1 * r / (r + 0.1) ** 2
    assert float(r[weight.argmax()]) == pytest.approx(0.1, rel=0.03)
    assert float(weight.max()) == pytest.approx(0.25, rel=1e-3)


def test_shaped_loss_adds_to_a_zero_weighted_ppo_loss_as_one_loss_over_the_batch():
    """Row 0 on-policy (PPO), row 1 shaped: the sum equals token-mean of the per-token losses
    over *all* tokens, so the two terms share one denominator."""
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.2, 0.3, 0.9]])).requires_grad_(True)
    old = lp.detach().clone()
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    shaped_rows = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    ppo, _ = ppo_policy_loss(old, lp, adv, MASK, is_weights_BT=1.0 - shaped_rows)
    sh, m = shaped_policy_loss(lp, adv, MASK, 0.1, None, "token-mean", None, shaped_rows)
    expected = (-1.0 - 1.0 - 2.0 * 0.2 / 0.3) / 3  # two PPO tokens at ratio 1, one shaped
    assert float((ppo + sh).detach()) == pytest.approx(expected)
    assert m["shaping_ratio_mean"] == pytest.approx(0.2)
    assert m["shaping_grad_weight_mean"] == pytest.approx(0.1 * 0.2 / 0.09)


def test_raw_is_stats_report_what_truncation_hides():
    lr = torch.tensor(
        [[math.log(2.0), math.log(3.0), 0.0], [math.log(0.5), 0.0, 0.0]], dtype=torch.float64
    )
    seq = raw_is_stats(lr, MASK, "sequence", threshold=2.0)
    assert seq["mixture/is_weight_raw_mean"] == pytest.approx((6.0 + 0.5) / 2)
    assert seq["mixture/is_weight_raw_max"] == pytest.approx(6.0)
    assert seq["mixture/is_ess"] == pytest.approx(6.5**2 / (2 * (36 + 0.25)))
    assert seq["mixture/is_truncated_frac"] == pytest.approx(0.5)  # 6 > 2
    tok = raw_is_stats(lr, MASK, "token", threshold=2.0)  # tokens 2, 3, 0.5
    assert tok["mixture/is_weight_raw_mean"] == pytest.approx(5.5 / 3)
    assert tok["mixture/is_truncated_frac"] == pytest.approx(1 / 3)  # 2 is not cut by min(w, 2)
    assert raw_is_stats(lr, MASK, "sequence", None)["mixture/is_truncated_frac"] == 0.0
    assert raw_is_stats(lr, torch.zeros_like(MASK)) == {}


def test_raw_is_stats_stay_finite_for_huge_weights():
    lr = torch.full((2, 3), 20.0)  # per-token clamp of importance_log_ratio; e^60 a sequence
    s = raw_is_stats(lr, torch.ones(2, 3), "sequence", 2.0)
    assert math.isfinite(s["mixture/is_weight_raw_max"])
    assert s["mixture/is_ess"] == pytest.approx(1.0)
