"""A bandit whose budgeted optimum is an interior mix: at B = 0.3 the best policy calls a tool on
90 % of the `easy` tasks (a third of them, where a tool adds +0.8) and on none of the others, so
the dual price must settle at that gain, where the head is indifferent on `easy`. Rewards are
Bernoulli and a step is the SmolLM2 benchmark's 12 tasks × 4 routes, so groups often tie.

With the earlier defaults (head step 1, entropy bonus 0.01, η 0.1, k_p 0.5, each batch's own
reward spread) seed 7 of these saturates: the head goes to ANSWER on `easy`, λ climbs past the
0.8 gain (1.16) and the cost ends at 0.24 (its averaged head's: 0.18). The library defaults land
every seed."""

from __future__ import annotations

from dataclasses import replace
from statistics import fmean
from types import SimpleNamespace

import torch

from toolgrpo.config.router import RouterConfig
from toolgrpo.router.budget import Budget
from toolgrpo.router.policy import RouterPolicy
from toolgrpo.router.routes import ROUTES

# type: (share, P(success) under ANSWER, SEARCH, CALCULATE)
INTERIOR = {
    "easy": (1 / 3, (0.1, 0.9, 0.1)),  # a tool adds +0.8
    "math": (1 / 3, (0.3, 0.3, 0.6)),  # +0.3: worth it only below the optimum's price
    "chat": (1 / 3, (0.7, 0.75, 0.7)),  # +0.05
}
COST = torch.tensor([0.0, 1.0, 1.0])
H, T, N, STEPS = 16, 12, 4, 300
OLD = replace(
    RouterConfig(), lr=1.0, entropy_coeff=0.01, dual_lr=0.1, dual_kp=0.5, spread_decay=0.0
)


def run_interior(rc: RouterConfig, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    centers = torch.randn(len(INTERIOR), H, generator=g)
    share = torch.tensor([s for s, _ in INTERIOR.values()])
    success = torch.tensor([r for _, r in INTERIOR.values()])
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=H)))
    router = RouterPolicy(lm, ROUTES, lr=rc.lr, head_ema=rc.head_ema)
    price = Budget.from_config(rc)
    costs, lams = [], []
    for _ in range(STEPS):
        kind = torch.multinomial(share, T, replacement=True, generator=g).repeat_interleave(N)
        feats = centers[kind] + 0.1 * torch.randn(T * N, H, generator=g)
        router.observe(feats[::N])
        action = router.act(feats).router_action
        task = torch.bernoulli(success[kind, action], generator=g)
        cost = COST[action]
        uids = [str(i // N) for i in range(T * N)]
        adv = price.advantages(task, cost, uids, rc.lagrangian, rc.norm_adv_by_std)
        router.update(feats, action, adv, rc.entropy_coeff)
        price.observe(cost.tolist())
        price.step()
        costs.append(float(cost.mean()))
        lams.append(price.lam)
    with torch.no_grad(), router.averaged():  # the head validation and eval route with
        p = torch.softmax(router.head(centers), -1)
    return {
        "cost": fmean(costs[-STEPS // 4 :]),  # what the run spent over its last quarter
        "held_out_cost": float((share[:, None] * p * COST).sum()),
        "p_tool_easy": float(1 - p[0, 0]),
        "lam_max": max(lams),
    }


def test_the_defaults_land_an_interior_optimum_at_every_seed():
    """12 seeds: the cost over the last quarter within ±0.03 of B at every one (0.29-0.32), the
    averaged head's within ±0.05 (0.29-0.33), and P(tool | easy) 0.88-0.98 (the optimum's 0.9).
    λ overshoots the 0.8 gain on the way (its peak 1.5-1.75) but the head does not saturate."""
    got = [run_interior(RouterConfig(budget=0.3), s) for s in range(12)]
    assert all(abs(r["cost"] - 0.3) <= 0.03 for r in got), got
    assert all(abs(r["held_out_cost"] - 0.3) <= 0.05 for r in got), got
    assert all(0.85 <= r["p_tool_easy"] for r in got), got


def test_the_earlier_defaults_let_one_seed_saturate():
    """Seed 7 under the earlier defaults: the head saturates on ANSWER for `easy`, λ overshoots
    the 0.8 gain and the cost ends far below B."""
    old = run_interior(replace(OLD, budget=0.3), 7)
    assert old["lam_max"] > 0.8 + 0.2 and old["cost"] < 0.3 - 0.05, old
    new = run_interior(RouterConfig(budget=0.3), 7)
    assert abs(new["cost"] - 0.3) <= 0.03, new
