"""Per-step router metrics (pure): λ, cost, rewards, route fractions overall and per task type."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from toolgrpo.router.routes import ROUTES
from toolgrpo.router.usage import ToolUsage


def _fracs(prefix: str, routes: Sequence[str]) -> dict[str, float]:
    n = max(len(routes), 1)
    return {f"{prefix}route_frac/{r}": sum(x == r for x in routes) / n for r in ROUTES}


def observe_metrics(
    routes: Sequence[str],
    task_types: Sequence[str],
    usages: Sequence[ToolUsage],
    task_B: torch.Tensor,
    cost_B: torch.Tensor,
    reward_B: torch.Tensor,
    lam: float,
    budget: float,
) -> dict[str, float]:
    """``router/...`` metrics of one step's rollouts; per task type too when there are several."""
    m: dict[str, float] = {
        "router/lambda": float(lam),
        "router/budget": float(budget),
        "router/cost/mean": float(cost_B.mean()),
        "router/task_reward/mean": float(task_B.mean()),
        "router/reward/mean": float(reward_B.mean()),
        "router/used_any_tool": sum(u.used_any_tool for u in usages) / max(len(usages), 1),
        "router/used_search": sum(u.used_search for u in usages) / max(len(usages), 1),
        "router/used_calculate": sum(u.used_calculate for u in usages) / max(len(usages), 1),
        "router/calls/mean": sum(u.num_calls for u in usages) / max(len(usages), 1),
        **_fracs("router/", routes),
    }
    for r in ROUTES:  # cost and task reward of the rollouts that took each route
        idx = [i for i, x in enumerate(routes) if x == r]
        if idx:
            m[f"router/cost/{r}"] = float(cost_B[idx].mean())
            m[f"router/task_reward/{r}"] = float(task_B[idx].mean())
    types = sorted(set(task_types))
    if len(types) > 1:
        for t in types:
            idx = [i for i, x in enumerate(task_types) if x == t]
            m[f"router/{t}/cost/mean"] = float(cost_B[idx].mean())
            m[f"router/{t}/task_reward/mean"] = float(task_B[idx].mean())
            m.update(_fracs(f"router/{t}/", [routes[i] for i in idx]))
    return m
