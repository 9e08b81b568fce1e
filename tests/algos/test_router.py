"""The router's loss, advantages and dual step against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from toolgrpo.algos.router import dual_update, router_advantages, router_loss, router_rewards


def test_rewards_are_the_lagrangian():
    r = router_rewards(torch.tensor([1.0, 0.5]), torch.tensor([0.0, 2.0]), lam=0.25)
    assert r.tolist() == [1.0, 0.0]


def test_advantages_group_by_uid():
    adv = router_advantages(torch.tensor([1.0, 3.0, 5.0, 5.0]), ["a", "a", "b", "b"])
    s = math.sqrt(2.0)  # unbiased std of (1, 3)
    assert adv.tolist() == pytest.approx([-1 / s, 1 / s, 0.0, 0.0], rel=1e-5)
    raw = router_advantages(torch.tensor([1.0, 3.0]), ["a", "a"], norm_by_std=False)
    assert raw.tolist() == [-1.0, 1.0]


def test_loss_matches_the_formula():
    logits = torch.tensor([[1.0, 0.0, -1.0], [0.0, 2.0, 0.0]], requires_grad=True)
    actions, adv = torch.tensor([0, 2]), torch.tensor([1.5, -0.5])
    labels = torch.tensor([1, -1])  # second row: no usable label
    loss, m = router_loss(logits, actions, adv, 0.1, labels, 0.2)
    logp = torch.log_softmax(logits.detach(), -1)
    pg = -(logp[0, 0] * 1.5 + logp[1, 2] * -0.5) / 2
    ent = -(logp.exp() * logp).sum(-1).mean()
    ce = -logp[0, 1]
    assert float(loss.detach()) == pytest.approx(float(pg - 0.1 * ent + 0.2 * ce), rel=1e-6)
    assert m["router/pg_loss"] == pytest.approx(float(pg), rel=1e-6)
    assert m["router/label_ce"] == pytest.approx(float(ce), rel=1e-6)
    loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_no_labels_means_no_cross_entropy():
    logits = torch.zeros(2, 3)
    _, m = router_loss(logits, torch.tensor([0, 1]), torch.zeros(2), 0.0, torch.tensor([-1, -1]), 1)
    assert m["router/label_ce"] == 0.0 and m["router/entropy"] == pytest.approx(math.log(3))


def test_dual_update_is_projected_ascent():
    assert dual_update(0.5, mean_cost=0.8, budget=0.3, lr=2.0) == pytest.approx(1.5)
    assert dual_update(0.5, mean_cost=0.0, budget=0.3, lr=2.0) == 0.0  # never below zero
    assert dual_update(0.5, mean_cost=0.3, budget=0.3, lr=2.0) == 0.5


def test_group_z_normalises_within_groups_and_skips_negatives():
    """Issue 18 item 4: Z is GRPO's within-group normalisation; negatives get 0."""
    from toolgrpo.algos.router import group_z

    z = group_z(torch.tensor([1.0, 3.0, 2.0, 2.0, 9.0]), list("aabbb"), True, [0, 0, 0, 0, 1])
    s = math.sqrt(2.0)
    assert z.tolist() == pytest.approx([-1 / s, 1 / s, 0.0, 0.0, 0.0], rel=1e-5)


def test_advantage_level_lagrangian_matches_the_formula():
    """Issue 18 item 4: A = Z(r_task) − λ·Z(cost), each normalised in its own group, against a
    hand computation; the reward mode is GRPO of r − λ·cost."""
    from toolgrpo.algos.router import lagrangian_advantages

    task = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.4])
    cost = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    uids = ["a", "a", "b", "b", "c", "c"]
    adv = lagrangian_advantages(task, cost, 0.5, uids, "advantage")
    s = math.sqrt(0.5)  # unbiased std of any two distinct values d apart is d/sqrt(2)
    # a: Z(task) = (±0.5)/s, Z(cost) = ±0.5/s; b: equal tasks -> 0, Z(cost) = ±0.5/s;
    # c: Z(task) = ±1/sqrt(2), equal costs -> Z(cost) = 0
    want = [
        0.5 / s - 0.5 * 0.5 / s,
        -0.5 / s + 0.5 * 0.5 / s,
        -0.5 * 0.5 / s,
        0.5 * 0.5 / s,
        -1 / math.sqrt(2),
        1 / math.sqrt(2),
    ]
    assert adv.tolist() == pytest.approx(want, rel=1e-4)
    # The reward mode: GRPO over r − λ·cost. In group b it differs from the advantage mode:
    # the whole spread is the cost, so the same λ moves the advantage by ±1/sqrt(2).
    rew = lagrangian_advantages(task, cost, 0.5, uids, "reward")
    assert rew[2:4].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], rel=1e-4)
    with pytest.raises(ValueError, match="lagrangian mode"):
        lagrangian_advantages(task, cost, 0.5, uids, "bogus")


def test_the_running_spread_is_bias_corrected_and_decay_0_is_the_batch_spread():
    """price's scale s: sqrt of an exponential average of within-group variances, divided by
    1 − decay^steps so the zero start weighs nothing; 1 before any spread was seen."""
    from toolgrpo.algos.router import (
        reward_spread,
        running_variance,
        spread_value,
        within_group_variance,
    )

    task = torch.tensor([0.0, 1.0, 0.0, 0.0])
    uids = ["a", "a", "b", "b"]
    var = within_group_variance(task, uids)
    assert var == pytest.approx(float(torch.tensor([-0.5, 0.5, 0.0, 0.0]).var()))
    assert reward_spread(task, uids) == pytest.approx(math.sqrt(var))
    assert within_group_variance(task, uids, [False, True, False, False]) == 0.0  # lone member
    m, n = running_variance(0.0, 0, var, 0.9)
    assert spread_value(m, n, 0.9) == pytest.approx(math.sqrt(var))  # one step: its own spread
    m, n = running_variance(m, n, 0.0, 0.9)  # then a step where every group ties
    assert spread_value(m, n, 0.9) == pytest.approx(math.sqrt(0.09 * var / (1 - 0.81)))
    assert spread_value(*running_variance(0.0, 0, 0.0, 0.0), 0.0) == 1.0  # nothing to scale by
    assert spread_value(0.0, 0, 0.9) == 1.0


def test_price_advantages_take_a_given_scale_and_leave_flagged_rows_out():
    from toolgrpo.algos.router import price_advantages

    task = torch.tensor([1.0, 0.0, 5.0, 0.0, 0.0])
    cost = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    skip = [False, False, True, False, False]
    adv = price_advantages(task, cost, 0.5, ["a", "a", "a", "b", "b"], skip, 2.0)
    # a without its flagged row: r − λc = (0.5, 0), centred ±0.25; b: tied r, −λ(c − c̄) = ∓0.25
    assert adv.tolist() == pytest.approx([0.125, -0.125, 0.0, -0.125, 0.125])
