"""Router metrics (pure): per step λ, cost, rewards, route shares overall and per task type, reward
per tool call; for validation and eval the AUROC of P(tool) against a need-a-tool label."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from toolgrpo.router.routes import ANSWER, ROUTES
from toolgrpo.router.usage import ToolUsage


def _shares(routes: Sequence[str]) -> dict[str, float]:
    n = max(len(routes), 1)
    return {r: sum(x == r for x in routes) / n for r in ROUTES}


def _fracs(prefix: str, routes: Sequence[str]) -> dict[str, float]:
    return {f"{prefix}route_frac/{r}": v for r, v in _shares(routes).items()}


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
    for t in types:  # the same shares under validation's name, for every type (one type too)
        share = _shares([r for r, x in zip(routes, task_types, strict=True) if x == t])
        m.update({f"router/route_share/{t}/{r}": v for r, v in share.items()})
    calls = sum(u.num_calls for u in usages)
    if calls:  # what a call earns: task reward per tool call (validation: successes per call)
        m["router/task_reward_per_call"] = float(task_B.sum()) / calls
    return m


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve of ``scores`` for the positive ``labels``: the chance that a
    random positive scores above a random negative, ties counting one half (Mann-Whitney U with
    average ranks). None when either class is empty."""
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores for {len(labels)} labels")
    pos = sum(1 for x in labels if x)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):  # tied scores share the mean of their ranks (1-based)
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    u = sum(r for r, x in zip(ranks, labels, strict=True) if x) - pos * (pos + 1) / 2
    return u / (pos * neg)


def need_tool_labels(
    rewards: Mapping[str, Sequence[float | None]],
    task_types: Sequence[str],
    answer: str = ANSWER,
) -> tuple[list[bool], str]:
    """Whether each task needs a tool: its best tool route's mean reward beats ANSWER's
    (strictly; a tie needs no tool). ``rewards[route][i]`` is task i's mean reward under
    ``route`` (None: not played). When every task was played under every route the label is
    per task (``"task"``); otherwise per task type (``"type"``): a type needs a tool when its
    best tool route, averaged over the type's tasks played under it, beats ANSWER's average."""
    tools = [r for r in rewards if r != answer]
    n = len(task_types)
    if all(v is not None for r in (answer, *tools) for v in rewards[r]):
        known = {r: [float(v) for v in rewards[r] if v is not None] for r in (answer, *tools)}
        return [max(known[r][i] for r in tools) > known[answer][i] for i in range(n)], "task"

    def mean(route: str, t: str) -> float | None:
        xs = [v for v, x in zip(rewards[route], task_types, strict=True) if x == t]
        xs = [v for v in xs if v is not None]
        return sum(xs) / len(xs) if xs else None

    need: dict[str, bool] = {}
    for t in set(task_types):
        best = max((m for r in tools if (m := mean(r, t)) is not None), default=None)
        base = mean(answer, t)
        need[t] = best is not None and base is not None and best > base
    return [need[t] for t in task_types], "type"
