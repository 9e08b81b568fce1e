"""Does the budgeted router, as shipped, spend its tool budget on the tasks that need a tool, and
does it beat a per-call cost in the LM's reward (OTC, arXiv 2504.14870; no head)?

Each training seed runs ``configs/router_smollm2.yaml`` unchanged (only ``trainer.seed``,
``data.seed`` and ``router.budget`` set; no other ``router.*`` key), then ``toolgrpo eval``
plays all 400 held-out tasks of its four types (the ``:test`` sets) under every route, several
episodes each at T = 1, so a task's outcome under a route is a mean, not one greedy draw. Per
seed and pooled (``router_discrimination_lib``):

- ``reward`` / ``cost``: the sampled router's expected reward and tool cost;
- ``gain_vs_blind`` (± ``gain_vs_blind_se``): paired by task, over the best task-blind route mix
  at the router's cost; ``gain_vs_type_mean``: over the same head with each task's route
  probabilities replaced by its type's mean (what per-task information adds);
- ``auroc_outcome``: P(tool route) against each task's own outcome (a tool route beats ANSWER on
  it); ``auroc_type``: against its type's (the majority of the dataset's need-a-tool flags
  in the type); ``route_share`` per type;
- ``within_budget``: the held-out cost within B ± 0.05; ``served_offset``: the budget offset the
  head was served with (router/offset.py; fit on training tasks by the run's last validation,
  or by ``toolgrpo eval --fit-offset`` for a checkpoint saved before it existed);
- ``pooled.gain_vs_blind`` / ``pooled.se``: over tasks × seeds (crossed random-effects SE).

The OTC arm trains the same config with ``router.enable=false`` and ``reward.tool_call_cost=c``
for each ``--otc-costs`` c, same seeds, and plays the held-out tasks with all tools offered.
Reward at equal cost: the mix of two penalties' policies whose held-out costs bracket the
router's (a task goes to one or the other with fixed odds), paired by task (``otc``:
``reward``, ``cost``, ``router_minus_otc``, ``router_minus_otc_se``). When no pair brackets it,
``bracketed`` is false and the table says which way to move the penalties.

    python benchmarks/router_discrimination.py                      # 3 seeds, both arms
    python benchmarks/router_discrimination.py --seeds 0 --arms router
    python benchmarks/router_discrimination.py --arms otc --otc-costs 0.1 0.2 0.5
    python benchmarks/router_probe.py      # do the warm start's features separate the types?

Resumable: training runs resume from their checkpoints, and each finished eval is kept (without
its episodes' text) in ``benchmarks/results/router_discrimination_kept/<work>/``, so a later
checkout reads it instead of training again. Writes
``benchmarks/results/router_discrimination.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cli_runs import toolgrpo  # noqa: E402
from kept import (  # noqa: E402
    find,
    keep_eval,
    keep_file,
    kept_dir,
    pin,
    setting_digest,
    step_means,
    training_steps,
)
from router_discrimination_lib import (  # noqa: E402
    blind_diffs,
    expected,
    key,
    mix_at_cost,
    otc_table,
    pooled_diff,
    seed_summary,
)

CONFIG = ROOT / "configs" / "router_smollm2.yaml"
TYPES = ("calculator", "search", "direct", "arith_mixed")
HELD_OUT = [f"{t}:test" for t in TYPES]  # 100 tasks each
BUDGET_TOL = 0.05  # a seed's held-out cost within B ± this keeps the budget
# Training metrics kept per run (the router's λ and cost; every run's reward, calls and step time).
TRAINING_KEYS = (
    "router/lambda",
    "router/cost/mean",
    "reward/mean",
    "reward/call_penalty_mean",
    "episode/tool_calls/mean",
    "timing/step_s",
)


def config(extra: list[str]) -> Any:
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    return load_config(TrainConfig, str(CONFIG), extra)


def train_overrides(seed: int, budget: float) -> list[str]:
    """What a seed's run sets beside the shipped config: its seed and the budget."""
    return [f"trainer.seed={seed}", f"data.seed={seed}", f"router.budget={budget}"]


def eval_overrides(seed: int, episodes: int) -> list[str]:
    """Every held-out task, ``episodes`` sampled episodes (T = 1) per task and route."""
    vk = "actor_rollout_ref.rollout.val_kwargs."
    return [
        f"data.val_files=[{','.join(HELD_OUT)}]",
        f"{vk}n={episodes}",
        f"{vk}do_sample=true",
        f"{vk}temperature=1.0",
        f"trainer.seed={seed}",
    ]


def trained(name: str, extra: list[str], args: argparse.Namespace) -> Path:
    """The final checkpoint of one training run (trained, or resumed, when missing)."""
    run = args.work / name
    steps = config([*extra, *args.extra]).trainer.total_training_steps
    final = run / "checkpoints" / f"global_step_{steps}"
    if not (final / "trainer_state.json").is_file():
        out = [f"trainer.output_dir={run}", "trainer.resume=auto"]
        cmd = ["train", str(CONFIG), *extra, *args.extra, *out]
        toolgrpo(*cmd, log=args.work / f"{name}.log")
    return final


def evaluate(name: str, final: Path, keep: int, out: Path, args: argparse.Namespace) -> None:
    """``toolgrpo eval`` of a run's final checkpoint on the held-out tasks, ``keep`` episodes of
    each type kept in the JSON. A router checkpoint saved before the served head's budget
    offset existed gets one fit first (``--fit-offset``: on training tasks, as validation fits
    it in today's runs)."""
    cmd = ["eval", "--checkpoint", str(final), "--samples", str(keep), "--output", str(out)]
    if (final / "router.pt").is_file() and not has_offset(final):
        cmd.append("--fit-offset")
    cmd += ["--limit", str(args.eval_limit)]
    cfg = str(args.work / name / "config.yaml")
    seed = int(name.rsplit("_s", 1)[1])
    ov = [*eval_overrides(seed, args.episodes), *args.extra]
    toolgrpo(*cmd, cfg, *ov, log=args.work / f"{name}.log")


def keep_training(name: str, work: Path, kept: Path) -> dict[str, float]:
    """A run's router metrics per step, kept; their means over the last quarter of steps."""
    metrics = work / name / "metrics.jsonl"
    if metrics.is_file():
        keep_file(metrics, kept / f"metrics_{name}.jsonl", TRAINING_KEYS)
    rows = training_steps(find(metrics, kept / f"metrics_{name}.jsonl"))
    return step_means(rows[-max(len(rows) // 4, 1) :], TRAINING_KEYS) if rows else {}


def has_offset(checkpoint: Path) -> bool:
    """Whether a checkpoint's router.pt holds the served head's budget offset."""
    from toolgrpo.models.safe_load import load_torch_file
    from toolgrpo.router.offset import OFFSET_KEY

    return OFFSET_KEY in load_torch_file(checkpoint / "router.pt")


def served_eval(path: Path | None) -> Path | None:
    """An eval of the head as served today (with its budget offset), else None (an eval from
    before the offset is played again)."""
    if path is None or json.loads(path.read_text())["routing"].get("offset") is None:
        return None
    return path


def served_offset(seed: int, args: argparse.Namespace, kept: Path) -> dict[str, Any] | None:
    """The budget offset a seed's held-out eval served its head with (router/offset.py)."""
    name = f"eval_router_s{seed}.json"
    found = served_eval(find(args.work / name, kept / name)) or served_eval(find(None, kept / name))
    return json.loads(found.read_text())["routing"]["offset"] if found else None


def router_seed(seed: int, args: argparse.Namespace, kept: Path) -> list[dict[str, Any]]:
    """One router seed's routed per-task table (training and evaluating it when not kept)."""
    name = f"router_s{seed}"
    out, keep = args.work / f"eval_{name}.json", kept / f"eval_{name}.json"
    found = served_eval(find(out, keep)) or served_eval(find(None, keep))
    if found is None:
        evaluate(name, trained(name, train_overrides(seed, args.budget), args), 0, out, args)
        found = out
    keep_eval(found, keep)
    return json.loads(found.read_text())["routing"]["per_task"]


def otc_seed(seed: int, c: float, args: argparse.Namespace, kept: Path) -> dict[str, Any]:
    """One OTC run's per-task table (LM alone, penalty ``c`` per call)."""
    name = f"otc_c{c:g}_s{seed}"
    table, keep = args.work / f"table_{name}.json", kept / f"table_{name}.json"
    found = find(table, keep)
    if found is None:
        extra = [*train_overrides(seed, args.budget), "router.enable=false"]
        final = trained(name, [*extra, f"reward.tool_call_cost={c}"], args)
        out = args.work / f"eval_{name}.json"
        if not out.is_file():  # every episode kept: its messages price it
            evaluate(name, final, 10**6, out, args)
        record = json.loads(out.read_text())
        table.write_text(json.dumps(otc_table(record["samples"], episode_cost(args.extra))))
        keep_eval(out, kept / out.name)
        found = table
    keep_file(found, keep)
    return json.loads(found.read_text())


def episode_cost(extra: list[str]) -> Any:
    """An eval sample's tool cost under the config's router cost model (what the router's
    episodes are priced by), read from its messages."""
    from toolgrpo.router.families import FamilyMap
    from toolgrpo.router.usage import CostModel, usage_of_messages

    model = CostModel.from_config(config(extra).router.cost)
    families = FamilyMap()
    return lambda s: model.cost(
        usage_of_messages(s["messages"], families, s["task_type"] == "rlla")
    )


def needs_tool_flags(rows: list[dict[str, Any]]) -> list[bool] | None:
    """The dataset's own need-a-tool flag per row (arith_mixed's per question, else by type)."""
    from toolgrpo.data.loader import load_tasks
    from toolgrpo.envs.arith_mixed import needs_tool

    loaded = load_tasks(HELD_OUT, "error").tasks
    tasks = {key({"task_type": t.task_type, "task_id": t.task_id}): t for t in loaded}
    flags = [needs_tool(tasks[key(r)]) if key(r) in tasks else None for r in rows]
    return None if any(f is None for f in flags) else [bool(f) for f in flags]


def otc_entry(
    routers: dict[int, list[dict[str, Any]]], otcs: dict[int, dict[float, dict[str, Any]]]
) -> dict[str, Any]:
    """Router minus OTC at the router's own cost, per seed and pooled (paired by task)."""
    per_seed, diffs = {}, []
    for seed, rows in routers.items():
        if not otcs.get(seed):
            continue
        mine = {key(r): expected(r, "reward") for r in rows}
        cost = fmean(expected(r, "cost") for r in rows)
        mix = mix_at_cost(otcs[seed], cost, list(mine))
        d = {k: mine[k] - v for k, v in mix.pop("per_task").items()}
        pooled = pooled_diff([d])
        per_seed[str(seed)] = {**mix, "router_minus_otc": pooled["gain"], "se": pooled["se"]}
        diffs.append(d)
    if not diffs:
        return {}
    both = pooled_diff(diffs)
    seeds = per_seed.values()
    return {
        "reward": fmean(s["reward"] for s in seeds),
        "cost": fmean(s["cost"] for s in seeds),
        "router_minus_otc": both["gain"],
        "router_minus_otc_se": both["se"],
        "z": both["z"],
        "bracketed": all(s["bracketed"] for s in seeds),
        "seeds": per_seed,
    }


def summarize(
    routers: dict[int, list[dict[str, Any]]],
    otcs: dict[int, dict[float, dict[str, Any]]],
    training: dict[str, dict[str, float]],
    offsets: dict[int, dict[str, Any] | None] | None = None,
    budget: float = 0.3,
) -> dict[str, Any]:
    from toolgrpo.router.offset import unshift_rows

    seeds = {}
    for seed, rows in sorted(routers.items()):
        seeds[str(seed)] = {**seed_summary(rows, needs_tool_flags(rows))}
        seeds[str(seed)]["within_budget"] = abs(seeds[str(seed)]["cost"] - budget) <= BUDGET_TOL
        served = (offsets or {}).get(seed)
        seeds[str(seed)]["served_offset"] = served
        if served:  # the same head and episodes without the offset
            bare = unshift_rows(rows, float(served["delta"]))
            seeds[str(seed)]["without_offset"] = {
                "reward": fmean(expected(r, "reward") for r in bare),
                "cost": fmean(expected(r, "cost") for r in bare),
            }
        seeds[str(seed)]["training_last_quarter"] = training.get(f"router_s{seed}", {})
    out: dict[str, Any] = {"seeds": seeds}
    if routers:
        pooled = pooled_diff([blind_diffs(rows) for rows in routers.values()])
        each = list(seeds.values())
        out["pooled"] = {
            "seeds": len(each),
            "tasks": pooled["tasks"],
            "gain_vs_blind": pooled["gain"],
            "se": pooled["se"],
            "z": pooled["z"],
            **{
                k: _mean([s[k] for s in each])
                for k in ("reward", "cost", "gain_vs_type_mean", "auroc_outcome", "auroc_type")
            },
            "cost_range": [min(s["cost"] for s in each), max(s["cost"] for s in each)],
            "all_within_budget": all(s["within_budget"] for s in each),
        }
    out["otc"] = otc_entry(routers, otcs)
    out["otc_training_last_quarter"] = {k: v for k, v in training.items() if k.startswith("otc")}
    return out


def _mean(xs: list[float | None]) -> float | None:
    """The mean of the values that are defined (an AUROC is None with one class only)."""
    got = [x for x in xs if x is not None]
    return fmean(got) if got else None


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def table(result: dict[str, Any], budget: float) -> None:
    print(f"| seed | reward | cost (B={budget}) | vs blind | vs type mean | AUROC outcome | type |")
    print("|---|---|---|---|---|---|---|")
    for seed, s in result["seeds"].items():
        print(
            f"| {seed} | {s['reward']:.3f} | {s['cost']:.3f} | {s['gain_vs_blind']:+.3f} ± "
            f"{s['gain_vs_blind_se']:.3f} | {s['gain_vs_type_mean']:+.3f} ± "
            f"{s['gain_vs_type_mean_se']:.3f} | {_f(s['auroc_outcome'])} | {_f(s['auroc_type'])} |"
        )
    if "pooled" in result:
        p = result["pooled"]
        print(
            f"pooled: {p['gain_vs_blind']:+.4f} ± {p['se']:.4f} over the blind mix (z {p['z']:.1f})"
        )
    otc = result.get("otc")
    if otc:
        print(
            f"OTC at the router's cost: reward {otc['reward']:.3f} (cost {otc['cost']:.3f}); "
            f"router − OTC {otc['router_minus_otc']:+.4f} ± {otc['router_minus_otc_se']:.4f}"
        )
        if not otc["bracketed"]:
            print("OTC: no two penalties bracket the router's cost; add one (--otc-costs)")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--episodes", type=int, default=4, help="T = 1 episodes per (task, route)")
    ap.add_argument("--arms", nargs="+", choices=("router", "otc"), default=["router", "otc"])
    ap.add_argument("--otc-costs", type=float, nargs="+", default=[0.2, 0.5])
    ap.add_argument("--work", type=Path, default=ROOT / "outputs" / "router_discrimination")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--eval-limit", type=int, default=-1, help="smoke tests: held-out tasks")
    args, args.extra = ap.parse_known_args(argv)
    if args.extra:  # key=value for every run and eval: a smoke test, not the shipped config
        print(f"NOTE: overrides beside the shipped config: {' '.join(args.extra)}", flush=True)
    out = args.results / "router_discrimination.json"
    kept = kept_dir(out) / args.work.name
    args.work.mkdir(parents=True, exist_ok=True)
    kept.mkdir(parents=True, exist_ok=True)
    digest = setting_digest(CONFIG, [])[:16]  # the YAML tree: comments do not count
    setting = {"config": str(CONFIG.relative_to(ROOT)), "setting_sha256": digest}
    setting |= {"budget": args.budget, "episodes": args.episodes, "overrides": args.extra}
    setting |= {"eval_limit": args.eval_limit} if args.eval_limit >= 0 else {}
    pin([args.work, kept], {"setting.json": json.dumps(setting, indent=1)})
    routers: dict[int, list[dict[str, Any]]] = {}
    otcs: dict[int, dict[float, dict[str, Any]]] = {}
    training: dict[str, dict[str, float]] = {}
    offsets: dict[int, dict[str, Any] | None] = {}
    result: dict[str, Any] = {}
    for seed in args.seeds:  # each seed's arms, then the result so far
        name = f"router_s{seed}"
        if "router" in args.arms or find(
            args.work / f"eval_{name}.json", kept / f"eval_{name}.json"
        ):
            routers[seed] = router_seed(seed, args, kept)
            offsets[seed] = served_offset(seed, args, kept)
        for c in args.otc_costs:
            name = f"otc_c{c:g}_s{seed}"
            if "otc" in args.arms or find(
                args.work / f"table_{name}.json", kept / f"table_{name}.json"
            ):
                otcs.setdefault(seed, {})[c] = otc_seed(seed, c, args, kept)
        for n in [f"router_s{seed}", *(f"otc_c{c:g}_s{seed}" for c in args.otc_costs)]:
            training[n] = keep_training(n, args.work, kept)
        summary = summarize(routers, otcs, training, offsets, args.budget)
        result = {**setting, "held_out": HELD_OUT, **summary}
        out.write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")
    if result:
        table(result, args.budget)


if __name__ == "__main__":
    main(sys.argv[1:])
