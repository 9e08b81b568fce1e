"""What each fixed-row estimator is, by exact enumeration on a tiny categorical policy.

Responses are two tokens from a 3-token vocabulary (9 of them); the actor π_θ and the fixed
policy q are tabular (a first-token softmax and one second-token softmax per first token), so
every expectation over q's samples is a finite sum, E_q[∇L] = Σ_y q(y)·∇L(y), with the loss L of
each response computed by the production functions at the start of an update (θ = θ_old). The
on-policy gradient is ∇J = ∇Σ_y π(y)·A(y), A = r − E_π[r] (a constant baseline). docs/mixture.md
quotes the numbers asserted here.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from toolgrpo.algos.advantages import compute_grpo_advantages
from toolgrpo.algos.importance import importance_log_ratio, raw_is_stats, truncated_is_weights
from toolgrpo.algos.losses import ppo_policy_loss
from toolgrpo.algos.offpolicy import shaped_policy_loss, shaping_grad_weight

V, L, C, GAMMA = 3, 2, 2.0, 0.1
YS = torch.tensor(list(itertools.product(range(V), repeat=L)))  # [9, 2]
# success: the second token repeats the first. The actor rarely does (E_π[r] = 0.21), the
# fixed policy, a teacher, mostly does (E_q[r] = 0.79).
REWARD = (YS[:, 0] == YS[:, 1]).double()
ACTOR = (
    torch.tensor([1.0, 0.0, -0.5]),
    torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
)
FIXED = (
    torch.tensor([0.5, 1.0, 0.0]),
    torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]]),
)


def _token_logprobs(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """log p(y_t | y_<t) of every enumerated response, ``[9, 2]``."""
    lp1 = torch.log_softmax(first, -1)[YS[:, 0]]
    lp2 = torch.log_softmax(second, -1)[YS[:, 0], YS[:, 1]]
    return torch.stack([lp1, lp2], -1)


class Setup:
    def __init__(self, fixed: tuple[torch.Tensor, torch.Tensor] = FIXED) -> None:
        self.params = [p.double().clone().requires_grad_(True) for p in ACTOR]
        self.q_tok = _token_logprobs(*(p.double() for p in fixed))
        self.q = self.q_tok.sum(-1).exp()
        with torch.no_grad():
            self.pi = self.lp().sum(-1).exp()
        self.adv = REWARD - (self.pi * REWARD).sum()
        self.mask = torch.ones(len(YS), L, dtype=torch.float64)

    def lp(self) -> torch.Tensor:
        return _token_logprobs(*self.params)

    def grad(self, loss: torch.Tensor) -> torch.Tensor:
        gs = torch.autograd.grad(loss, self.params)
        return torch.cat([g.flatten() for g in gs])

    def on_policy(self) -> torch.Tensor:
        """The ascent direction ∇J."""
        return self.grad((self.lp().sum(-1).exp() * self.adv).sum())

    def expected(self, row_loss) -> torch.Tensor:
        """E_q[−∇L(y)] (the ascent direction the estimator follows on average)."""
        lp = self.lp()
        total = sum(self.q[i] * row_loss(lp, i) for i in range(len(YS)))
        return -self.grad(total)

    def is_loss(self, threshold: float | None):
        log_ratio = importance_log_ratio(self.lp().detach(), self.q_tok, self.mask)
        w = truncated_is_weights(log_ratio, self.mask, "sequence", threshold)

        def row(lp: torch.Tensor, i: int) -> torch.Tensor:
            sl = slice(i, i + 1)
            adv = self.adv[sl].unsqueeze(-1).expand(1, L)
            loss, _ = ppo_policy_loss(
                lp[sl].detach(), lp[sl], adv, self.mask[sl], 0.2, 0.2, 3.0,
                "seq-mean-token-sum", is_weights_BT=w[sl],
            )  # fmt: skip
            return loss

        return row

    def shaped_loss(self, with_fixed: bool, normalize: bool = False):
        def row(lp: torch.Tensor, i: int) -> torch.Tensor:
            sl = slice(i, i + 1)
            adv = self.adv[sl].unsqueeze(-1).expand(1, L)
            fixed = self.q_tok[sl] if with_fixed else None
            loss, _ = shaped_policy_loss(
                lp[sl], adv, self.mask[sl], GAMMA, fixed, "seq-mean-token-sum", normalize=normalize
            )
            return loss

        return row

    def weights(self) -> torch.Tensor:
        return self.pi / self.q


def _rel(g: torch.Tensor, ref: torch.Tensor) -> float:
    return float((g - ref).norm() / ref.norm())


def _cos(g: torch.Tensor, ref: torch.Tensor) -> float:
    return float(g @ ref / (g.norm() * ref.norm()))


@pytest.fixture(scope="module")
def s() -> Setup:
    return Setup()


def test_plain_sequence_is_is_unbiased(s):
    """C = ∞: E_q[(π/q)·A·∇log π] = Σ π·A·∇log π = ∇J exactly."""
    g = s.expected(s.is_loss(None))
    torch.testing.assert_close(g, s.on_policy(), rtol=1e-10, atol=1e-12)


def test_truncated_is_is_biased_by_the_mass_it_cuts(s):
    """min(w, C): E_q[min(w, C)·A·∇log π] = E_π[min(1, C/w)·A·∇log π], so the bias is
    −E_π[(1 − C/w)₊·A·∇log π]: responses the actor likes more than C times the fixed policy
    does are counted at C/w of their weight (under-trained, whatever their advantage)."""
    w = s.weights()
    assert bool((w > C).any()) and bool((w < C).any())
    g = s.expected(s.is_loss(C))
    lp = s.lp()
    cut = (1 - C / w).clamp(min=0)
    bias = -s.grad((s.pi * cut * s.adv * lp.sum(-1)).sum())
    torch.testing.assert_close(g, s.on_policy() + bias, rtol=1e-10, atol=1e-12)
    # the numbers docs/mixture.md quotes (C = 2): 4 of the 9 responses, 71 % of π's mass
    on = s.on_policy()
    assert int((w > C).sum()) == 4
    assert float(s.pi[w > C].sum()) == pytest.approx(0.709, abs=5e-4)
    assert _rel(g, on) == pytest.approx(0.249, abs=5e-4)
    assert _cos(g, on) == pytest.approx(0.975, abs=5e-4)
    assert float(g.norm() / on.norm()) == pytest.approx(0.866, abs=5e-4)
    stats = raw_is_stats(torch.log(w).unsqueeze(-1), torch.ones(9, 1), "sequence", C)
    assert stats["mixture/is_weight_raw_max"] == pytest.approx(11.07, abs=0.005)
    ess = float((s.q * w).sum() ** 2 / (s.q * w * w).sum())  # under q, not of these 9 rows
    assert ess == pytest.approx(0.186, abs=5e-4)


@pytest.mark.parametrize("with_fixed", [False, True])
def test_policy_shaping_follows_its_own_expected_gradient(s, with_fixed):
    """LUFFY: E_q[A·Σ_t γ·r_t/(r_t + γ)²·∇log π_t], r_t = π_t (or π_t/q_t): a reweighting of
    the *token-level* gradient by q and by f', not the on-policy gradient."""
    g = s.expected(s.shaped_loss(with_fixed))
    lp = s.lp()
    r = lp.detach().exp() / (s.q_tok.exp() if with_fixed else 1.0)
    weight = GAMMA * r / (r + GAMMA) ** 2
    expected = s.grad((s.q.unsqueeze(-1) * s.adv.unsqueeze(-1) * weight * lp).sum())
    torch.testing.assert_close(g, expected, rtol=1e-10, atol=1e-12)
    # not ∇J, nor even parallel to it (docs/mixture.md quotes these)
    cos, rel = (0.692, 0.728) if with_fixed else (0.643, 0.769)
    assert _cos(g, s.on_policy()) == pytest.approx(cos, abs=5e-4)
    assert _rel(g, s.on_policy()) == pytest.approx(rel, abs=5e-4)


def test_shaping_on_the_ratio_is_the_scaled_policy_gradient_when_the_policies_agree():
    """With q = π, r = π/q = 1 on every token: shaped = γ/(1 + γ)²·∇J (on-policy, rescaled);
    shaping on π alone (LUFFY's) stays a reweighting even then."""
    s = Setup(fixed=ACTOR)
    on = s.on_policy()
    ratio = s.expected(s.shaped_loss(True))
    torch.testing.assert_close(ratio, GAMMA / (1 + GAMMA) ** 2 * on, rtol=1e-10, atol=1e-12)
    assert _cos(s.expected(s.shaped_loss(False)), on) < 0.999


@pytest.mark.parametrize("with_fixed", [False, True])
def test_normalized_shaping_is_the_same_shape_at_the_on_policy_scale(s, with_fixed):
    """shaping_normalize: f × (1 + γ)²/γ. Its expectation is the shaped one times that gain
    (the direction is LUFFY's), and on the ratio with q = π it is exactly ∇J."""
    gain = (1 + GAMMA) ** 2 / GAMMA
    g = s.expected(s.shaped_loss(with_fixed, normalize=True))
    torch.testing.assert_close(g, gain * s.expected(s.shaped_loss(with_fixed)), rtol=1e-10, atol=0)
    agree = Setup(fixed=ACTOR)
    ratio = agree.expected(agree.shaped_loss(True, normalize=True))
    torch.testing.assert_close(ratio, agree.on_policy(), rtol=1e-10, atol=1e-12)
    r = torch.tensor([1.0, GAMMA, 1e-3], dtype=torch.float64)
    assert shaping_grad_weight(r, GAMMA, True).tolist() == pytest.approx(
        [1.0, gain / 4, gain * GAMMA * 1e-3 / (1e-3 + GAMMA) ** 2]
    )


def test_an_all_fail_actor_group_learns_from_one_fixed_success_only_when_mixed():
    """GRPO over the mixed group: 7 actor failures and 1 fixed success share one uid."""
    scores = torch.tensor([0.0] * 7 + [1.0])
    mask = torch.ones(8, 3)
    mixed, _ = compute_grpo_advantages(scores, mask, ["g"] * 8)
    a_actor, a_fixed = mixed[:7, 0], mixed[7, 0]
    assert bool((a_actor < 0).all()) and bool((a_actor == a_actor[0]).all())
    assert float(a_fixed) > 0
    # mean 1/8, std √(1/8): actor −(1/8)/√(1/8), fixed (7/8)/√(1/8)
    assert float(a_actor[0]) == pytest.approx(-(1 / 8) / (1 / 8) ** 0.5, rel=1e-5)
    assert float(a_fixed) == pytest.approx((7 / 8) / (1 / 8) ** 0.5, rel=1e-5)
    whole, _ = compute_grpo_advantages(scores, mask, ["a"] * 7 + ["f"])
    assert bool((whole[:7] == 0).all())  # whole groups: the actor's failures teach nothing
