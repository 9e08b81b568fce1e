"""Budgeted tool router (issue #4): does dual ascent hold the mean tool cost at the budget B?

One router-only run per budget (the LM frozen, only the router head and λ learn) over RLLA,
calculator and search tasks played as multi-turn episodes. For each B: the final mean cost
(mean over the last third of the steps) against B, the task reward, the route fractions
overall and per task type, and λ; plus a PNG of λ and cost over the steps. When the cost does
not settle within ±0.05 of B, the table says why (a cost floor, a budget that does not bind, or
too few steps for λ to get there).

Run by hand (SmolLM2: hours on a 2-core CPU):  python benchmarks/router_budget.py [--steps 30]
Writes benchmarks/results/router_budget.json and router_budget.png (or ``--results DIR``) and
prints one table (``--markdown`` for the README). ``key=value`` overrides apply to every run,
e.g. a tiny model for a smoke test.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from toolgrpo.config.loader import load_config  # noqa: E402
from toolgrpo.config.schema import TrainConfig  # noqa: E402
from toolgrpo.router.routes import ROUTES  # noqa: E402
from toolgrpo.trainer.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASK_TYPES = ("rlla", "calculator", "search")
MT = "actor_rollout_ref.rollout.multi_turn."
BASE = [
    "actor_rollout_ref.model.path=smollm2-135m-toolrl",
    f"data.train_files=[{','.join(f'{t}:train' for t in TASK_TYPES)}]",
    "data.val_files=[calculator:test]",
    "data.train_batch_size=8",
    "data.max_prompt_length=1536",
    "data.max_response_length=256",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.generation_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    f"{MT}enable=true",
    f"{MT}max_tokens_per_turn=128",
    f"{MT}envs.calculator.max_turns=3",
    f"{MT}envs.search.max_turns=3",
    "router.enable=true",
    "router.freeze_lm=true",
    "router.lr=1.0",
    "router.dual_lr=1.0",
    "router.lambda_init=0.0",
    "router.cost.mode=any",
    "trainer.save_freq=-1",
    "trainer.max_checkpoints=1",
    "trainer.logger=[jsonl]",
    "trainer.resume=disable",
    "trainer.overwrite_output_dir=true",  # a re-run replaces (moves aside) the last one
]
TOLERANCE = 0.05


def run_budget(budget: float, overrides: list[str], out: Path) -> tuple[list[dict], float]:
    """One router-only run at budget B; its per-step router metrics and wall time."""
    cfg = load_config(
        TrainConfig,
        None,
        [*BASE, *overrides, f"router.budget={budget}", f"trainer.output_dir={out}"],
    )
    t0 = time.time()
    trainer = Trainer(cfg)
    history = trainer.fit()
    seconds = time.time() - t0
    del trainer
    gc.collect()
    rows = [
        {"step": i + 1, **{k: float(v) for k, v in h.items() if k.startswith("router/")}}
        for i, h in enumerate(history)
    ]
    return rows, seconds


def summarize(rows: list[dict], budget: float, seconds: float) -> dict[str, Any]:
    """Means over the last third of the steps (at least one): where the run settled."""
    tail = rows[-max(1, len(rows) // 3) :]

    def mean(key: str) -> float | None:
        vals = [r[key] for r in tail if key in r]
        return fmean(vals) if vals else None

    out: dict[str, Any] = {
        "budget": budget,
        "final_cost": mean("router/cost/mean"),
        "task_reward": mean("router/task_reward/mean"),
        "router_reward": mean("router/reward/mean"),
        "lambda": rows[-1].get("router/lambda_next", rows[-1].get("router/lambda")),
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
        "steps": len(rows),
        "seconds_per_step": seconds / max(len(rows), 1),
    }
    out["settled"] = out["final_cost"] is not None and abs(out["final_cost"] - budget) <= TOLERANCE
    out["why_not"] = None if out["settled"] else diagnose(out, rows)
    return out


def diagnose(s: dict[str, Any], rows: list[dict]) -> str:
    """Why the cost did not settle at B, from what the run logged."""
    b, cost, lam = s["budget"], s["final_cost"] or 0.0, s["lambda"] or 0.0
    floor = s["cost_by_route"].get("ANSWER")
    if cost > b and floor is not None and floor > b:
        return (
            f"cost floor: even the ANSWER route costs {floor:.2f} per example (the frozen LM "
            f"still calls tools without them), so no routing reaches B={b}"
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

    fig, (ax_l, ax_c) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs.values():
        rows, b = run["rows"], run["summary"]["budget"]
        steps = [r["step"] for r in rows]
        ax_l.plot(steps, [r.get("router/lambda", 0.0) for r in rows], marker=".", label=f"B={b}")
        line = ax_c.plot(steps, [r.get("router/cost/mean", 0.0) for r in rows], marker=".")
        line[0].set_label(f"B={b}")
        ax_c.axhline(b, linestyle="--", color=line[0].get_color(), linewidth=1)
    ax_l.set(xlabel="training step", ylabel="λ (price of a tool call)", title="λ over steps")
    ax_c.set(xlabel="training step", ylabel="mean tool cost per example", title="cost vs budget")
    ax_c.set_ylim(bottom=0)
    for ax in (ax_l, ax_c):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(runs: dict[str, dict[str, Any]], markdown: bool) -> None:
    head = ["B", "final cost", "settled", "task reward", "λ", *ROUTES, "s/step"]
    lines = []
    for run in runs.values():
        s = run["summary"]
        f = s["route_frac"]
        lines.append(
            [
                f"{s['budget']:.2f}",
                f"{s['final_cost']:.3f}",
                "yes" if s["settled"] else "no",
                f"{s['task_reward']:.3f}",
                f"{s['lambda']:.3f}",
                *(f"{f[r]:.2f}" for r in ROUTES),
                f"{s['seconds_per_step']:.1f}",
            ]
        )
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in lines:
            print("| " + " | ".join(row) + " |")
    else:
        t = Table(title="Budgeted router: mean tool cost vs budget (last third of the steps)")
        for h in head:
            t.add_column(h, justify="right")
        for row in lines:
            t.add_row(*row)
        Console(width=120).print(t)
    for run in runs.values():
        if run["summary"]["why_not"]:
            print(f"B={run['summary']['budget']}: {run['summary']['why_not']}")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.3, 0.6])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: a tmp dir)")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args, extra = ap.parse_known_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="toolgrpo_router_budget_"))
    overrides = [
        f"trainer.total_training_steps={args.steps}",
        f"trainer.seed={args.seed}",
        f"data.seed={args.seed}",
        *extra,
    ]
    runs: dict[str, dict[str, Any]] = {}
    for b in args.budgets:
        rows, seconds = run_budget(b, overrides, work / f"budget_{b}")
        runs[f"{b}"] = {"summary": summarize(rows, b, seconds), "rows": rows}
    args.results.mkdir(parents=True, exist_ok=True)
    result = {
        "what": "router-only training (LM frozen) per budget B; cost = any tool call (0/1)",
        "overrides": [*BASE, *overrides],
        "tolerance": TOLERANCE,
        "runs": runs,
    }
    (args.results / "router_budget.json").write_text(json.dumps(result, indent=1))
    plot(runs, args.results / "router_budget.png")
    table(runs, args.markdown)
    print(f"wrote {args.results / 'router_budget.json'} and router_budget.png; runs in {work}")


if __name__ == "__main__":
    main(sys.argv[1:])
