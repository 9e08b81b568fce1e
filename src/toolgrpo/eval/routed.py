"""Routed evaluation: every task under the router head's routes and, beside them, the
fixed-route baselines that say where the router sits between "no tools" and "always tools":
always ANSWER, always the task's own tool family, and the best route per task in hindsight.

The router is reported as three policies (``eval.routed_report``): ``router_sampled`` (routes
drawn from the head, as training ran it), ``router_argmax`` and ``router_threshold`` (a tool
route iff P(tool) >= τ, ``router.calibrate``). The headline ``router`` is the sampled policy when
the budget binds: training holds only its mean cost near B, and its argmax can sit on either
side of the budget (a head at 40 % ANSWER and 30 % on each tool route, on every prompt, plays
ANSWER everywhere under argmax). Without a binding budget the headline is the argmax.

With the baselines on (``router.eval_baselines``) every task is played under every route; each
policy's numbers are read off those episodes (the sampled policy's as each route's result
weighted by the head's probability of it). With them off, each task is played under ANSWER and
its most probable tool route (the two routes a threshold chooses between; the argmax is one of
them) and under a seeded draw from the head when that is a third route; the sampled policy is
then that draw. Both ways every task's cost under ANSWER and under its tool route is known, so
τ can be calibrated on these tasks (validation does, and stores it with the head).

Shared by ``toolgrpo eval`` and in-training validation: both report the same numbers for the
same head and tasks. Costs are the trainer's (``router.usage``), so cost vs budget here is what
the budget constrained.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import fmean
from typing import Any

from toolgrpo.config.router import RouterCostConfig, max_cost
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.eval.routed_report import (
    ARGMAX,
    HEADLINE,
    SAMPLED,
    THRESHOLD,
    expected_summary,
    report_lines,
    routed_metrics,
    selection_summary,
    tool_need_report,
)
from toolgrpo.eval.routes import greedy_routes, sampled_routes
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.multi_turn import Condition
from toolgrpo.rollout.prompts import route_lengths, split_routes
from toolgrpo.router.calibrate import (
    Threshold,
    budget_binds,
    calibrate_threshold,
    threshold_route,
    tool_probability,
    top_tool_route,
)
from toolgrpo.router.catalog import env_tools
from toolgrpo.router.families import FamilyMap, ToolInfo
from toolgrpo.router.labeler import task_tools
from toolgrpo.router.routes import ANSWER, CALCULATE, SEARCH
from toolgrpo.router.usage import CostModel, usage_of_episode

log = logging.getLogger(__name__)
ROUTER = HEADLINE
BASELINES = ("always_answer", "always_family", "best_in_hindsight")
PlayFn = Callable[[Sequence[Task], Sequence[Condition]], list[Episode]]


def episodes_played(tasks: Sequence[Task], conds: Sequence[Condition] | None, n: int) -> int:
    """How many episodes one :data:`PlayFn` call plays: one per condition (routed evaluation
    plays every task under every route, ``n`` each), else ``n`` per task."""
    return len(conds) if conds is not None else len(tasks) * n


__all__ = [  # the report's pure functions, re-exported for callers of this module
    "expected_summary",
    "report_lines",
    "routed_metrics",
    "selection_summary",
]


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
    seed: int = 0  # the sampled policy's draws (without baselines; the played episodes)
    threshold: Threshold | None = None  # τ to apply; None: calibrate it on these tasks
    step: int = -1  # the training step of the head (recorded with a τ calibrated here)

    @property
    def routes(self) -> list[str]:
        return list(self.policy.routes)

    @property
    def max_cost(self) -> float:
        return max_cost(RouterCostConfig(**asdict(self.cost)))


@dataclass
class RoutedRun:
    episodes: list[Episode]  # the headline policy's episodes, task-major, n per task
    routes: list[str]  # the route of each of those episodes
    report: dict[str, Any]
    calibrated: Threshold | None = None  # τ fit on these tasks (None: no ANSWER route or budget)


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
    """Play the routes the report needs (module docstring), summarise every policy and baseline,
    calibrate τ. Tasks that some routes' prompts would cut and others not are left out, with a
    warning and a count in the report: a route must not lose for its prompt's length."""
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
    routes = setup.routes
    argmax, probs = greedy_routes(setup.policy, tasks, max_prompt_length)
    drawn = sampled_routes(probs, routes, setup.seed)
    tool = [top_tool_route(p, routes) for p in probs] if ANSWER in routes else argmax
    pairs = [(r, i) for r in routes for i in range(len(tasks))]  # (route, task), route-major
    if not setup.baselines:  # ANSWER and the tool route (threshold, argmax), and the draw
        first = ([ANSWER, tool[i]] if ANSWER in routes else [argmax[i]] for i in range(len(tasks)))
        needed = [{*two, drawn[i]} for i, two in enumerate(first)]
        pairs = [(r, i) for r, i in pairs if r in needed[i]]
    conds = [setup.condition(r) for r, _ in pairs for _ in range(n)]
    eps = play([tasks[i] for _, i in pairs], conds)
    by_route: dict[str, dict[int, list[Episode]]] = {r: {} for r in routes}
    for j, (r, i) in enumerate(pairs):
        by_route[r][i] = eps[j * n : (j + 1) * n]
    costs = {id(e): setup.cost.cost(usage_of_episode(e, setup.families)) for e in eps}

    def mean_cost(r: str, i: int) -> float:
        return fmean(costs[id(e)] for e in by_route[r][i])

    threshold, calibrated, source = setup.threshold, None, "checkpoint"
    if ANSWER in routes and setup.budget is not None and tasks:
        calibrated = calibrate_threshold(
            [tool_probability(p, routes) for p in probs],
            [mean_cost(tool[i], i) for i in range(len(tasks))],
            setup.budget,
            [mean_cost(ANSWER, i) for i in range(len(tasks))],
            setup.max_cost,
            setup.step,
        )
        if threshold is None:
            threshold, source = calibrated, "calibrated on these tasks (in-sample)"
    selections: dict[str, list[str]] = {ARGMAX: argmax}
    if threshold is not None:
        selections[THRESHOLD] = [threshold_route(p, routes, threshold.tau) for p in probs]
    if setup.baselines:
        selections["always_answer"] = [ANSWER if ANSWER in routes else routes[0]] * len(tasks)
        selections["always_family"] = family_routes(tasks, setup.families, routes, setup.envs)
        selections["best_in_hindsight"] = hindsight_routes(by_route, costs, routes, len(tasks))
    else:
        selections[SAMPLED] = drawn
    summaries = {
        name: selection_summary(tasks, sel, by_route, costs, setup.budget)
        for name, sel in selections.items()
    }
    if setup.baselines:  # every route played: the sampled policy exactly, not one draw
        weights = [dict(zip(routes, p, strict=True)) for p in probs]
        summaries[SAMPLED] = expected_summary(tasks, weights, by_route, costs, setup.budget)
    headline = SAMPLED if budget_binds(setup.budget, setup.max_cost) else ARGMAX
    ordered = {HEADLINE: summaries[headline]}
    ordered.update({k: summaries[k] for k in (SAMPLED, ARGMAX, THRESHOLD) if k in summaries})
    ordered.update({k: v for k, v in summaries.items() if k not in ordered})
    report = {
        "budget": setup.budget,
        "max_cost": setup.max_cost,
        "headline": headline,
        "routes": routes,
        "excluded_split_routes": dict(sorted(excluded.items())),
        "routes_played": [r for r in routes if by_route[r]],
        "selections": ordered,
        "threshold": {**threshold.to_state(), "source": source} if threshold else None,
        "tool_need": tool_need_report(tasks, probs, routes, by_route),
        # Per task, for paired analyses: the head's probabilities and each played route's
        # mean reward and cost (routes not played for a task are absent).
        "per_task": [
            {
                "task_id": t.task_id,
                "task_type": t.task_type,
                "probs": dict(zip(routes, probs[i], strict=True)),
                "reward": {
                    r: fmean(e.reward for e in by_route[r][i]) for r in routes if i in by_route[r]
                },
                "cost": {r: mean_cost(r, i) for r in routes if i in by_route[r]},
            }
            for i, t in enumerate(tasks)
        ],
    }
    picked = drawn if headline == SAMPLED else argmax
    played = [e for i, r in enumerate(picked) for e in by_route[r][i]]
    return RoutedRun(played, [r for r in picked for _ in range(n)], report, calibrated)


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
