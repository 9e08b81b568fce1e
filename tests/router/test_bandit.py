"""The router's whole learning loop on a synthetic bandit: fixed prompt features per prompt type,
known reward per (type, route), cost 1 for a tool route. GRPO on r − λ·cost with the dual step on
λ must bring the mean cost to the budget and give each type its best route under that budget."""

from __future__ import annotations

from statistics import fmean
from types import SimpleNamespace

import pytest
import torch

from toolgrpo.algos.router import router_advantages, router_rewards
from toolgrpo.router.budget import Budget
from toolgrpo.router.policy import RouterPolicy
from toolgrpo.router.routes import ROUTES

H, T, N, STEPS = 16, 32, 4, 600
# type: (frequency, task reward of ANSWER, SEARCH, CALCULATE)
TYPES = {
    "chat": (0.4, (0.8, 0.9, 0.5)),  # a tool helps a little: worth it only when tools are cheap
    "lookup": (0.3, (0.1, 1.0, 0.2)),  # needs search
    "math": (0.3, (0.2, 0.3, 1.0)),  # needs the calculator
}
COST = torch.tensor([0.0, 1.0, 1.0])


def run_bandit(budget: float, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    centers = torch.randn(len(TYPES), H, generator=g)
    freqs = torch.tensor([f for f, _ in TYPES.values()])
    rewards = torch.tensor([r for _, r in TYPES.values()])
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=H)))
    router = RouterPolicy(lm, ROUTES, lr=1.0)
    dual = Budget(budget, lam=0.0, dual_lr=0.05, update_every=1)
    costs, lams = [], []
    for _ in range(STEPS):
        kind = torch.multinomial(freqs, T, replacement=True, generator=g).repeat_interleave(N)
        feats = centers[kind] + 0.1 * torch.randn(T * N, H, generator=g)
        action = router.act(feats).router_action
        task = rewards[kind, action] + 0.1 * torch.randn(T * N, generator=g)
        cost = COST[action]
        uids = [str(i // N) for i in range(T * N)]
        adv = router_advantages(router_rewards(task, cost, dual.lam), uids)
        router.update(feats, action, adv, entropy_coeff=0.01)
        dual.observe(cost.tolist())
        dual.step()
        costs.append(float(cost.mean()))
        lams.append(dual.lam)
    with torch.no_grad():
        probs = torch.softmax(router.head(centers), -1)
    return {
        "probs": probs,
        "expected_cost": float((freqs[:, None] * probs * COST).sum()),
        "last_cost": fmean(costs[-100:]),
        "lam": fmean(lams[-100:]),
    }


@pytest.mark.parametrize(
    "budget, best",
    [
        (0.6, ("ANSWER", "SEARCH", "CALCULATE")),  # tools for the types that need them
        (0.3, ("ANSWER", "SEARCH", "ANSWER")),  # one tool type affordable: the larger gain wins
    ],
)
def test_dual_ascent_meets_the_budget_with_the_best_routes(budget, best):
    res = run_bandit(budget)
    assert abs(res["last_cost"] - budget) <= 0.05, res
    assert abs(res["expected_cost"] - budget) <= 0.05, res
    chosen = tuple(ROUTES[int(i)] for i in res["probs"].argmax(-1))
    assert chosen == best, res
    assert res["lam"] > 0  # the budget binds: tools have a price
