"""benchmarks/mixture_teacher.py's summary: the JSON result and its table, from whatever evals and
step metrics the work directory or the kept copies hold. Pure reading; nothing runs.

Two measures per checkpoint, both on the 300 held-out tasks: greedy accuracy (``eval_<name>``)
and pass@4 at temperature 1 (``eval_pass4_<name>``: 4 episodes a task, a task passes when one of
them succeeds; pass@k moves before greedy accuracy does). Each arm's mean is over tasks of the
task's value averaged over seeds; its SE adds the SE over tasks and the SE between seeds'
means; gains are paired by task with ``actor_only`` of the same seed, and every other arm is paired
the same way with ``sft_teacher`` (``gain_vs_sft_teacher``: the arm to beat).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from statistics import fmean, median, stdev
from typing import Any

from behaviour import arm_behaviour, eval_behaviour
from cli_runs import machine
from kept import finder
from mixture_teacher_arms import ACTOR, ARMS, CONFIG, RECIPE, REFERENCES, ROOT, TEACHER

from toolgrpo.eval.episodes import success_threshold
from toolgrpo.eval.paired import load_episodes, load_outcomes

PASS_K = 4
# The metrics.jsonl keys a run keeps (kept.keep_file): what every arm needs to explain itself.
METRIC_KEYS = (
    "reward/groups_all_equal_frac",
    "batch/size",
    "rollout/using_actor",
    "rollout/using_fixed",
    "rollout/reward_actor",
    "rollout/reward_fixed",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/grad_norm",
    "mixture/fixed_grad_share",  # the fixed rows' share of Σ|∂L_pg/∂log π| (mixture/objective)
    "mixture/shaping_grad_weight_mean",
    "mixture/mixed_group_frac",
    "mixture/rescued_group_frac",
    "mixture/is_weight_raw_mean",  # untruncated IS weights at the configured level
    "mixture/is_ess",
    "actor/importance_weight_mean",  # the weights in effect (IS objective)
    "actor/importance_weight_ess",
    "rollout/fixed_seq_ess",
    "mixture/guided_row_frac",
    "mixture/guided_loss",
)
# Summarised per arm (mean and median over training steps) beside the accuracies.
EXPLAIN_KEYS = METRIC_KEYS[6:]


def eval_name(name: str, measure: str = "greedy") -> str:
    """The eval of a reference or of ``<arm>_seed<s>``: greedy, or ``pass4`` (T = 1, n = 4)."""
    return f"eval_{name}.json" if measure == "greedy" else f"eval_{measure}_{name}.json"


def pass_at_k(path: Path, k: int = PASS_K) -> dict[str, float]:
    """task id → unbiased pass@k, 1 − C(n − c, k)/C(n, k), over a task's n ≥ k episodes (c of
    them successes), from a ``toolgrpo eval`` JSON that kept every episode."""
    tries: dict[str, list[bool]] = defaultdict(list)
    for s in load_episodes(path):  # refuses an eval that did not keep every episode
        r = s["reward"]
        ok = r is not None and math.isfinite(r) and r >= success_threshold(s["task_type"])
        tries[s["task_id"]].append(ok)
    short = sorted(t for t, v in tries.items() if len(v) < k)
    if short:
        raise ValueError(f"{path}: task {short[0]} has fewer than {k} episodes (pass@{k})")
    return {t: 1.0 - math.comb(len(v) - sum(v), k) / math.comb(len(v), k) for t, v in tries.items()}


def step_stats(path: Path | None) -> dict[str, Any]:
    """Over a run's training steps (its ``metrics.jsonl``; None: none): the share of groups with
    non-zero advantage, the actor's and fixed policies' samples (summed), and each
    ``EXPLAIN_KEYS`` metric's mean and median over the steps that logged it."""
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path else []
    recs = [r for r in recs if "reward/groups_all_equal_frac" in r]
    if not recs:
        return {"nonzero_adv_group_frac": None, "actor_samples": None, "fixed_samples": None}
    actor = sum(r["batch/size"] * r.get("rollout/using_actor", 1.0) for r in recs)
    fixed = sum(r["batch/size"] * r.get("rollout/using_fixed", 0.0) for r in recs)
    explain = {}
    for key in EXPLAIN_KEYS:
        vals = [float(r[key]) for r in recs if r.get(key) is not None]
        if vals:
            explain[key] = {"mean": fmean(vals), "median": median(vals)}
    return {
        "nonzero_adv_group_frac": fmean(1 - r["reward/groups_all_equal_frac"] for r in recs),
        "actor_samples": round(actor),
        "fixed_samples": round(fixed),
        "step_metrics": explain,
    }


def _pooled(per_task: dict[str, list[float]], per_seed: list[float], n: int) -> tuple[float, float]:
    """Mean over tasks of each task's value averaged over seeds, and its SE: the SE over tasks
    plus the SE between the seeds' means (conservative, as in main_job_seeds)."""
    means = [fmean(v) for v in per_task.values() if len(v) == n]
    m = fmean(means)
    se_tasks = stdev(means) / math.sqrt(len(means)) if len(means) > 1 else 0.0
    se_seeds = stdev(per_seed) / math.sqrt(len(per_seed)) if len(per_seed) > 1 else 0.0
    return 100 * m, 100 * math.hypot(se_tasks, se_seeds)


def measure(
    values: dict[int, dict[str, float]], base: dict[int, dict[str, float]]
) -> dict[str, Any] | None:
    """One measure of an arm (``values``: seed → task → value in [0, 1]): its mean and SE in
    points, and its gain over ``base`` (``actor_only``'s, seed → task → value) paired by task
    over the seeds both have (None without any)."""
    if not values:
        return None
    seeds = sorted(values)
    per_task: dict[str, list[float]] = defaultdict(list)
    for s in seeds:
        for t, v in values[s].items():
            per_task[t].append(v)
    mean, se = _pooled(per_task, [fmean(values[s].values()) for s in seeds], len(seeds))
    paired = [s for s in seeds if s in base]
    gain = gain_se = None
    if paired:
        gains: dict[str, list[float]] = defaultdict(list)
        per_seed = []
        for s in paired:
            common = sorted(values[s].keys() & base[s].keys())
            per_seed.append(fmean(values[s][t] - base[s][t] for t in common))
            for t in common:
                gains[t].append(values[s][t] - base[s][t])
        gain, gain_se = _pooled(gains, per_seed, len(paired))
    return {
        "seeds": seeds,
        "mean": mean,
        "se": se,
        "gain": gain,
        "gain_se": gain_se,
        "paired": paired,
    }


def _seed_means(stats: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each step metric's mean and median over steps, averaged over the seeds that logged it."""
    out = {}
    for key in EXPLAIN_KEYS:
        per = [x["step_metrics"][key] for x in stats if key in x.get("step_metrics", {})]
        if per:
            out[key] = {stat: fmean(p[stat] for p in per) for stat in ("mean", "median")}
    return out


def _outcomes(path: Path | None, greedy: bool) -> dict[str, float] | None:
    if path is None:
        return None
    if greedy:
        return {t: o.success for t, o in load_outcomes(path).items()}
    return pass_at_k(path)


def summarize(work: Path, seeds: list[int], kept: Path | None = None) -> dict[str, Any]:
    """The JSON result from whatever evals and runs ``work`` holds, or ``kept`` keeps (missing
    seeds and measures left out)."""
    at = finder(work, kept)
    got: dict[tuple[str, str], dict[int, dict[str, float]]] = defaultdict(dict)
    for arm in ARMS:
        for s in seeds:
            for m in ("greedy", "pass4"):
                vals = _outcomes(at(eval_name(f"{arm}_seed{s}", m)), m == "greedy")
                if vals is not None:
                    got[(arm, m)][s] = vals
    arms = []
    for arm in ARMS:
        acc = measure(got[(arm, "greedy")], got[("actor_only", "greedy")])
        if acc is None:
            continue
        p4 = measure(got[(arm, "pass4")], got[("actor_only", "pass4")]) or {}
        done = acc["seeds"]
        row: dict[str, Any] = {"arm": arm, "seeds": done, "accuracy": acc["mean"], "se": acc["se"]}
        row |= {"gain_vs_actor_only": acc["gain"], "gain_se": acc["gain_se"]}
        row |= {"paired_seeds": acc["paired"], "pass_at_4": p4.get("mean")}
        row |= {"pass_at_4_se": p4.get("se"), "pass_at_4_seeds": p4.get("seeds", [])}
        row |= {
            "pass_at_4_gain_vs_actor_only": p4.get("gain"),
            "pass_at_4_gain_se": p4.get("gain_se"),
        }
        if arm != "sft_teacher":  # the arm to beat, paired by task on the seeds both have
            vs = measure(got[(arm, "greedy")], got[("sft_teacher", "greedy")]) or {}
            vs4 = measure(got[(arm, "pass4")], got[("sft_teacher", "pass4")]) or {}
            row |= {
                "gain_vs_sft_teacher": vs.get("gain"),
                "gain_vs_sft_teacher_se": vs.get("gain_se"),
                "vs_sft_teacher_seeds": vs.get("paired", []),
            }
            row |= {
                "pass_at_4_gain_vs_sft_teacher": vs4.get("gain"),
                "pass_at_4_gain_vs_sft_teacher_se": vs4.get("gain_se"),
            }
        row["behaviour"] = arm_behaviour([at(eval_name(f"{arm}_seed{s}")) for s in done])
        if arm == "sft_teacher":
            results = [at(f"{arm}_seed{s}/sft_result.json") for s in done]
            ex = [json.loads(p.read_text()).get("examples") for p in results if p]
            row |= {"nonzero_adv_group_frac": None, "sft_unique_examples": ex}
            row["fixed_grad_share"] = 1.0  # by construction: every token trained is a teacher's
        else:
            stats = [step_stats(at(f"{arm}_seed{s}/metrics.jsonl")) for s in done]
            for k in ("nonzero_adv_group_frac", "actor_samples", "fixed_samples"):
                vals = [x[k] for x in stats if x[k] is not None]
                row[k] = fmean(vals) if vals else None
            row["step_metrics"] = _seed_means(stats)
            share = row["step_metrics"].get("mixture/fixed_grad_share")
            # by construction 0 for the actor alone (no fixed row); None for runs kept before
            # the metric was logged
            row["fixed_grad_share"] = 0.0 if arm == "actor_only" else share and share["mean"]
        arms.append(row)
    refs = {}
    for name, model in REFERENCES.items():
        path = at(eval_name(name))
        if path:
            vals = [o.success for o in load_outcomes(path).values()]
            se = stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
            refs[name] = {"model": model, "accuracy": 100 * fmean(vals), "se": 100 * se}
            tasks = _outcomes(at(eval_name(name, "pass4")), greedy=False)
            p4 = measure({0: tasks}, {}) if tasks else None
            refs[name]["pass_at_4"] = p4["mean"] if p4 else None
            refs[name]["pass_at_4_se"] = p4["se"] if p4 else None
            refs[name]["behaviour"] = eval_behaviour(path)
    return {
        "config": str(CONFIG.relative_to(ROOT)),
        "recipe": str(RECIPE.relative_to(ROOT)),
        "actor": ACTOR,
        "fixed_policy": TEACHER,
        "arms": arms,
        "references": refs,
        "machine": machine(),
    }


def _fmt(v: float | None, se: float | None = None, signed: bool = True) -> str:
    if v is None:
        return "-"
    if se is None:
        return f"{v:.2f}"
    return f"{v:+.1f} ± {se:.1f}" if signed else f"{v:.1f} ± {se:.1f}"


def write(result: dict[str, Any], out: Path) -> None:
    """The result JSON, and its table on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    head = ("arm", "seeds", "accuracy %", "gain", "pass@4 %", "pass@4 gain", "vs sft", "fixed")
    print(f"{head[0]:18} {head[1]:6} " + " ".join(f"{h:>14}" for h in head[2:]))
    for r in result["arms"]:
        cells = (
            _fmt(r["accuracy"], r["se"], signed=False),
            _fmt(r["gain_vs_actor_only"], r["gain_se"]),
            _fmt(r.get("pass_at_4"), r.get("pass_at_4_se"), signed=False),
            _fmt(r.get("pass_at_4_gain_vs_actor_only"), r.get("pass_at_4_gain_se")),
            _fmt(r.get("gain_vs_sft_teacher"), r.get("gain_vs_sft_teacher_se")),
            _fmt(r.get("fixed_grad_share")),
        )
        seeds = ",".join(map(str, r["seeds"]))
        print(f"{r['arm']:18} {seeds:6} " + " ".join(f"{c:>14}" for c in cells))
    for name, ref in result["references"].items():
        p4 = _fmt(ref.get("pass_at_4"), ref.get("pass_at_4_se"), signed=False)
        print(f"{name} ({ref['model']}): {ref['accuracy']:.1f} ± {ref['se']:.1f} %, pass@4 {p4}")
    print(f"wrote {out}")
