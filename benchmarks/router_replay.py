"""Can the router head learn where tools pay from an LM's real prompt features?

A replay of the router's learning loop on frozen SmolLM2 features, with outcomes measured, not
modelled: a routed eval (a run of ``--work``: its ``eval_<run>.json`` and ``val.jsonl``, as the
discrimination benchmark wrote them for its 136-task runs) played every held-out task under every
route, so each (task, route) has a measured reward and tool cost. The head reads the
checkpoint's own features of those tasks (its ``router.inputs`` and layer) and trains as in a run
(``price`` advantages, n = 4 routes per task, 12 tasks a step, the PI dual step and entropy bonus
of ``benchmarks/router_budget.py``; held-out routing by the averaged head, ``router.head_ema``),
drawing each rollout's reward and cost from the table. Two folds of the tasks (alternating
within each type): a head trained on one is scored on the other, so every task is scored out of
fold. Each ``router.feature_norm`` is run at every seed and
compared with the best task-blind route mix at its own cost, paired by task.

What it isolates: whether the head, given these features and these outcomes, can tell the task
types apart. The LM does not change here, so it says nothing about what the LM's own training
adds or takes away.

    python benchmarks/router_replay.py            # minutes: one feature pass, then the head only
    python benchmarks/router_replay.py --budget 1 \
        --out benchmarks/results/router_replay_unconstrained

Writes ``benchmarks/results/router_replay.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from router_discrimination_lib import expected, fixed_mix, p_tool, route_shares  # noqa: E402

from toolgrpo.config.router import RouterConfig  # noqa: E402

WORK = ROOT / "outputs" / "router_discrimination"
NORMS = ("standardize", "layer")


def auroc_need(rows: list[dict[str, Any]], need: list[bool]) -> float | None:
    from toolgrpo.router.metrics import auroc

    return auroc([p_tool(r) for r in rows], need)


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


def held_out(path: Path, per_type: int) -> list[Any]:
    """The replayed run's held-out tasks: the first ``per_type`` test tasks of each of its types,
    written to ``path`` (its val file) and loaded from it."""
    from router_budget import write_val

    from toolgrpo.data.loader import load_tasks

    types = ("calculator", "search", "direct", "arith_mixed")
    return load_tasks([str(write_val(path, per_type, types))], "error").tasks


def features(checkpoint: Path, tasks: list[Any]) -> torch.Tensor:
    """The checkpoint head's own features of ``tasks`` (its inputs, layer and pooling)."""
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.eval.cli import apply_checkpoint
    from toolgrpo.models.loading import load_policy
    from toolgrpo.rewards.types import RllaFlags
    from toolgrpo.router.infer import load_router
    from toolgrpo.trainer.episodes import make_router

    cfg = load_config(TrainConfig, checkpoint.parent.parent / "config.yaml", [])
    apply_checkpoint(cfg, str(checkpoint))
    envs = make_router(cfg, RllaFlags(**vars(cfg.reward.rlla)))
    lm = load_policy(cfg.actor_rollout_ref.model, trainable=False)
    head, _ = load_router(cfg, lm, str(checkpoint))
    head.read_tasks_with(envs, cfg.data.max_prompt_length)
    return head.features_of(tasks)


def train_head(
    feats: torch.Tensor,
    rows: list[dict[str, Any]],
    norm: str,
    seed: int,
    args: argparse.Namespace,
) -> Any:
    """The router's loop on a fold: sample tasks, routes, table outcomes; update head and λ."""
    from types import SimpleNamespace

    from toolgrpo.algos.router import lagrangian_advantages
    from toolgrpo.router.budget import Budget
    from toolgrpo.router.policy import RouterPolicy

    routes = list(rows[0]["probs"])
    reward = torch.tensor([[r["reward"][k] for k in routes] for r in rows], dtype=torch.float32)
    cost = torch.tensor([[r["cost"][k] for k in routes] for r in rows], dtype=torch.float32)
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=feats.shape[1])))
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    router = RouterPolicy(lm, routes, lr=args.lr, feature_norm=norm, head_ema=args.head_ema)
    dual = Budget(args.budget, 0.0, args.dual_lr, 1, dual_kp=args.dual_kp)
    for _ in range(args.steps):
        pick = torch.randint(0, len(rows), (args.tasks,), generator=g)
        router.observe(feats[pick])
        f = feats[pick].repeat_interleave(args.n, 0)
        action = router.act(f).router_action
        rows_b = pick.repeat_interleave(args.n)
        r, c = reward[rows_b, action], cost[rows_b, action]
        uids = [str(i // args.n) for i in range(len(rows_b))]
        adv = lagrangian_advantages(r, c, dual.lam, uids, "price")
        router.update(f, action, adv, args.entropy_coeff)
        dual.observe(c.tolist())
        dual.step()
    return router


def run(feats: torch.Tensor, rows: list[dict[str, Any]], norm: str, seed: int, args: Any) -> list:
    """Out-of-fold route probabilities for every row (two folds, alternating within a type)."""
    order: dict[str, int] = {}
    fold = []
    for r in rows:
        fold.append(order.get(r["task_type"], 0) % 2)
        order[r["task_type"]] = order.get(r["task_type"], 0) + 1
    scored = [dict(r) for r in rows]
    for k in (0, 1):
        train = [i for i, f in enumerate(fold) if f == k]
        test = [i for i, f in enumerate(fold) if f != k]
        head = train_head(feats[train], [rows[i] for i in train], norm, seed, args)
        with torch.no_grad(), head.averaged():  # as validation and infer route
            probs = torch.softmax(head.head(feats[test]), -1)
        for i, p in zip(test, probs, strict=True):
            scored[i]["probs"] = {k2: float(v) for k2, v in zip(head.routes, p, strict=True)}
    return scored


def summarize(per_seed: list[list[dict[str, Any]]], need: list[bool]) -> dict[str, Any]:
    """Mean over seeds of the out-of-fold router against the best task-blind mix at its cost;
    the SE adds the SE over tasks (of seed-averaged differences) and the SE between seeds."""
    diffs, seeds = [], []
    for scored in per_seed:
        cost = fmean(expected(r, "cost") for r in scored)
        mix = fixed_mix(scored, cost)
        d = [expected(r, "reward") - m for r, m in zip(scored, mix["per_task"], strict=True)]
        diffs.append(d)
        seeds.append(
            {
                "reward": fmean(expected(r, "reward") for r in scored),
                "cost": cost,
                "fixed_mix_reward": mix["reward"],
                "gain": fmean(d),
                "auroc": auroc_need(scored, need),
                "route_share": route_shares(scored),
            }
        )
    per_task = [fmean(col) for col in zip(*diffs, strict=True)]
    se_tasks = stdev(per_task) / math.sqrt(len(per_task))
    gains = [s["gain"] for s in seeds]
    se_seeds = stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else 0.0
    types = per_seed[0] and sorted(seeds[0]["route_share"])
    return {
        "reward": fmean(s["reward"] for s in seeds),
        "cost": fmean(s["cost"] for s in seeds),
        "gain_vs_fixed_mix": fmean(gains),
        "gain_se": math.hypot(se_tasks, se_seeds),
        "auroc": fmean(s["auroc"] for s in seeds if s["auroc"] is not None),
        "route_share": {
            t: {k: fmean(s["route_share"][t][k] for s in seeds) for k in seeds[0]["route_share"][t]}
            for t in types
        },
        "per_seed": [{k: v for k, v in s.items() if k != "route_share"} for s in seeds],
    }


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--run", default="B=0.3", help="the run under --work whose eval is replayed")
    ap.add_argument("--run-steps", type=int, default=60, help="its final checkpoint's step")
    ap.add_argument("--per-type", type=int, default=34)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--steps", type=int, default=60, help="head updates per fold (a run's)")
    ap.add_argument("--tasks", type=int, default=12, help="tasks a step")
    ap.add_argument("--n", type=int, default=4, help="routes sampled per task")
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--dual-lr", type=float, default=0.2)
    ap.add_argument("--dual-kp", type=float, default=2.0)
    ap.add_argument("--entropy-coeff", type=float, default=0.1)
    ap.add_argument("--head-ema", type=float, default=RouterConfig().head_ema)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "router_replay")
    args = ap.parse_args(argv)
    from toolgrpo.envs.arith_mixed import needs_tool

    rows = find_per_task(json.loads((args.work / f"eval_{args.run}.json").read_text()))
    tasks = held_out(args.work / "val.jsonl", args.per_type)
    by_id = {(t.task_type, t.task_id): t for t in tasks}
    mine = [by_id[(r["task_type"], r["task_id"])] for r in rows]
    need = [bool(needs_tool(t)) for t in mine]
    cache = args.work / f"replay_features_{args.run}.pt"
    if cache.is_file():
        feats = torch.load(cache)
    else:
        ckpt = args.work / args.run / "checkpoints" / f"global_step_{args.run_steps}"
        feats = features(ckpt, mine)
        torch.save(feats, cache)
    result: dict[str, Any] = {
        "run": args.run,
        "tasks": len(rows),
        "settings": {k: v for k, v in vars(args).items() if k not in ("work", "out")},
        "machine": {"cpu_threads": torch.get_num_threads(), "torch": torch.__version__},
    }
    for norm in NORMS:
        per_seed = [run(feats, rows, norm, s, args) for s in args.seeds]
        result[norm] = summarize(per_seed, need)
        r = result[norm]
        shares = "  ".join(
            f"{t} " + "/".join(f"{v:.2f}" for v in r["route_share"][t].values())
            for t in r["route_share"]
        )
        print(
            f"{norm:12s} reward {r['reward']:.3f} cost {r['cost']:.3f} gain vs task-blind mix "
            f"{r['gain_vs_fixed_mix']:+.3f} ± {r['gain_se']:.3f}  AUROC {r['auroc']:.2f}\n"
            f"{'':12s} route shares (A/S/C): {shares}",
            flush=True,
        )
    out = args.out if args.out.name.endswith(".json") else args.out.parent / f"{args.out.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
