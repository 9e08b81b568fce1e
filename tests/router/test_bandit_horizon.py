"""The router discrimination benchmark's horizon, modelled: 60 steps of 12 tasks × 4 samples,
the library's router defaults (``RouterConfig()``: head step 4, entropy bonus 0.1, the PI dual
step, ``price`` advantages over the running spread, the averaged head), SmolLM2's hidden size,
and the route table that SmolLM2 measured held out on that task mix (arith_mixed split into its
questions that need the calculator and those that do not). Prompt features: type centres plus
noise of the same order per dimension (the head standardizes them)."""

from __future__ import annotations

from dataclasses import replace
from statistics import fmean
from types import SimpleNamespace

import torch

from toolgrpo.config.router import RouterConfig
from toolgrpo.router.budget import Budget
from toolgrpo.router.policy import RouterPolicy
from toolgrpo.router.routes import ROUTES

# type: (share of tasks, needs a tool, held-out reward under ANSWER, SEARCH, CALCULATE)
MEASURED = {
    "calculator": (0.25, 1, (0.0, 0.0, 0.47)),
    "search": (0.25, 1, (0.0, 0.54, 0.0)),
    "direct": (0.25, 0, (0.38, 0.18, 0.59)),  # tools offered; the calculator helps a little
    "arith_need": (0.125, 1, (0.0, 0.03, 0.82)),
    "arith_free": (0.125, 0, (0.64, 0.55, 0.88)),
}
COST = torch.tensor([0.0, 1.0, 1.0])
H = 576  # SmolLM2-135M's hidden size


def run_horizon(seed: int, rc: RouterConfig | None = None, steps: int = 60) -> dict[str, float]:
    rc = rc or RouterConfig(budget=0.3)
    g = torch.Generator().manual_seed(seed + 1)
    torch.manual_seed(seed)
    centers = 0.3 * torch.randn(len(MEASURED), H, generator=g)
    share = torch.tensor([s for s, _, _ in MEASURED.values()])
    free = 1.0 - torch.tensor([float(n) for _, n, _ in MEASURED.values()])
    reward = torch.tensor([r for _, _, r in MEASURED.values()])
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=H)))
    router = RouterPolicy(lm, ROUTES, lr=rc.lr, head_ema=rc.head_ema)
    price = Budget.from_config(rc)
    for _ in range(steps):
        kind = torch.multinomial(share, 12, replacement=True, generator=g).repeat_interleave(4)
        feats = centers[kind] + 0.45 * torch.randn(len(kind), H, generator=g)
        router.observe(feats[::4])
        action = router.act(feats).router_action
        task = torch.bernoulli(reward[kind, action], generator=g)
        cost = COST[action]
        uids = [str(i // 4) for i in range(len(kind))]
        adv = price.advantages(task, cost, uids, rc.lagrangian, rc.norm_adv_by_std)
        router.update(feats, action, adv, entropy_coeff=rc.entropy_coeff)
        price.observe(cost.tolist())
        price.step()
    held_out = centers.repeat_interleave(20, 0)
    held_out = held_out + 0.45 * torch.randn(held_out.shape, generator=g)
    with torch.no_grad(), router.averaged():
        p = torch.softmax(router.head(held_out), -1).view(len(MEASURED), 20, -1).mean(1)
    return {
        "answer_on_tool_free": float((p[:, 0] * free * share).sum() / (free * share).sum()),
        "cost": float((share[:, None] * p * COST).sum()),
    }


def test_the_defaults_converge_within_the_benchmarks_horizon():
    """Over 12 seeds the defaults end with ANSWER on 81-91 % of the tool-free tasks (the per-type
    optimum answers all of them) at a cost of 0.21-0.33, mean 0.29, 11 of 12 within ±0.05 of
    B = 0.3. A head step of 1 stays short of converged (ANSWER on 74-76 %; SmolLM2 at that step:
    76 % of direct tasks); a step of 8 saturates on ANSWER and the cost collapses in most seeds."""
    got = [run_horizon(s) for s in range(12)]
    assert all(r["answer_on_tool_free"] >= 0.80 for r in got), got
    assert abs(fmean(r["cost"] for r in got) - 0.3) <= 0.03, got
    assert sum(abs(r["cost"] - 0.3) <= 0.05 for r in got) >= 11, got
    rc = RouterConfig(budget=0.3)
    slow = [run_horizon(s, replace(rc, lr=1.0)) for s in range(6)]
    assert fmean(r["answer_on_tool_free"] for r in slow) < 0.78, slow
    too_fast = sorted(run_horizon(s, replace(rc, lr=8.0))["cost"] for s in range(6))
    assert too_fast[3] < 0.3 - 0.2, too_fast


def test_the_entropy_bonus_keeps_a_seed_from_saturating():
    """With the design's small bonus (0.01) seed 2 of the 12 above saturates: ANSWER on 99 % of
    the tool-free tasks and a held-out cost of 0.015. A constrained optimum mixes routes; without
    a real bonus the head's response to λ is nearly a step, which a dual step can only chase.
    The default 0.1 lands the same seed at 0.27."""
    small = run_horizon(2, RouterConfig(budget=0.3, entropy_coeff=0.01))
    assert small["cost"] < 0.1, small
    assert abs(run_horizon(2)["cost"] - 0.3) <= 0.05
