"""KL estimators and controllers against hand computations."""

import math

import pytest
import torch

from toolgrpo.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    get_kl_controller,
    kl_penalty,
)

LOGP = [-1.0, -2.0, -0.5]
REF = [-1.5, -1.0, -0.5]


def _k3(lp, rf):
    d = rf - lp
    return math.exp(d) - d - 1


EXPECTED = {
    "k1": [lp - rf for lp, rf in zip(LOGP, REF, strict=True)],  # 0.5, -1, 0
    "abs": [abs(lp - rf) for lp, rf in zip(LOGP, REF, strict=True)],
    "k2": [0.5 * (lp - rf) ** 2 for lp, rf in zip(LOGP, REF, strict=True)],  # 0.125, 0.5, 0
    "k3": [_k3(lp, rf) for lp, rf in zip(LOGP, REF, strict=True)],  # e^-.5-.5, e^1-2, 0
}
ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}


@pytest.mark.parametrize("kind", list(EXPECTED) + list(ALIASES))
def test_kl_kinds_values(kind):
    out = kl_penalty(torch.tensor(LOGP), torch.tensor(REF), kind)
    assert out.tolist() == pytest.approx(EXPECTED[ALIASES.get(kind, kind)], rel=1e-6)
    plus = kl_penalty(torch.tensor(LOGP), torch.tensor(REF), kind + "+")
    assert plus.tolist() == pytest.approx(EXPECTED[ALIASES.get(kind, kind)], rel=1e-6)


def test_k3_clamps():
    # ref - logp = 30 is clamped to 20, e^20 - 21 is then clamped to 10
    assert kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "k3").item() == 10.0
    # ref - logp = -30 -> clamp -20: e^-20 + 20 - 1 -> output clamp 10
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-30.0]), "k3").item() == 10.0


@pytest.mark.parametrize("kind", ["k1+", "abs+", "k3+", "low_var_kl+", "k2+"])
def test_straight_through_gradient_is_k2_gradient(kind):
    logp = torch.tensor(LOGP, requires_grad=True)
    kl_penalty(logp, torch.tensor(REF), kind).sum().backward()
    # d/dlogp 0.5 (logp - ref)^2 = logp - ref
    assert logp.grad.tolist() == pytest.approx([0.5, -1.0, 0.0])


def test_plain_k3_gradient_differs():
    logp = torch.tensor(LOGP, requires_grad=True)
    kl_penalty(logp, torch.tensor(REF), "k3").sum().backward()
    # d/dlogp [e^(r-l) - (r-l) - 1] = 1 - e^(r-l)
    assert logp.grad.tolist() == pytest.approx([1 - math.exp(-0.5), 1 - math.exp(1.0), 0.0])


@pytest.mark.parametrize("kind", ["full", "k4", "k3++", ""])
def test_unknown_kind(kind):
    with pytest.raises(ValueError, match="known kinds"):
        kl_penalty(torch.zeros(1), torch.zeros(1), kind)


def test_fixed_controller():
    ctrl = get_kl_controller("fixed", kl_coef=0.01)
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(current_kl=5.0, n_steps=100)
    assert ctrl.value == 0.01


def test_adaptive_controller():
    ctrl = get_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=1000)
    assert isinstance(ctrl, AdaptiveKLController)
    ctrl.update(current_kl=0.11, n_steps=100)  # error 0.1 -> x(1 + 0.1 * 0.1)
    assert ctrl.value == pytest.approx(0.1 * 1.01)
    ctrl.update(current_kl=1.0, n_steps=100)  # error 9 clipped to 0.2 -> x1.02
    assert ctrl.value == pytest.approx(0.1 * 1.01 * 1.02)
    ctrl.update(current_kl=0.0, n_steps=500)  # error -1 clipped to -0.2 -> x0.9
    assert ctrl.value == pytest.approx(0.1 * 1.01 * 1.02 * 0.9)


def test_controller_errors():
    with pytest.raises(ValueError):
        get_kl_controller("pid", kl_coef=0.1)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)
