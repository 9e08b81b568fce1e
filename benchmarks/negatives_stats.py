"""The negatives benchmark's per-task numbers and how they pair and pool over seeds: accuracy,
episodes with a tool error, and the tool error rate (a ratio, linearised per task)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from statistics import fmean, stdev
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from toolgrpo.eval.paired import load_outcomes, paired_values  # noqa: E402

Values = dict[str, float]  # task id -> one number


class Outcome(NamedTuple):
    task_type: str
    success: float
    errors: int
    calls: int


def read_eval(path: Path) -> dict[str, Outcome]:
    """task id -> outcome, from a ``toolgrpo eval`` JSON that kept every episode."""
    outcomes = load_outcomes(path)  # full marks by task type; refuses an incomplete eval
    samples = json.loads(path.read_text())["samples"]
    calls = {x["task_id"]: int(x.get("tool_calls") or 0) for x in samples}
    return {
        t: Outcome(o.task_type, o.success, o.tool_errors, calls[t]) for t, o in outcomes.items()
    }


def measure(outcomes: Mapping[str, Outcome], name: str, task_type: str | None = None) -> Values:
    """One number per task (of ``task_type``, or all). The tool error rate (errors / calls over
    the episodes) is a ratio: each task gets its linearised value r + (e_i - r c_i) / mean(c),
    whose mean is r and whose SE is the ratio's (delta method), so it pairs and pools like a
    per-task mean. ``tool_errors`` is the plain count of failed calls per task."""
    ids = sorted(t for t, o in outcomes.items() if task_type in (None, o.task_type))
    if name == "accuracy":
        return {t: outcomes[t].success for t in ids}
    if name == "tool_errors":
        return {t: float(outcomes[t].errors) for t in ids}
    if name == "episodes_with_tool_error":
        return {t: float(outcomes[t].errors > 0) for t in ids}
    mean_calls = fmean(outcomes[t].calls for t in ids) if ids else 0.0
    if not mean_calls:
        return {t: 0.0 for t in ids}
    r = sum(outcomes[t].errors for t in ids) / sum(outcomes[t].calls for t in ids)
    return {t: r + (outcomes[t].errors - r * outcomes[t].calls) / mean_calls for t in ids}


def pooled(by_seed: Mapping[int, Values]) -> dict[str, Any]:
    """One measure over seeds: the mean over tasks of each task's mean over seeds; its SE adds
    the SE over tasks and the SE between the seeds' means (conservative: the seed-by-task
    noise is counted twice), as benchmarks/main_job_seeds.py does."""
    common = sorted(set.intersection(*(set(v) for v in by_seed.values())))
    per_task = [fmean(by_seed[s][t] for s in by_seed) for t in common]
    se_tasks = stdev(per_task) / math.sqrt(len(per_task)) if len(per_task) > 1 else 0.0
    seed_means = [fmean(v[t] for t in common) for v in by_seed.values()]
    se_seeds = stdev(seed_means) / math.sqrt(len(seed_means)) if len(seed_means) > 1 else 0.0
    return {
        "value": fmean(per_task),
        "se": math.hypot(se_tasks, se_seeds),
        "se_over_tasks": se_tasks,
        "se_between_seeds": se_seeds if len(seed_means) > 1 else None,
        "tasks": len(per_task),
    }


def paired_pooled(
    base: Mapping[int, Values],
    arm: Mapping[int, Values],
    moved: tuple[Mapping[int, Values], Mapping[int, Values]] | None = None,
) -> dict[str, Any]:
    """arm - base, paired by task within each seed, then pooled over the seeds both ran. Each
    seed's ``up``/``down`` count the tasks whose value rose/fell; for a linearised ratio every
    task's value moves with the ratio, so ``moved`` gives (base, arm) per-task numbers to count
    on instead (the tool error rate counts tasks with more/fewer failed calls)."""
    seeds = sorted(base.keys() & arm.keys())
    per_seed = [dict(paired_values(base[s], arm[s]), seed=s) for s in seeds]
    if moved is not None:
        for row, s in zip(per_seed, seeds, strict=True):
            counted = paired_values(moved[0][s], moved[1][s])
            row["up"], row["down"] = counted["up"], counted["down"]
    diffs = {s: {t: arm[s][t] - base[s][t] for t in base[s].keys() & arm[s].keys()} for s in seeds}
    p = pooled(diffs)
    return {
        "diff": p["value"],
        "se": p["se"],
        "se_over_tasks": p["se_over_tasks"],
        "se_between_seeds": p["se_between_seeds"],
        "z": p["value"] / p["se"] if p["se"] > 0 else float("nan"),
        "tasks": p["tasks"],
        "per_seed": per_seed,
    }
