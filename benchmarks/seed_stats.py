"""The statistics of a gain over seeds and tasks, shared by the benchmarks that pool paired
evals over several training seeds: a seed's result row and the pooled row."""

from __future__ import annotations

import math
from statistics import fmean, stdev


def two_way_se(cells: list[list[float]]) -> float:
    """SE of the grand mean of a tasks x seeds table (one outcome a cell, both factors random):
    var = (sigma_task^2 * S + sigma_seed^2 * T + sigma_err^2) / (S T), each variance from the
    ANOVA mean squares, a negative component estimate set to 0."""
    t, s = len(cells), len(cells[0])
    grand = fmean(x for row in cells for x in row)
    task_m = [fmean(row) for row in cells]
    seed_m = [fmean(row[j] for row in cells) for j in range(s)]
    ms_task = s * sum((a - grand) ** 2 for a in task_m) / (t - 1)
    ms_seed = t * sum((b - grand) ** 2 for b in seed_m) / (s - 1)
    resid = sum(
        (cells[i][j] - task_m[i] - seed_m[j] + grand) ** 2 for i in range(t) for j in range(s)
    )
    ms_err = resid / ((t - 1) * (s - 1))
    var = max(ms_task - ms_err, 0.0) + max(ms_seed - ms_err, 0.0) + ms_err
    return math.sqrt(var / (s * t))


def gain_fields(p: dict) -> dict:
    """A paired held-out comparison (``paired(...)``) as a result row's fields, in points."""
    a = p["all"]
    return {
        "gain": 100 * a["diff"],
        "se": 100 * a["diff_se_paired"],
        "z": a["z"],
        "before": 100 * a["before"],
        "after": 100 * a["after"],
        "up": a["up"],
        "down": a["down"],
        "by_type": {k: 100 * v["diff"] for k, v in p.items() if k != "all"},
    }


def pooled_gain(rows: list[dict], per_task: dict[str, list[float]]) -> dict:
    """The mean held-out gain over seeds and tasks (points) from the seeds' rows
    (:func:`gain_fields`) and each task's after - before outcome per seed (tasks every seed
    scored). Two sources of error: which tasks and which seeds (a shift shared by all tasks).
    ``se`` is the crossed two-way random-effects SE (tasks x seeds, one outcome a cell);
    ``se_conservative`` adds the SE over tasks of the seed-averaged gains and the SE of the
    seeds' gains, which counts the seed-by-task noise twice."""
    full = [v for v in per_task.values() if len(v) == len(rows)]
    means = [fmean(v) for v in full]
    m = 100 * fmean(means)
    se_tasks = 100 * stdev(means) / math.sqrt(len(means)) if len(means) > 1 else float("nan")
    gains = [r["gain"] for r in rows]
    se_seeds = stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else 0.0
    se_sum = math.sqrt(se_tasks**2 + se_seeds**2)
    se = 100 * two_way_se(full) if len(rows) > 1 and len(full) > 1 else se_sum
    return {
        "seeds": len(rows),
        "tasks": len(means),
        "gain": m,
        "se": se,
        "z": m / se if se > 0 else float("nan"),
        "se_conservative": se_sum,
        "z_conservative": m / se_sum if se_sum > 0 else float("nan"),
        "se_over_tasks": se_tasks,
        "se_between_seeds": se_seeds if len(gains) > 1 else None,
    }


def rlla_fields(r: dict) -> dict:
    """The RLLA eval's paired comparison (``paired_values(before, after)``: mean reward) as a
    result row's fields."""
    return {
        "rlla_before": r["before"],
        "rlla_after": r["after"],
        "rlla_diff": r["diff"],
        "rlla_se": r["diff_se_paired"],
        "rlla_z": r["z"],
    }


def pooled_rlla(diffs: list[float]) -> dict:
    """The seeds' mean RLLA difference and its SE between seeds (none without RLLA evals)."""
    if not diffs:
        return {}
    between = stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
    return {"rlla_diff": fmean(diffs), "rlla_se_between_seeds": between}
