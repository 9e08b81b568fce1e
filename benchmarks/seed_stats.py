"""The standard error of a mean gain over seeds and tasks, shared by the benchmarks that pool
paired evals over several training seeds."""

from __future__ import annotations

import math
from statistics import fmean


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
