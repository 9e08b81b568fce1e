"""The router discrimination benchmark's horizon, modelled: 60 steps of 12 tasks × 4 samples, the
PI dual step and entropy bonus 0.1 of ``benchmarks/router_budget.py``, ``price`` advantages, the
averaged head, SmolLM2's hidden size, and the route table that SmolLM2 measured held out on that
task mix (arith_mixed split into its questions that need the calculator and those that do not).
Prompt features: type centres plus noise of the same order per dimension (the head standardizes
them). With the head's SGD step at 1.0 this model ends where the SmolLM2 run did: ANSWER on about
76 % of direct tasks, short of the per-type optimum (which answers every tool-free task)."""

from __future__ import annotations

from statistics import fmean
from types import SimpleNamespace

import torch

from toolgrpo.algos.router import lagrangian_advantages
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


def run_horizon(
    lr: float,
    seed: int,
    steps: int = 60,
    budget: float = 0.3,
    dual: tuple[float, float] = (0.2, 2.0),
    ema: float = 0.95,
) -> dict[str, float]:
    g = torch.Generator().manual_seed(seed + 1)
    torch.manual_seed(seed)
    centers = 0.3 * torch.randn(len(MEASURED), H, generator=g)
    share = torch.tensor([s for s, _, _ in MEASURED.values()])
    free = 1.0 - torch.tensor([float(n) for _, n, _ in MEASURED.values()])
    reward = torch.tensor([r for _, _, r in MEASURED.values()])
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=H)))
    router = RouterPolicy(lm, ROUTES, lr=lr, head_ema=ema)
    price = Budget(budget, lam=0.0, dual_lr=dual[0], update_every=1, dual_kp=dual[1])
    for _ in range(steps):
        kind = torch.multinomial(share, 12, replacement=True, generator=g).repeat_interleave(4)
        feats = centers[kind] + 0.45 * torch.randn(len(kind), H, generator=g)
        router.observe(feats[::4])
        action = router.act(feats).router_action
        task = torch.bernoulli(reward[kind, action], generator=g)
        cost = COST[action]
        uids = [str(i // 4) for i in range(len(kind))]
        adv = lagrangian_advantages(task, cost, price.lam, uids, "price")
        router.update(feats, action, adv, entropy_coeff=0.1)
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


def test_a_larger_head_step_converges_within_the_benchmarks_horizon():
    """lr = 1 ends with ANSWER on 72-76 % of the tool-free tasks over these seeds (SmolLM2: 76 %
    of direct tasks); the benchmark's router.lr = 4 reaches 84-89 %. The faster head follows the
    price more closely, so its cost scatters more by seed (0.20-0.35 here, mean 0.29; over 12
    seeds 10 land within ±0.05 of B = 0.3). A step of 8 overshoots: the router saturates on
    ANSWER and the cost collapses in most seeds, which is why the step is not larger still."""
    seeds = range(6)
    slow = [run_horizon(1.0, s) for s in seeds]
    fast = [run_horizon(4.0, s) for s in seeds]
    assert fmean(r["answer_on_tool_free"] for r in slow) < 0.78, slow
    assert all(r["answer_on_tool_free"] >= 0.82 for r in fast), fast
    assert all(abs(r["cost"] - 0.3) <= 0.05 for r in slow), slow
    assert abs(fmean(r["cost"] for r in fast) - 0.3) <= 0.03, fast
    assert all(abs(r["cost"] - 0.3) <= 0.11 for r in fast), fast
    too_fast = [run_horizon(8.0, s)["cost"] for s in seeds]
    assert sorted(too_fast)[len(seeds) // 2] < 0.3 - 0.2, too_fast
