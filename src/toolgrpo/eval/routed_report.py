"""The numbers of routed evaluation (pure): per route selection and task type, reward, accuracy,
tool cost against the budget, correct answers per tool call and route shares; how well P(tool)
ranks the tasks that need a tool (AUROC); and the flat ``val/...`` metrics and console lines.

Selection names: ``router`` is the headline (the sampled policy when the budget binds, else the
argmax; ``report["headline"]`` names it), beside ``router_sampled``, ``router_argmax``,
``router_threshold`` and the fixed-route baselines. docs/router.md lists the metric names.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from toolgrpo.eval.episodes import ALL, succeeded
from toolgrpo.rollout.episode import Episode
from toolgrpo.router.calibrate import tool_probability
from toolgrpo.router.metrics import auroc, need_tool_labels
from toolgrpo.router.routes import ANSWER

HEADLINE = "router"
SAMPLED, ARGMAX, THRESHOLD = "router_sampled", "router_argmax", "router_threshold"
POLICIES = (SAMPLED, ARGMAX, THRESHOLD)  # the router's own policies, each under its own name
PREFIXES = {SAMPLED: "sampled", ARGMAX: "argmax", THRESHOLD: "threshold"}  # val/<prefix>/...
ByRoute = Mapping[str, Mapping[int, Sequence[Episode]]]  # route -> task index -> its episodes


def _order(keys: Any) -> list[str]:
    return sorted(keys, key=lambda x: (x == ALL, x))


def _per_call(successes: float, calls: float) -> float | None:
    return successes / calls if calls > 0 else None


def selection_summary(
    tasks: Sequence[Any],
    selection: Sequence[str],
    by_route: ByRoute,
    costs: Mapping[int, float],
    budget: float | None,
) -> dict[str, dict[str, Any]]:
    """Per task type (and ``all``): reward, accuracy, tool cost (and cost − budget), tool-call
    rate, correct answers per tool call and route fractions of the episodes a route selection
    plays."""
    rows: dict[str, list[tuple[Episode, str]]] = defaultdict(list)
    for i, r in enumerate(selection):
        for e in by_route[r][i]:
            rows[tasks[i].task_type].append((e, r))
            rows[ALL].append((e, r))
    out = {}
    for t in _order(rows):
        got = rows[t]
        cost = fmean(costs[id(e)] for e, _ in got)
        routes = [r for _, r in got]
        wins = sum(float(succeeded(e)) for e, _ in got)
        out[t] = {
            "episodes": len(got),
            "reward_mean": fmean(e.reward for e, _ in got),
            "accuracy": wins / len(got),
            "cost_mean": cost,
            "cost_minus_budget": cost - budget if budget is not None else None,
            "tool_call_rate": fmean(float(e.tool_calls > 0) for e, _ in got),
            "correct_per_call": _per_call(wins, sum(e.tool_calls for e, _ in got)),
            "route_frac": {r: routes.count(r) / len(routes) for r in sorted(set(routes))},
        }
    return out


def expected_summary(
    tasks: Sequence[Any],
    weights: Sequence[Mapping[str, float]],
    by_route: ByRoute,
    costs: Mapping[int, float],
    budget: float | None,
) -> dict[str, dict[str, Any]]:
    """``selection_summary``'s numbers for a stochastic router: per task, each route's episode
    means weighted by the route's probability (``weights[i][route]``), then averaged over the
    tasks of each type. Unbiased for the sampled policy, with less variance than sampling one
    route per task, since every route was played. Correct answers per call: expected successes
    over expected calls."""
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    for i, w in enumerate(weights):
        per: dict[str, float] = defaultdict(float)
        for r, p in w.items():
            eps = by_route[r][i]
            per["reward_mean"] += p * fmean(e.reward for e in eps)
            per["accuracy"] += p * fmean(float(succeeded(e)) for e in eps)
            per["cost_mean"] += p * fmean(costs[id(e)] for e in eps)
            per["tool_call_rate"] += p * fmean(float(e.tool_calls > 0) for e in eps)
            per["calls"] += p * fmean(e.tool_calls for e in eps)
            per[f"route/{r}"] += p
            per["episodes"] += len(eps)
        rows[tasks[i].task_type].append(per)
        rows[ALL].append(per)
    out = {}
    for t in _order(rows):
        got = rows[t]
        row: dict[str, Any] = {"episodes": int(sum(g["episodes"] for g in got))}
        for k in ("reward_mean", "accuracy", "cost_mean", "tool_call_rate"):
            row[k] = fmean(g[k] for g in got)
        row["cost_minus_budget"] = row["cost_mean"] - budget if budget is not None else None
        row["correct_per_call"] = _per_call(
            sum(g["accuracy"] for g in got), sum(g["calls"] for g in got)
        )
        row["route_frac"] = {r: fmean(g[f"route/{r}"] for g in got) for r in sorted(by_route)}
        out[t] = row
    return out


def tool_need_report(
    tasks: Sequence[Any], probs: Sequence[Sequence[float]], routes: Sequence[str], by_route: ByRoute
) -> dict[str, Any] | None:
    """How well the head's P(tool) ranks the tasks that need a tool: per task type (and ``all``)
    the share of tasks labelled as needing one (``router.metrics.need_tool_labels``: per task
    when every route was played, else per type), the mean P(tool) and its AUROC against the
    label (None where only one class is present, e.g. any single type under per-type labels).
    None without an ANSWER route or tasks."""
    if ANSWER not in routes or not tasks:
        return None
    rewards = {
        r: [
            fmean(e.reward for e in by_route[r][i]) if i in by_route.get(r, {}) else None
            for i in range(len(tasks))
        ]
        for r in routes
    }
    types = [t.task_type for t in tasks]
    labels, rule = need_tool_labels(rewards, types)
    p_tool = [tool_probability(p, routes) for p in probs]
    by_type: dict[str, dict[str, Any]] = {}
    for t in _order({*types, ALL}):
        idx = [i for i, x in enumerate(types) if t in (x, ALL)]
        ys, ps = [labels[i] for i in idx], [p_tool[i] for i in idx]
        by_type[t] = {
            "tasks": len(idx),
            "need_tool": sum(ys) / len(ys),
            "p_tool_mean": fmean(ps),
            "auroc": auroc(ps, ys),
        }
    return {"label": rule, "by_type": by_type}


def routed_metrics(report: Mapping[str, Any], prefix: str = "val") -> dict[str, float]:
    """Flat metrics. The headline (``router``): ``val/<type>/cost/mean``,
    ``val/<type>/cost_minus_budget``, ``val/<type>/routed_reward_mean``,
    ``val/<type>/routed_accuracy``, ``val/<type>/correct_per_call`` and
    ``val/route_share/<type>/<ROUTE>``; each router policy the same under ``val/sampled/``,
    ``val/argmax/``, ``val/threshold/`` (``{reward_mean, accuracy, cost_mean, ...}``); the
    baselines under ``val/baseline/<name>/``; τ as ``val/threshold/tau``; and per type
    ``val/<type>/{tool_auroc, need_tool, p_tool_mean}``."""
    m: dict[str, float] = {}
    routes = report.get("routes") or []
    keys = ("reward_mean", "accuracy", "cost_mean", "cost_minus_budget", "correct_per_call")
    for name, summary in report["selections"].items():
        for t, s in summary.items():
            if name == HEADLINE:
                vals = {
                    "cost/mean": s["cost_mean"],
                    "cost_minus_budget": s["cost_minus_budget"],
                    "routed_reward_mean": s["reward_mean"],
                    "routed_accuracy": s["accuracy"],
                    "correct_per_call": s["correct_per_call"],
                }
                where, share = f"{prefix}/{t}", f"{prefix}/route_share/{t}"
            else:
                group = f"{prefix}/" + PREFIXES.get(name, f"baseline/{name}")
                vals = {k: s.get(k) for k in keys}
                where, share = f"{group}/{t}", f"{group}/route_share/{t}"
            m.update({f"{where}/{k}": float(v) for k, v in vals.items() if v is not None})
            if name == HEADLINE or name in PREFIXES:
                m.update({f"{share}/{r}": float(s["route_frac"].get(r, 0.0)) for r in routes})
    if report.get("headline") is not None:
        m[f"{prefix}/router/headline_sampled"] = float(report["headline"] == SAMPLED)
    thr = report.get("threshold")
    if thr:
        if thr["tau"] is not None:
            m[f"{prefix}/threshold/tau"] = float(thr["tau"])
        m[f"{prefix}/threshold/calibrated_spend"] = float(thr["spend"])
        m[f"{prefix}/threshold/feasible"] = float(thr["feasible"])
    need = report.get("tool_need")
    for t, s in (need or {}).get("by_type", {}).items():
        m[f"{prefix}/{t}/need_tool"] = float(s["need_tool"])
        m[f"{prefix}/{t}/p_tool_mean"] = float(s["p_tool_mean"])
        if s["auroc"] is not None:
            m[f"{prefix}/{t}/tool_auroc"] = float(s["auroc"])
    return m


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """One line per selection and task type, for the console, then τ and the AUROC."""
    budget = report.get("budget")
    head = report.get("headline")
    lines = [f"routing (budget {budget:g}):" if budget is not None else "routing:"]
    if head:
        lines.append(f"  router = {head} (the headline: {_why(head)})")
    for name, summary in report["selections"].items():
        for t, s in summary.items():
            fr = ", ".join(f"{r} {v:.0%}" for r, v in s["route_frac"].items())
            cpc = s.get("correct_per_call")
            per_call = f"  correct/call {cpc:.2f}" if cpc is not None else ""
            lines.append(
                f"  {name:<18} {t:<12} reward {s['reward_mean']:.3f}  acc {s['accuracy']:.1%}  "
                f"cost {s['cost_mean']:.3f}{per_call}  routes {fr}"
            )
    thr = report.get("threshold")
    if thr:
        tau = f"{thr['tau']:.3f}" if thr["tau"] is not None else "never"
        lines.append(
            f"  threshold: tool iff P(tool) >= {tau} ({thr['source']}; spend there "
            f"{thr['spend']:.3f}, {thr['tool_share']:.0%} of {thr['tasks']} tasks to a tool)"
        )
    need = report.get("tool_need")
    if need:
        a = need["by_type"][ALL]
        auc = f"{a['auroc']:.3f}" if a["auroc"] is not None else "n/a (one class)"
        lines.append(
            f"  P(tool) AUROC {auc} against need-a-tool (per {need['label']}; "
            f"{a['need_tool']:.0%} of tasks need one)"
        )
    return lines


def _why(head: str) -> str:
    if head == SAMPLED:
        return "the budget binds, and the sampled policy is the one it constrains"
    return "the budget does not bind"
