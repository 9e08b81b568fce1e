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
