"""λ's state: a dual step every K observed steps, over their mean cost; the running price scale;
checkpointable."""

from __future__ import annotations

import pytest
import torch

from toolgrpo.config.router import RouterConfig
from toolgrpo.router.budget import Budget


def test_dual_step_every_k_steps_over_their_mean_cost():
    b = Budget(budget=0.5, lam=0.0, dual_lr=1.0, update_every=2)
    b.observe([1.0, 1.0])
    assert not b.step() and b.lam == 0.0
    b.observe([0.0, 1.0, 1.0, 1.0])  # window: 5 of 6 examples used a tool
    assert b.step() and b.lam == pytest.approx(5 / 6 - 0.5)
    assert (b.steps_seen, b.cost_count, b.updates) == (0, 0, 1)


def test_state_round_trip_keeps_configured_budget():
    b = Budget(budget=0.5, lam=0.7, dual_lr=1.0)
    b.observe([1.0])
    fresh = Budget(budget=0.2, dual_lr=0.1)
    fresh.load_state_dict(b.state_dict())
    assert fresh.lam == 0.7 and fresh.cost_count == 1 and fresh.budget == 0.2


def test_proportional_term_prices_the_current_overspend():
    """λ = max(0, I + k_p·e) with I the plain ascent's λ; k_p = 0 is plain dual ascent."""
    plain = Budget(budget=0.3, dual_lr=0.5)
    pi = Budget(budget=0.3, dual_lr=0.5, dual_kp=2.0)
    for costs in ([1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0] * 4, [0.0] * 4):
        for b in (plain, pi):
            b.observe(costs)
            b.step()
        e = sum(costs) / len(costs) - 0.3
        assert pi.integral == pytest.approx(plain.lam)  # the same integral
        assert pi.lam == pytest.approx(max(0.0, plain.lam + 2.0 * e))
    assert pi.lam == 0.0 and plain.lam == 0.0  # underspending: the price is 0 again


def test_a_checkpoint_without_the_integral_resumes_from_lambda():
    old = {"lam": 0.4, "steps_seen": 0, "cost_sum": 0.0, "cost_count": 0, "updates": 3}
    b = Budget(budget=0.3, dual_lr=0.5, dual_kp=1.0)
    b.load_state_dict(old)
    assert b.integral == 0.4 and b.lam == 0.4
    b.observe([1.0])
    b.step()
    assert b.integral == pytest.approx(0.4 + 0.5 * 0.7) and b.lam == pytest.approx(0.75 + 0.7)
    again = Budget(budget=0.3, dual_lr=0.5, dual_kp=1.0)
    again.load_state_dict(b.state_dict())
    assert (again.integral, again.lam) == (b.integral, b.lam)


def _groups(untied: int, n_groups: int = 12, spread: float = 1.0):
    """One step of n_groups groups of 4: the first ``untied`` score 0, 0, ``spread``, ``spread``
    (two of them call a tool), the others tie at 0 (half of them call)."""
    task, cost, uids = [], [], []
    for g in range(n_groups):
        task += [0.0, 0.0, spread, spread] if g < untied else [0.0] * 4
        cost += [1.0, 0.0, 1.0, 0.0]
        uids += [str(g)] * 4
    return torch.tensor(task), torch.tensor(cost), uids


def test_the_price_scale_moves_smoothly_when_one_group_unties():
    """With 12 groups and λ = 0.1, a tied group's |A| under the batch's own spread (decay 0) is
    0.05 on an all-tied step and 0.40 on the next step, where one group unties: an 8x swing. The
    running spread (the default decay) moves it by a few percent."""
    swing = {}
    for decay in (0.0, RouterConfig().spread_decay):
        b = Budget(budget=0.3, lam=0.1, spread_decay=decay)
        for _ in range(10):  # a history of steps with spread: 4 of 12 groups untied
            b.advantages(*_groups(4))
        tied = b.advantages(*_groups(0))[-4:].abs().max()
        one = b.advantages(*_groups(1))[-4:].abs().max()
        swing[decay] = float(one / tied)
    assert swing[0.0] > 6.0, swing  # the batch rule: from s = 1 to s ≈ 0.15
    assert 0.9 < swing[RouterConfig().spread_decay] < 1.2, swing


def test_the_price_scale_is_bias_corrected_and_checkpointed():
    b = Budget(budget=0.3, spread_decay=0.9)
    assert b.scale == 1.0  # no step yet: λ·cost in reward units
    b.advantages(*_groups(12, spread=2.0))  # every group: 0, 0, 2, 2
    assert b.scale == pytest.approx(float(torch.tensor([-1.0, -1.0, 1.0, 1.0] * 12).std()))
    again = Budget(budget=0.3, spread_decay=0.9)
    again.load_state_dict(b.state_dict())
    assert again.scale == b.scale
    old = {k: v for k, v in b.state_dict().items() if not k.startswith("spread")}
    fresh = Budget(budget=0.3)
    fresh.load_state_dict(old)  # a router.pt from before the running scale
    assert fresh.scale == 1.0
