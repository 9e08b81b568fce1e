"""λ's state: a dual step every K observed steps, over their mean cost; checkpointable."""

from __future__ import annotations

import pytest

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
