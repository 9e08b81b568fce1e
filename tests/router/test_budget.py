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
