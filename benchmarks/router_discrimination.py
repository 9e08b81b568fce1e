"""Does the budgeted router spend its tool budget on the tasks that need a tool?

Task mix where the choice matters: ``calculator`` and ``search`` (need their tool), ``direct``
with the calculator and search offered but useless (``offer_tools``: an unneeded call costs),
and ``arith_mixed`` (half the questions need the calculator, half do not; each row says which).
SEARCH and CALCULATE offer their own family only (``router.family_tools_only``). One run at
B = 0.3 and one unconstrained (B = 1) on the agent warm start, the LM training beside the head
(``benchmarks/router_budget.py``'s settings otherwise); then each final checkpoint is scored
with ``toolgrpo eval`` on held-out tasks, every task under every route, and read per task:

- ``route_share[type][route]``: the sampled router's route shares (mean probabilities);
- ``auroc``: P(tool route) = 1 − P(ANSWER) against "this task needs a tool";
- ``router.reward`` / ``router.cost``: the sampled router's expected reward and cost;
- ``fixed_mix``: the best task-blind route mix at the router's cost (one distribution over
  routes for every task), and the router's reward minus it, paired by task (``se``);
- ``probe_accuracy``: a cross-validated linear probe of task type on the head's own features
  (does the input separate the types at all?); ``--probe-only`` measures it on the warm start
  for each ``router.inputs`` × ``router.feature_layer`` without training anything.

    python benchmarks/router_discrimination.py --probe-only       # minutes
    python benchmarks/router_discrimination.py [--steps 60]       # hours on 2 cores; resumes
    python benchmarks/router_discrimination.py --runs unconstrained   # one of the two runs

Writes ``benchmarks/results/router_discrimination.json`` (+ the probe table on stdout), and keeps
each run's routed eval, without its episodes' text, in ``router_discrimination_kept/<work>/``
(``<work>``: the name of ``--work``): a later checkout re-reads a kept run instead of training it
again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

TYPES = ("calculator", "search", "direct", "arith_mixed")
MT = "actor_rollout_ref.rollout.multi_turn."
MIX = [
    f"data.train_files=[{','.join(f'{t}:train' for t in TYPES)}]",
    f"{MT}envs.direct.offer_tools=true",
    f"{MT}envs.direct.max_turns=3",
    f"{MT}envs.arith_mixed.max_turns=3",
    "router.family_tools_only=true",
    # The head's SGD step: at 1.0 (router_budget.py's) 60 steps leave it short of converged
    # (ANSWER on 76 % of direct tasks on SmolLM2); tests/router/test_bandit_horizon.py models
    # this horizon on SmolLM2's measured route table: 4 converges, 8 collapses onto ANSWER.
    "router.lr=4.0",
]
TOOL_ROUTES = ("SEARCH", "CALCULATE")
RUNS = {"B=0.3": 0.3, "unconstrained": 1.0}  # run name under --work: its budget


# ---- pure analysis of a routed eval's per-task table -------------------------------------------
def expected(row: dict[str, Any], key: str, probs: dict[str, float] | None = None) -> float:
    """A task's expected ``reward`` or ``cost`` under route probabilities (the head's)."""
    p = probs if probs is not None else row["probs"]
    return sum(p[r] * row[key][r] for r in p if p[r] > 0)


def route_shares(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean route probability per task type (the sampled router's shares) and over all."""
    out: dict[str, dict[str, float]] = {}
    for t in sorted({r["task_type"] for r in rows}) + ["all"]:
        got = [r for r in rows if t in (r["task_type"], "all")]
        out[t] = {k: fmean(r["probs"][k] for r in got) for k in got[0]["probs"]}
    return out


def fixed_mix(rows: list[dict[str, Any]], cost: float) -> dict[str, Any]:
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


def per_type_optimum(rows: list[dict[str, Any]], cost: float) -> dict[str, Any]:
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


def route_share_by_need(rows: list[dict[str, Any]], need: list[bool]) -> dict[str, Any]:
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


def auroc_need(rows: list[dict[str, Any]], need: list[bool]) -> float | None:
    from toolgrpo.router.metrics import auroc

    return auroc([1.0 - r["probs"].get("ANSWER", 0.0) for r in rows], need)


def discrimination(rows: list[dict[str, Any]], need: list[bool]) -> dict[str, Any]:
    """The sampled router against the best task-blind mix at its own cost, paired by task."""
    mine = [expected(r, "reward") for r in rows]
    cost = fmean(expected(r, "cost") for r in rows)
    mix = fixed_mix(rows, cost)
    diff = [a - b for a, b in zip(mine, mix.pop("per_task"), strict=True)]
    se = stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    mix.update(gain=fmean(diff), se=se)
    return {
        "tasks": len(rows),
        "router": {"reward": fmean(mine), "cost": cost},
        "fixed_mix": mix,
        "route_share": route_shares(rows),
        "route_share_by_need": route_share_by_need(rows, need),
        "per_type_optimum": per_type_optimum(rows, cost),
        "auroc": auroc_need(rows, need),
    }


# ---- model-side pieces -------------------------------------------------------------------------
def held_out(path: Path, per_type: int) -> list[Any]:
    """The first ``per_type`` test tasks of each type, written to ``path`` (the runs' val
    file) and loaded from it."""
    from router_budget import write_val

    from toolgrpo.data.loader import load_tasks

    return load_tasks([str(write_val(path, per_type, TYPES))], "error").tasks


def probe(cfg_overrides: list[str], tasks: list[Any], checkpoint: str | None) -> dict[str, Any]:
    """Probe accuracy of task type (and of need-a-tool) on the head's features, per input kind
    and layer (a checkpoint's head: its own inputs and layer only)."""
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.envs.arith_mixed import needs_tool
    from toolgrpo.eval.cli import apply_checkpoint
    from toolgrpo.models.loading import load_policy
    from toolgrpo.rewards.types import RllaFlags
    from toolgrpo.router.infer import load_router
    from toolgrpo.router.probe import probe_accuracy
    from toolgrpo.trainer.episodes import make_router

    cfg = load_config(TrainConfig, None, cfg_overrides)
    if checkpoint:
        apply_checkpoint(cfg, checkpoint)
    envs = make_router(cfg, RllaFlags(**vars(cfg.reward.rlla)))
    lm = load_policy(cfg.actor_rollout_ref.model, trainable=False)
    layers = lm.base.config.num_hidden_layers
    kinds = (
        [(None, None)]
        if checkpoint
        else [(inputs, layer) for inputs in ("question", "opening") for layer in (-1, layers // 2)]
    )
    types = [t.task_type for t in tasks]
    need = [bool(needs_tool(t)) for t in tasks]
    out = {}
    for inputs, layer in kinds:
        if inputs is not None:
            cfg.router.inputs, cfg.router.feature_layer = inputs, layer
        head, _ = load_router(cfg, lm, checkpoint)
        head.read_tasks_with(envs, cfg.data.max_prompt_length)
        feats = head.features_of(tasks)
        key = f"{head.inputs}@layer{head.feature_layer}"
        out[key] = {
            "task_type": probe_accuracy(feats, types),
            "needs_tool": probe_accuracy(feats, need),
        }
        for t in sorted(set(types)):  # a type where tools help only sometimes: which ones?
            idx = [i for i, x in enumerate(types) if x == t]
            if len({need[i] for i in idx}) == 2:
                got = probe_accuracy(feats[idx], [need[i] for i in idx])
                out[key][f"needs_tool_within_{t}"] = got
        shown = ", ".join(f"{k} {v:.3f}" for k, v in out[key].items())
        print(f"probe {key} ({len(tasks)} tasks): {shown}", flush=True)
    return out


def train_and_eval(name: str, budget: float, args: argparse.Namespace, work: Path) -> dict:
    """One router run (``router_budget.run_one``, resumable) and its routed eval's table. The
    eval is kept in git without its episodes' text (``kept``); a kept eval counts as done, and
    the run's checkpoint is then None when the work directory no longer holds it. Kept evals are
    filed under the work directory's name: like the work directory, it names one setting."""
    from kept import find, keep_eval, kept_dir
    from router_budget import run_one

    run = work / name
    final = run / "checkpoints" / f"global_step_{args.steps}"
    out = work / f"eval_{name}.json"
    kept = kept_dir(args.results / "router_discrimination.json") / work.name / out.name
    found = find(out, kept)
    if found is None:
        overrides = [
            *MIX,
            f"trainer.total_training_steps={args.steps}",
            f"trainer.test_freq={args.steps}",
            f"trainer.seed={args.seed}",
            f"data.val_files=[{work / 'val.jsonl'}]",
            *args.extra,
        ]
        if not (final / "trainer_state.json").is_file():
            run_one(budget, "price", overrides, run)
        cmd = [sys.executable, "-m", "toolgrpo.cli", "eval", "--checkpoint", str(final)]
        cmd += ["--samples", "0", "--output", str(out), str(run / "config.yaml")]
        subprocess.run(cmd, cwd=ROOT, check=True)
        found = out
    keep_eval(found, kept)
    record = json.loads(found.read_text())
    ck = str(final) if (final / "trainer_state.json").is_file() else None
    return {"checkpoint": ck, "rows": find_per_task(record)}


def find_per_task(record: Any) -> list[dict[str, Any]]:
    """The routed eval's ``per_task`` table, wherever the eval JSON nests its routing report."""
    if isinstance(record, dict):
        if isinstance(record.get("per_task"), list):
            return record["per_task"]
        for v in record.values():
            got = find_per_task(v)
            if got:
                return got
    return []


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--per-type", type=int, default=34, help="held-out tasks per task type")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "router_discrimination")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--probe-only", action="store_true")
    ap.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    args, args.extra = ap.parse_known_args(argv)
    from router_budget import BASE

    tasks = held_out(args.work / "val.jsonl", args.per_type)
    result = previous(args)  # a run not made now keeps its result; a kept run, its probe
    result["held_out"] = {t: sum(x.task_type == t for x in tasks) for t in TYPES}
    result["work"] = _rel(args.work)
    result["probe_warm_start"] = probe([*BASE, *MIX, *args.extra], tasks, None)
    if not args.probe_only:
        from toolgrpo.envs.arith_mixed import needs_tool

        for name, budget in RUNS.items():
            if name not in args.runs:
                continue
            got = train_and_eval(name, budget, args, args.work)
            by_id = {(t.task_type, t.task_id): t for t in tasks}
            need = [bool(needs_tool(by_id[(r["task_type"], r["task_id"])])) for r in got["rows"]]
            before = result.get(name, {}).get("probe_accuracy")
            result[name] = discrimination(got["rows"], need)
            result[name]["probe_accuracy"] = (
                probe([*BASE, *MIX, *args.extra], tasks, got["checkpoint"])
                if got["checkpoint"]
                else before  # a kept eval of a run whose checkpoint is gone
            )
            write(result, args)  # each finished run lands before the next one starts
    write(result, args)


def previous(args: argparse.Namespace) -> dict[str, Any]:
    """What ``router_discrimination.json`` holds already (a run of the same work directory
    only), so that ``--runs`` one run does not drop the other's result."""
    out = args.results / "router_discrimination.json"
    try:
        got = json.loads(out.read_text())
    except (OSError, ValueError):
        return {}
    same = got.get("work") == _rel(args.work) and not args.probe_only
    return {k: v for k, v in got.items() if k in RUNS} if same else {}


def _rel(path: Path) -> str:
    return os.path.relpath(path.resolve(), ROOT)


def write(result: dict[str, Any], args: argparse.Namespace) -> None:
    """The result so far, to ``router_probe.json`` or ``router_discrimination.json``."""
    out = args.results / ("router_probe.json" if args.probe_only else "router_discrimination.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
