"""Routed evaluation: every task under the router head's argmax route, and, beside it, the
fixed-route baselines that say where the router sits between "no tools" and "always tools":
always ANSWER, always the task's own tool family, and the best route per task in hindsight.

With the baselines on, the router's *sampled* policy is reported too (``router_sampled``): each
route's episodes weighted by the head's probability of that route for the task. That is the
policy training ran and whose mean cost the budget constrains. A budgeted optimum is in general
a mixture of routes, and its argmax can sit on either side of the budget (a head at 40 % ANSWER
and 60 % tools on every prompt plays ANSWER everywhere under argmax).

The baselines need every task played under every route; the router's own result is then read
off those same episodes (its route's), so it costs nothing extra. Shared by ``toolgrpo eval``
and in-training validation: both report the same numbers for the same head and tasks. Costs are
the trainer's (``router.usage``), so cost vs budget here is what the budget constrained.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.eval.episodes import ALL, succeeded
from toolgrpo.eval.routes import greedy_routes
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.multi_turn import Condition
from toolgrpo.rollout.prompts import route_lengths, split_routes
from toolgrpo.router.catalog import env_tools
from toolgrpo.router.families import FamilyMap, ToolInfo
from toolgrpo.router.labeler import task_tools
from toolgrpo.router.routes import ANSWER, CALCULATE, SEARCH
from toolgrpo.router.usage import CostModel, usage_of_episode

log = logging.getLogger(__name__)
ROUTER = "router"
SAMPLED = "router_sampled"
BASELINES = ("always_answer", "always_family", "best_in_hindsight")
PlayFn = Callable[[Sequence[Task], Sequence[Condition]], list[Episode]]


@dataclass
class RoutedSetup:
    """A trained head and everything that shapes and prices its routes."""

    policy: Any  # router.policy.RouterPolicy
    condition: Callable[[str], Condition]  # route -> the episode's prompt conditioning
    families: FamilyMap
    cost: CostModel
    budget: float | None
    baselines: bool = True
    envs: EnvRouter | None = None  # to list the tools of environment tasks (their family)

    @property
    def routes(self) -> list[str]:
        return list(self.policy.routes)


@dataclass
class RoutedRun:
    episodes: list[Episode]  # the router's episodes, task-major, n per task
    routes: list[str]  # the route of each of those episodes
    report: dict[str, Any]


def family_routes(
    tasks: Sequence[Task], families: FamilyMap, routes: Sequence[str], envs: EnvRouter | None
) -> list[str]:
    """Each task's own tool family as a route: the family most of its tools belong to (ties in
    ``routes`` order); tools of neither family, the first tool route; no tools, ANSWER."""
    tool_routes = [r for r in routes if r != ANSWER]
    by_type: dict[str, list[ToolInfo]] = {}
    out = []
    for t in tasks:
        tools = task_tools(t)
        if not tools and envs is not None and t.task_type != "rlla":
            if t.task_type not in by_type:
                by_type[t.task_type] = env_tools([t], envs)
            tools = by_type[t.task_type]
        if not tools or not tool_routes:
            out.append(ANSWER)
            continue
        counts = {f: sum(families.family(x.name) == f for x in tools) for f in (SEARCH, CALCULATE)}
        ranked = sorted(tool_routes, key=lambda r: -counts.get(r, 0))
        out.append(ranked[0])
    return out


def play_routed(
    setup: RoutedSetup,
    tasks: Sequence[Task],
    n: int,
    max_prompt_length: int,
    play: PlayFn,
) -> RoutedRun:
    """The router's argmax route per task, played (with the baselines: every route played).
    Tasks that some routes' prompts would cut and others not are left out, with a warning and a
    count in the report: a route must not lose for its prompt's length."""
    conds = [setup.condition(r) for r in setup.routes]
    lengths = route_lengths(setup.policy.lm.tokenizer, tasks, setup.envs, conds)
    split = set(split_routes(tasks, lengths, max_prompt_length))
    excluded = Counter(tasks[i].task_type for i in split)
    if split:
        log.warning(
            "routed eval leaves out %d task(s) that data.max_prompt_length=%d cuts under some "
            "routes only (%s)",
            len(split),
            max_prompt_length,
            ", ".join(f"{t}: {k}" for t, k in sorted(excluded.items())),
        )
        tasks = [t for i, t in enumerate(tasks) if i not in split]
    picked, probs = greedy_routes(setup.policy, tasks, max_prompt_length)
    played = setup.routes if setup.baselines else None
    if played is None:
        conds = [setup.condition(r) for r in picked for _ in range(n)]
        eps = play(tasks, conds)
        by_route = {r: {} for r in setup.routes}
        for i, r in enumerate(picked):
            by_route[r][i] = eps[i * n : (i + 1) * n]
    else:
        conds = [setup.condition(r) for r in played for _ in tasks for _ in range(n)]
        eps = play([t for _ in played for t in tasks], conds)
        k = len(tasks) * n
        by_route = {
            r: {i: eps[j * k + i * n : j * k + (i + 1) * n] for i in range(len(tasks))}
            for j, r in enumerate(played)
        }
    costs = {
        id(e): setup.cost.cost(usage_of_episode(e, setup.families))
        for got in by_route.values()
        for group in got.values()
        for e in group
    }
    selections = {ROUTER: picked}
    if played is not None:
        selections["always_answer"] = [ANSWER if ANSWER in played else played[0]] * len(tasks)
        selections["always_family"] = family_routes(tasks, setup.families, played, setup.envs)
        selections["best_in_hindsight"] = hindsight_routes(by_route, costs, played, len(tasks))
    summaries = {
        name: selection_summary(tasks, sel, by_route, costs, setup.budget)
        for name, sel in selections.items()
    }
    if played is not None:
        weights = [dict(zip(setup.routes, p, strict=True)) for p in probs]
        summaries = {
            ROUTER: summaries.pop(ROUTER),
            SAMPLED: expected_summary(tasks, weights, by_route, costs, setup.budget),
            **summaries,
        }
    report = {
        "budget": setup.budget,
        "excluded_split_routes": dict(sorted(excluded.items())),
        "routes_played": list(played or sorted(set(picked))),
        "selections": summaries,
    }
    routed = [e for i, r in enumerate(picked) for e in by_route[r][i]]
    return RoutedRun(routed, [r for r in picked for _ in range(n)], report)


def hindsight_routes(
    by_route: Mapping[str, Mapping[int, Sequence[Episode]]],
    costs: Mapping[int, float],
    routes: Sequence[str],
    num_tasks: int,
) -> list[str]:
    """Per task, the route whose episodes scored best (ties: the cheaper, then ``routes``
    order): an oracle no router can beat on reward, the ceiling of routing alone."""
    out = []
    for i in range(num_tasks):

        def key(r: str, i: int = i) -> tuple[float, float]:
            eps = by_route[r][i]
            return (-fmean(e.reward for e in eps), fmean(costs[id(e)] for e in eps))

        out.append(min(routes, key=key))
    return out


def selection_summary(
    tasks: Sequence[Task],
    selection: Sequence[str],
    by_route: Mapping[str, Mapping[int, Sequence[Episode]]],
    costs: Mapping[int, float],
    budget: float | None,
) -> dict[str, dict[str, Any]]:
    """Per task type (and ``all``): reward, accuracy, tool cost (and cost − budget), tool-call
    rate and route fractions of the episodes a route selection plays."""
    rows: dict[str, list[tuple[Episode, str]]] = defaultdict(list)
    for i, r in enumerate(selection):
        for e in by_route[r][i]:
            rows[tasks[i].task_type].append((e, r))
            rows[ALL].append((e, r))
    out = {}
    for t in sorted(rows, key=lambda x: (x == ALL, x)):
        got = rows[t]
        cost = fmean(costs[id(e)] for e, _ in got)
        routes = [r for _, r in got]
        out[t] = {
            "episodes": len(got),
            "reward_mean": fmean(e.reward for e, _ in got),
            "accuracy": fmean(float(succeeded(e)) for e, _ in got),
            "cost_mean": cost,
            "cost_minus_budget": cost - budget if budget is not None else None,
            "tool_call_rate": fmean(float(e.tool_calls > 0) for e, _ in got),
            "route_frac": {r: routes.count(r) / len(routes) for r in sorted(set(routes))},
        }
    return out


def expected_summary(
    tasks: Sequence[Task],
    weights: Sequence[Mapping[str, float]],
    by_route: Mapping[str, Mapping[int, Sequence[Episode]]],
    costs: Mapping[int, float],
    budget: float | None,
) -> dict[str, dict[str, Any]]:
    """``selection_summary``'s numbers for a stochastic router: per task, each route's episode
    means weighted by the route's probability (``weights[i][route]``), then averaged over the
    tasks of each type. Unbiased for the sampled policy, with less variance than sampling one
    route per task, since every route was played."""
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    for i, w in enumerate(weights):
        per: dict[str, float] = defaultdict(float)
        for r, p in w.items():
            eps = by_route[r][i]
            per["reward_mean"] += p * fmean(e.reward for e in eps)
            per["accuracy"] += p * fmean(float(succeeded(e)) for e in eps)
            per["cost_mean"] += p * fmean(costs[id(e)] for e in eps)
            per["tool_call_rate"] += p * fmean(float(e.tool_calls > 0) for e in eps)
            per[f"route/{r}"] += p
            per["episodes"] += len(eps)
        rows[tasks[i].task_type].append(per)
        rows[ALL].append(per)
    out = {}
    for t in sorted(rows, key=lambda x: (x == ALL, x)):
        got = rows[t]
        row: dict[str, Any] = {"episodes": int(sum(g["episodes"] for g in got))}
        for k in ("reward_mean", "accuracy", "cost_mean", "tool_call_rate"):
            row[k] = fmean(g[k] for g in got)
        row["cost_minus_budget"] = row["cost_mean"] - budget if budget is not None else None
        row["route_frac"] = {r: fmean(g[f"route/{r}"] for g in got) for r in sorted(by_route)}
        out[t] = row
    return out


def routed_metrics(report: Mapping[str, Any], prefix: str = "val") -> dict[str, float]:
    """Flat metrics: ``val/<type>/cost/mean``, ``val/<type>/cost_minus_budget`` for the
    router, ``val/sampled/<type>/{reward_mean,accuracy,cost_mean}`` for its sampled policy, and
    ``val/baseline/<name>/<type>/{reward_mean,accuracy,cost_mean}``."""
    m: dict[str, float] = {}
    for name, summary in report["selections"].items():
        for t, s in summary.items():
            if name == ROUTER:
                m[f"{prefix}/{t}/cost/mean"] = s["cost_mean"]
                if s["cost_minus_budget"] is not None:
                    m[f"{prefix}/{t}/cost_minus_budget"] = s["cost_minus_budget"]
                m[f"{prefix}/{t}/routed_reward_mean"] = s["reward_mean"]
            else:
                where = f"{prefix}/sampled" if name == SAMPLED else f"{prefix}/baseline/{name}"
                for k in ("reward_mean", "accuracy", "cost_mean"):
                    m[f"{where}/{t}/{k}"] = s[k]
    return m


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """One line per selection and task type, for the console."""
    budget = report.get("budget")
    lines = [f"routing (budget {budget:g}):" if budget is not None else "routing:"]
    for name, summary in report["selections"].items():
        for t, s in summary.items():
            fr = ", ".join(f"{r} {v:.0%}" for r, v in s["route_frac"].items())
            lines.append(
                f"  {name:<18} {t:<12} reward {s['reward_mean']:.3f}  acc {s['accuracy']:.1%}  "
                f"cost {s['cost_mean']:.3f}  routes {fr}"
            )
    return lines
