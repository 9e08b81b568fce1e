"""The router discrimination benchmark's analysis, pure functions over per-task tables.

A router row (``toolgrpo eval``'s routed ``per_task`` entry) holds a task's route
probabilities (the head's) and, for every route, its mean reward and cost over the task's
episodes under that route. An OTC row holds one policy's mean reward and cost per task.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import fmean, stdev
from typing import Any

from seed_stats import two_way_se

from toolgrpo.router.metrics import auroc

ANSWER = "ANSWER"
Row = dict[str, Any]


def key(row: Mapping[str, Any]) -> str:
    """A task's identity across evaluations (its type and id)."""
    return f"{row['task_type']}/{row['task_id']}"


def expected(row: Row, what: str, probs: Mapping[str, float] | None = None) -> float:
    """A task's expected ``reward`` or ``cost`` under route probabilities (the head's)."""
    p = probs if probs is not None else row["probs"]
    return sum(p[r] * row[what][r] for r in p if p[r] > 0)


def p_tool(row: Row) -> float:
    """P(a tool route) = 1 − P(ANSWER)."""
    return 1.0 - row["probs"].get(ANSWER, 0.0)


def mean_se(xs: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (NaN with one value)."""
    se = stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return fmean(xs), se


def route_shares(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Mean route probability per task type (the sampled router's shares) and over all."""
    out: dict[str, dict[str, float]] = {}
    for t in sorted({r["task_type"] for r in rows}) + ["all"]:
        got = [r for r in rows if t in (r["task_type"], "all")]
        out[t] = {k: fmean(r["probs"][k] for r in got) for k in got[0]["probs"]}
    return out


def route_share_by_need(rows: list[Row], need: list[bool]) -> dict[str, Any]:
    """Route shares of the tasks that need a tool and of those that do not, over all types and
    within each type that holds both kinds."""
    out: dict[str, Any] = {}
    for t in ["all", *sorted({r["task_type"] for r in rows})]:
        kinds = {}
        for label, want in (("needs_tool", True), ("no_tool", False)):
            got = [
                r
                for r, n in zip(rows, need, strict=True)
                if n == want and t in ("all", r["task_type"])
            ]
            if got:
                kinds[label] = {k: fmean(r["probs"][k] for r in got) for k in got[0]["probs"]}
        if t == "all" or len(kinds) == 2:
            out[t] = kinds
    return out


def outcome_labels(rows: list[Row]) -> list[bool]:
    """Per task, what its own episodes say: its best tool route's mean reward beats ANSWER's
    (strictly; a tie needs no tool)."""
    return [
        max(v for r, v in x["reward"].items() if r != ANSWER) > x["reward"][ANSWER] for x in rows
    ]


def type_labels(rows: list[Row], need: list[bool] | None = None) -> list[bool | None]:
    """Per task, what its type says. Given the dataset's need-a-tool flags: the type's flag where
    all its tasks share it (calculator and search need a tool, direct does not), None in a type
    that mixes both (arith_mixed: its tasks' own flags are ``auroc_need``'s label). Without
    them: the type's best tool route, averaged over its tasks, beats ANSWER's average (a label
    that can put every type on one side, leaving its AUROC undefined)."""
    label: dict[str, bool | None] = {}
    for t in {x["task_type"] for x in rows}:
        got = [i for i, x in enumerate(rows) if x["task_type"] == t]
        if need is not None:
            flags = {need[i] for i in got}
            label[t] = flags.pop() if len(flags) == 1 else None
            continue
        mean = {r: fmean(rows[i]["reward"][r] for i in got) for r in rows[got[0]]["reward"]}
        label[t] = max(v for r, v in mean.items() if r != ANSWER) > mean[ANSWER]
    return [label[x["task_type"]] for x in rows]


def type_auroc(rows: list[Row], need: list[bool] | None = None) -> float | None:
    """P(tool)'s AUROC against the type label, over the tasks whose type has one."""
    pairs = [(p_tool(r), y) for r, y in zip(rows, type_labels(rows, need), strict=True)]
    kept = [(p, y) for p, y in pairs if y is not None]
    return auroc([p for p, _ in kept], [y for _, y in kept]) if kept else None


def type_mean_rows(rows: list[Row]) -> list[Row]:
    """The rows with each task's route probabilities replaced by its type's mean: the router
    that knows the task type and nothing finer."""
    shares = route_shares(rows)
    return [{**x, "probs": dict(shares[x["task_type"]])} for x in rows]


def fixed_mix(rows: list[Row], cost: float) -> dict[str, Any]:
    """The best task-blind mix at mean cost ``cost``: one distribution q over routes played on
    every task. Reward and cost are linear in q, so the best q at a given cost mixes at most two
    routes; each pair that brackets ``cost`` is tried (the nearest single route if none does).
    Returns q, its mean reward and cost, and its per-task expected rewards."""
    routes = list(rows[0]["probs"])
    c = {r: fmean(x["cost"][r] for x in rows) for r in routes}
    rew = {r: fmean(x["reward"][r] for x in rows) for r in routes}
    best: tuple[float, dict[str, float]] | None = None
    for a in routes:
        for b in routes:
            if c[a] <= cost <= c[b] and (a == b or c[b] > c[a]):
                w = 1.0 if a == b else (c[b] - cost) / (c[b] - c[a])
                q = {r: 0.0 for r in routes}
                q[a] += w
                q[b] += 1 - w
                value = sum(q[r] * rew[r] for r in routes)
                if best is None or value > best[0]:
                    best = (value, q)
    if best is None:  # the cost lies outside every route's: the nearest route alone
        near = min(routes, key=lambda r: (abs(c[r] - cost), -rew[r]))
        best = (rew[near], {r: float(r == near) for r in routes})
    q = best[1]
    return {
        "q": q,
        "reward": best[0],
        "cost": sum(q[r] * c[r] for r in routes),
        "per_task": [expected(x, "reward", q) for x in rows],
    }


def per_type_optimum(rows: list[Row], cost: float) -> dict[str, Any]:
    """The best allocation that sees the task type but nothing finer, at mean cost ≤ ``cost``:
    a linear program over the per-type route table, solved exactly as a fractional knapsack
    on each type's upper hull of (cost, reward) points, steepest segments first."""
    routes = list(rows[0]["probs"])
    segments, value, spent, q = [], 0.0, 0.0, {}
    for t in sorted({x["task_type"] for x in rows}):
        got = [x for x in rows if x["task_type"] == t]
        w = len(got) / len(rows)
        pts = {
            r: (fmean(x["cost"][r] for x in got), fmean(x["reward"][r] for x in got))
            for r in routes
        }
        at = min(routes, key=lambda r: (pts[r][0], -pts[r][1]))
        q[t] = {r: float(r == at) for r in routes}
        value, spent = value + w * pts[at][1], spent + w * pts[at][0]
        while True:  # the hull: from ``at``, the costlier route with the steepest gain
            up = [r for r in routes if pts[r][0] > pts[at][0]]
            slope = {r: (pts[r][1] - pts[at][1]) / (pts[r][0] - pts[at][0]) for r in up}
            nxt = max(up, key=lambda r: slope[r], default=None)
            if nxt is None or slope[nxt] <= 0:
                break
            segments.append((slope[nxt], w * (pts[nxt][0] - pts[at][0]), t, at, nxt))
            at = nxt
    for gain, dc, t, a, b in sorted(segments, key=lambda s: -s[0]):
        f = min(1.0, max(0.0, cost - spent) / dc)
        if f <= 0:
            break
        q[t][a], q[t][b] = q[t][a] - f, q[t][b] + f
        value, spent = value + f * gain * dc, spent + f * dc
    return {"reward": value, "cost": spent, "q": q}


def seed_summary(rows: list[Row], need: list[bool] | None = None) -> dict[str, Any]:
    """One training seed's routed eval: the sampled router's reward and cost; its paired gain
    over the best task-blind mix at its cost and over the type-mean router (what per-task
    information adds); P(tool)'s AUROC against each task's own outcome, its type's, and (given
    ``need``) the dataset's need-a-tool flag; route shares; the per-type optimum at its cost."""
    mine = [expected(r, "reward") for r in rows]
    cost = fmean(expected(r, "cost") for r in rows)
    mix = fixed_mix(rows, cost)
    blind = [a - b for a, b in zip(mine, mix.pop("per_task"), strict=True)]
    typed = type_mean_rows(rows)
    by_type = [a - expected(t, "reward") for a, t in zip(mine, typed, strict=True)]
    outcome = outcome_labels(rows)
    gain, gain_se = mean_se(blind)
    tgain, tgain_se = mean_se(by_type)
    out = {
        "tasks": len(rows),
        "reward": fmean(mine),
        "cost": cost,
        "gain_vs_blind": gain,
        "gain_vs_blind_se": gain_se,
        "gain_vs_type_mean": tgain,
        "gain_vs_type_mean_se": tgain_se,
        "type_mean_cost": fmean(expected(t, "cost") for t in typed),
        "auroc_outcome": auroc([p_tool(r) for r in rows], outcome),
        "auroc_type": type_auroc(rows, need),
        # the type's mean P(tool) alone against the outcome label: what the type already tells
        "auroc_outcome_type_mean": auroc([p_tool(r) for r in typed], outcome),
        "need_outcome_frac": fmean(float(x) for x in outcome),
        "fixed_mix": mix,
        "route_share": route_shares(rows),
        "route_share_by_outcome": route_share_by_need(rows, outcome),
        "per_type_optimum": per_type_optimum(rows, cost),
    }
    if need is not None:
        out["auroc_need"] = auroc([p_tool(r) for r in rows], need)
        out["route_share_by_need"] = route_share_by_need(rows, need)
    return out


def blind_diffs(rows: list[Row]) -> dict[str, float]:
    """Per task: the router's expected reward minus the best blind mix's at its cost."""
    mix = fixed_mix(rows, fmean(expected(r, "cost") for r in rows))
    return {key(r): expected(r, "reward") - b for r, b in zip(rows, mix["per_task"], strict=True)}


def pooled_diff(per_seed: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-task differences of several seeds pooled over the tasks every seed has: the mean,
    its crossed tasks × seeds SE (one seed: the SE over tasks), and z."""
    common = sorted(set.intersection(*(set(d) for d in per_seed))) if per_seed else []
    if len(common) < 2:
        return {"gain": float("nan"), "se": float("nan"), "z": float("nan"), "tasks": len(common)}
    cells = [[d[k] for d in per_seed] for k in common]
    mean = fmean(x for row in cells for x in row)
    se = two_way_se(cells) if len(per_seed) > 1 else mean_se([row[0] for row in cells])[1]
    return {
        "gain": mean,
        "se": se,
        "z": mean / se if se > 0 else float("nan"),
        "tasks": len(common),
    }


def otc_table(samples: Iterable[Mapping[str, Any]], cost_of: Any) -> dict[str, dict[str, Any]]:
    """One policy's mean reward and cost per task over its episodes (``toolgrpo eval``'s kept
    samples); ``cost_of(sample)`` prices one episode as the router's cost model does."""
    got: dict[str, list[tuple[float, float]]] = {}
    types: dict[str, str] = {}
    for s in samples:
        k = key(s)
        types[k] = s["task_type"]
        got.setdefault(k, []).append((float(s["reward"]), float(cost_of(s))))
    return {
        k: {
            "task_type": types[k],
            "episodes": len(v),
            "reward": fmean(r for r, _ in v),
            "cost": fmean(c for _, c in v),
        }
        for k, v in got.items()
    }


def mix_at_cost(
    tables: Mapping[float, Mapping[str, Mapping[str, Any]]], cost: float, keys: Sequence[str]
) -> dict[str, Any]:
    """The best mix of two trained policies (one per penalty) at mean cost ``cost`` over
    ``keys``: each task is played by policy a with probability w, b otherwise (the same w on
    every task), so reward and cost interpolate. Pairs that bracket ``cost`` are tried; without
    one, the policy of the nearest cost alone (``bracketed`` False). Per-task rewards for
    pairing."""
    keys = [k for k in keys if all(k in t for t in tables.values())]
    c = {p: fmean(t[k]["cost"] for k in keys) for p, t in tables.items()}
    r = {p: fmean(t[k]["reward"] for k in keys) for p, t in tables.items()}
    best: tuple[float, float, float, float] | None = None  # value, a, b, w
    for a in tables:
        for b in tables:
            if c[a] <= cost <= c[b] and (a == b or c[b] > c[a]):
                w = 1.0 if a == b else (c[b] - cost) / (c[b] - c[a])
                value = w * r[a] + (1 - w) * r[b]
                if best is None or value > best[0]:
                    best = (value, a, b, w)
    bracketed = best is not None
    if best is None:
        near = min(tables, key=lambda p: (abs(c[p] - cost), -r[p]))
        best = (r[near], near, near, 1.0)
    _, a, b, w = best
    per_task = {k: w * tables[a][k]["reward"] + (1 - w) * tables[b][k]["reward"] for k in keys}
    return {
        "penalties": sorted({a, b}),
        "weight_of_first": w if a <= b else 1 - w,
        "reward": fmean(per_task.values()),
        "cost": w * c[a] + (1 - w) * c[b],
        "bracketed": bracketed,
        "by_penalty": {str(p): {"reward": r[p], "cost": c[p]} for p in sorted(tables)},
        "per_task": per_task,
    }
