"""The budgeted-router benchmark's report (``benchmarks/router_budget.py``): where a run's cost
settled against its budget, why it did not when it did not, the held-out routed policy against the
fixed-route baselines, and the table and plot of every run. Pure functions of the per-step rows
a run logged (``router/...`` and ``val/...`` metrics), so they are tested without a model."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

from rich.console import Console
from rich.table import Table

from toolgrpo.router.routes import ROUTES

TASK_TYPES = ("calculator", "search", "direct")
SELECTIONS = ("router", "router_sampled", "always_answer", "always_family", "best_in_hindsight")
PREFIX = {"router_sampled": "val/sampled"}  # where validation logs each selection's numbers
UNCONSTRAINED = 1.0  # the top of the `any` cost range: the budget never binds, λ stays 0
TOLERANCE = 0.05
SATURATED = 0.85  # ANSWER's share of routes beyond which the router has stopped exploring


def held_out(rows: list[dict]) -> dict[str, Any]:
    """The last validation's routed reward, accuracy and cost per task type, beside the
    baselines' (``val/<type>/...`` and ``val/baseline/<name>/<type>/...``)."""
    last = next((r for r in reversed(rows) if any(k.startswith("val/") for k in r)), {})
    out: dict[str, Any] = {}
    for t in (*TASK_TYPES, "all"):
        if f"val/{t}/reward_mean" not in last:
            continue
        row = {
            "router": {
                "reward_mean": last.get(f"val/{t}/reward_mean"),
                "accuracy": last.get(f"val/{t}/accuracy"),
                "cost_mean": last.get(f"val/{t}/cost/mean"),
                "route_frac": {r: last.get(f"val/{t}/route/{r}", 0.0) for r in ROUTES},
            }
        }
        for name in SELECTIONS[1:]:
            row[name] = {
                k: last.get(f"{PREFIX.get(name, 'val/baseline/' + name)}/{t}/{k}")
                for k in ("reward_mean", "accuracy", "cost_mean")
            }
        out[t] = row
    return out


def last_quarter(rows: list[dict]) -> list[dict]:
    """The rows a run is judged on: the last quarter of its steps (at least one)."""
    return rows[-max(1, len(rows) // 4) :]


def summarize(rows: list[dict], budget: float, mode: str, seconds: float) -> dict[str, Any]:
    """Means over the last quarter of the steps: where the run settled."""
    tail = last_quarter(rows)

    def mean(key: str) -> float | None:
        vals = [r[key] for r in tail if key in r]
        return fmean(vals) if vals else None

    out: dict[str, Any] = {
        "budget": budget,
        "lagrangian": mode,
        "cost_last_quarter": mean("router/cost/mean"),
        "cost_last_quarter_se": _se(
            [r["router/cost/mean"] for r in tail if "router/cost/mean" in r]
        ),
        "lambda_last_quarter": mean("router/lambda"),
        "task_reward": mean("router/task_reward/mean"),
        "route_frac": {r: mean(f"router/route_frac/{r}") for r in ROUTES},
        "cost_by_route": {r: mean(f"router/cost/{r}") for r in ROUTES},
        "by_task_type": {
            t: {
                "cost": mean(f"router/{t}/cost/mean"),
                "task_reward": mean(f"router/{t}/task_reward/mean"),
                "route_frac": {r: mean(f"router/{t}/route_frac/{r}") for r in ROUTES},
            }
            for t in TASK_TYPES
            if any(f"router/{t}/cost/mean" in r for r in rows)
        },
        "held_out": held_out(rows),
        "steps": len(rows),
        "seconds_per_step": seconds / max(len(rows), 1),
    }
    cost = out["cost_last_quarter"]
    out["settled"] = cost is not None and abs(cost - budget) <= TOLERANCE
    return out


def diagnose(
    s: dict[str, Any], rows: list[dict], free_rate: float | None, gap: dict | None = None
) -> str | None:
    """Why the cost did not settle at B (None when it did), from what the run logged and its
    ``paired_gap`` to the unconstrained run."""
    if s["settled"]:
        return None
    b, cost, lam = s["budget"], s["cost_last_quarter"] or 0.0, s["lambda_last_quarter"] or 0.0
    if free_rate is not None and b >= free_rate - TOLERANCE and cost < b + TOLERANCE:
        if gap is not None and gap["se"] is not None and gap["mean"] + 2 * gap["se"] < 0:
            if s.get("lagrangian") == "reward":
                fix = (
                    ", and in reward mode a group whose task rewards tie turns any λ > 0 into a "
                    "full-size push to ANSWER: router.lagrangian=advantage"
                )
            else:
                fix = (
                    "; a dual step over several steps (router.update_every) or a smaller "
                    "router.dual_kp"
                )
            return (
                f"undershoot at a budget near the policy's own tool rate: unconstrained it spends "
                f"{free_rate:.2f}, yet λ held the cost {-gap['mean']:.2f} ± {gap['se']:.2f} below "
                "that, step for step: λ ≥ 0 rises on the noisy steps above B and cannot push "
                "back on those below it" + fix
            )
        return f"the budget does not bind: unconstrained, the policy's tool rate is {free_rate:.2f}"
    floor = s["cost_by_route"].get("ANSWER")
    if cost > b and floor is not None and floor > b:
        return (
            f"cost floor: even the ANSWER route costs {floor:.2f} per example (the LM still writes "
            f"tool calls there), so no routing reaches B={b}"
        )
    peak = max((r.get("router/lambda", 0.0) for r in rows), default=0.0)
    answer = s["route_frac"].get("ANSWER") or 0.0
    if cost < b and peak > 1e-6 and (lam <= 1e-6 or answer >= SATURATED):
        fell = "after λ fell back to 0" if lam <= 1e-6 else f"while λ bled off (still {lam:.2f})"
        return (
            f"overshoot: λ rose to {peak:.2f} while the cost was above B, the router moved to "
            f"ANSWER ({answer:.0%} of routes in the last quarter) and stayed there {fell}: its "
            "route distribution saturated, and a group whose sampled routes are all the same "
            "carries no signal; a larger router.entropy_coeff, or a smaller router.lr or "
            "router.dual_lr"
        )
    if cost < b and lam <= 1e-6:
        return "the budget does not bind: with λ = 0 the router spends less than B"
    trend = [r["router/lambda"] for r in rows[-3:] if "router/lambda" in r]
    moving = len(trend) > 1 and abs(trend[-1] - trend[0]) > 1e-3
    return (
        f"not converged in {len(rows)} steps (λ={lam:.2f}"
        + (", still moving" if moving else "")
        + "): more steps, a larger router.dual_lr or router.lr"
    )


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_c, ax_r) = plt.subplots(1, 3, figsize=(16, 4.2))
    styles = {"reward": "-", "advantage": "--"}
    for name, run in runs.items():
        rows, s = run["rows"], run["summary"]
        steps = [r["step"] for r in rows]
        style = styles.get(s["lagrangian"], ":")
        ax_l.plot(steps, [r.get("router/lambda", 0.0) for r in rows], style, label=name)
        line = ax_c.plot(steps, [r.get("router/cost/mean", 0.0) for r in rows], style, label=name)
        if s["budget"] < UNCONSTRAINED:
            ax_c.axhline(s["budget"], linestyle=":", color=line[0].get_color(), linewidth=1)
    ax_l.set(xlabel="training step", ylabel="λ (price of a tool call)", title="λ")
    ax_c.set(xlabel="training step", ylabel="mean tool cost per example", title="cost vs budget")
    ax_c.set_ylim(bottom=0)
    # Held-out reward: each run's routed policy beside the fixed routes (from the first run
    # that has them; baselines depend on the LM, so each run has its own, shown as markers).
    names = list(runs)
    for k, sel in enumerate(SELECTIONS):
        ys = [
            ((runs[n]["summary"]["held_out"].get("all") or {}).get(sel) or {}).get("reward_mean")
            for n in names
        ]
        xs = [i for i, y in enumerate(ys) if y is not None]
        ax_r.plot(xs, [ys[i] for i in xs], "o" if sel == "router" else "x", label=sel, ms=6 - k)
    ax_r.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
    ax_r.set(ylabel="held-out task reward (all types)", title="routed vs fixed routes")
    for ax in (ax_l, ax_c, ax_r):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def paired_gap(rows: list[dict], free_rows: list[dict]) -> dict[str, Any] | None:
    """The run's cost minus the unconstrained run's, step by step over the run's last quarter.
    Runs with the same ``data.seed`` draw the same tasks at every step, so the task mix's swing
    from step to step (most of a step's cost noise) cancels: the gap's standard error is a
    fraction of either cost's, and a gap near 0 says λ did not move the policy."""
    free = {r["step"]: r["router/cost/mean"] for r in free_rows if "router/cost/mean" in r}
    gaps = [
        r["router/cost/mean"] - free[r["step"]]
        for r in last_quarter(rows)
        if "router/cost/mean" in r and r["step"] in free
    ]
    if not gaps:
        return None
    return {"mean": fmean(gaps), "se": _se(gaps), "steps": len(gaps)}


def _se(xs: list[float]) -> float | None:
    """Standard error of a mean of per-step values (steps taken as independent: a settled
    policy's step-to-step cost is mostly sampling noise, about 0.09 at 48 episodes a step)."""
    return stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _acc(d: dict[str, Any] | None, n: int) -> str:
    """Held-out accuracy ± its binomial standard error over ``n`` tasks (unpaired)."""
    p = (d or {}).get("accuracy")
    return "-" if p is None else f"{p:.3f} ± {math.sqrt(p * (1 - p) / max(n, 1)):.3f}"


def table(runs: dict[str, dict[str, Any]], markdown: bool, n_val: int) -> None:
    head = ["run", "cost (last ¼) ± SE", "settled", "λ", "cost − unconstrained (paired)"]
    head += ["task reward", *ROUTES]
    head += [f"held-out acc. {s}" for s in SELECTIONS]
    lines = []
    for name, run in runs.items():
        s = run["summary"]
        f = s["route_frac"]
        ho = s["held_out"].get("all", {})
        gap = s.get("vs_unconstrained_paired")
        lines.append(
            [
                name,
                _fmt(s["cost_last_quarter"])
                + (f" ± {se:.3f}" if (se := s.get("cost_last_quarter_se")) is not None else ""),
                "-" if s["budget"] >= UNCONSTRAINED else ("yes" if s["settled"] else "no"),
                _fmt(s["lambda_last_quarter"]),
                "-" if gap is None else f"{gap['mean']:+.3f} ± {_fmt(gap['se'])}",
                _fmt(s["task_reward"]),
                *(_fmt(f[r], ".2f") for r in ROUTES),
                *(_acc(ho.get(sel), n_val) for sel in SELECTIONS),
            ]
        )
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in lines:
            print("| " + " | ".join(row) + " |")
    else:
        t = Table(title="Budgeted router: tool cost vs budget, and held-out reward vs fixed routes")
        for h in head:
            t.add_column(h, justify="right")
        for row in lines:
            t.add_row(*row)
        Console(width=200).print(t)
    for name, run in runs.items():
        if run["summary"].get("why_not"):
            print(f"{name}: {run['summary']['why_not']}")
