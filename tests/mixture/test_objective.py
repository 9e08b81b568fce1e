"""The fixed rows' terms of the update (shaping, guided NLL, KL rows) and their share of the
update's gradient weight, against formulas on a hand-made batch."""

from __future__ import annotations

import math

import pytest
import torch

from toolgrpo.algos.losses import ppo_policy_loss
from toolgrpo.algos.offpolicy import shaping_grad_weight
from toolgrpo.mixture.objective import (
    SHARE,
    FixedObjective,
    fixed_rows,
    grad_weight_masses,
    guided_rows,
    pop_grad_share,
)
from toolgrpo.trainer.batch import Batch

# Row 0, 1: the actor's (3 and 1 tokens); row 2: a fixed success (2 tokens); row 3: a fixed
# failure (2 tokens). A mixed group where the actor failed: A = −1/4, −1/4, +3/4, −1/4.
MASK = torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]])
ADV = torch.tensor([-0.25, -0.25, 0.75, -0.25])[:, None] * MASK
LP = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 1, 1], [0.05, 0.5, 1], [0.3, 0.6, 1]]))
FIXED_LP = torch.log(torch.tensor([[1.0, 1, 1], [1, 1, 1], [0.5, 0.5, 1], [0.6, 0.6, 1]]))
POLICIES = ["actor", "actor", "fixed", "fixed"]
N = float(MASK.sum())  # 8 tokens


def _batch(shaped: bool = True) -> Batch:
    fixed = fixed_rows(POLICIES, 4)
    b = Batch(
        torch.zeros(4, 5, dtype=torch.long),
        torch.ones(4, 5, dtype=torch.long),
        MASK.clone(),
        FIXED_LP.clone(),
        scores_B=torch.tensor([0.0, 0.0, 1.0, 0.0]),
        advantages_BR=ADV.clone(),
        uids=["g"] * 4,
        policies=list(POLICIES),
        is_negative=[False] * 4,
    )
    if shaped:
        b.shaping_BR = fixed[:, None].float() * MASK
    return b


def test_rows_the_guided_nll_trains_are_fixed_real_successes():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.5, 1.0])
    got = guided_rows([*POLICIES, "fixed_1"], scores, [False, False, False, False, True], 0.5)
    assert got.tolist() == [False, False, True, True, False]  # a negative is nobody's sample
    assert guided_rows([], None, [], 1.0).tolist() == []
    assert fixed_rows([], 3).tolist() == [False] * 3


def test_shaped_and_guided_terms_follow_their_formulas():
    obj = FixedObjective(0.1, "ratio", True, True, guided_coef=0.5, guided_min_score=1.0)
    lp = LP.clone().requires_grad_(True)
    loss, metrics = obj.terms(_batch(), lp, MASK, "token-mean", None)
    loss.backward()
    gamma, gain = 0.1, 1.1**2 / 0.1
    r = torch.exp(LP - FIXED_LP)
    want = torch.zeros_like(LP)
    want[2:] = ADV[2:] * -gain * gamma * r[2:] / (r[2:] + gamma) ** 2 * MASK[2:] / N
    want[2] += -0.5 * MASK[2] / N  # the guided NLL on the fixed success
    torch.testing.assert_close(lp.grad, want)
    assert metrics["mixture/guided_loss"] == pytest.approx(0.5 * -(LP[2, :2].sum().item()) / N)
    none, m = FixedObjective().terms(_batch(shaped=False), LP, MASK, "token-mean", None)
    assert none is None and m == {}  # IS objective, no guidance: nothing beside PPO


def test_the_kl_rows_drop_the_fixed_rows_only_when_asked():
    assert FixedObjective().kl_rows(_batch()) is None
    got = FixedObjective(fixed_kl_loss=False).kl_rows(_batch())
    assert got.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_the_fixed_share_of_gradient_weight_is_abs_a_times_weight_over_tokens():
    """PPO at θ_old (ratio 1, nothing clipped) on the actor rows, shaping on the fixed ones:
    |∂L/∂log π| per token is |A|/N on an actor token and |A|·γr/(r + γ)²/N on a fixed one."""
    b = _batch()
    obj = FixedObjective(0.1, "ratio", False)
    weights = torch.where(b.shaping_BR != 0, 0.0, 1.0)

    def loss_of(lp):
        pg, _ = ppo_policy_loss(LP, lp, ADV, MASK, is_weights_BT=weights)
        return pg + obj.terms(b, lp, MASK, "token-mean", None)[0]

    masses = grad_weight_masses(loss_of, LP, MASK, fixed_rows(POLICIES, 4))
    w = shaping_grad_weight(torch.exp(LP - FIXED_LP), 0.1)
    actor = float((ADV.abs() * MASK)[:2].sum()) / N
    fixed = float((ADV.abs() * w * MASK)[2:].sum()) / N
    share = pop_grad_share(dict(masses))
    assert share[SHARE] == pytest.approx(fixed / (fixed + actor), rel=1e-5)
    # summed over micro-batches with their loss weights: the ratio of the sums
    metrics = {k: 0.25 * v + 0.75 * 2 * v for k, v in masses.items()}
    metrics["actor/pg_loss"] = 1.0
    assert pop_grad_share(metrics) == share and list(metrics) == ["actor/pg_loss"]


def test_a_share_with_no_masses_or_no_weight():
    assert pop_grad_share({"actor/pg_loss": 1.0}) == {}
    masses = grad_weight_masses(lambda lp: (lp * 0).sum(), LP, MASK, fixed_rows(POLICIES, 4))
    got = pop_grad_share(masses)
    assert got == {SHARE: 0.0} and not math.isnan(got[SHARE]) and masses == {}
