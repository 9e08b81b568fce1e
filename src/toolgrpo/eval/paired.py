"""Paired comparison of two episode evaluations on the same tasks.

Two policies scored on one held-out set share most of their successes (the easy tasks), so the
standard error of the per-task difference is far smaller than two independent binomial SEs.
``toolgrpo eval --samples N`` (N ≥ the tasks per type) keeps every episode in its JSON; this module
reads those episodes, pairs them by task id and reports the difference with its paired SE, per task
type and over all tasks. Used by ``scripts/compare_evals.py`` and the benchmarks.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from toolgrpo.eval.episodes import success_threshold


@dataclass(frozen=True)
class TaskOutcome:
    """One greedy episode's result, as the eval JSON keeps it."""

    task_type: str
    success: float  # 1.0 when the episode got full marks
    tool_errors: int

    @property
    def had_tool_error(self) -> float:
        return float(self.tool_errors > 0)


MEASURES: dict[str, Callable[[TaskOutcome], float]] = {
    "accuracy": lambda o: o.success,
    "episodes_with_tool_error": lambda o: o.had_tool_error,
}


class IncompleteEval(ValueError):
    """The eval JSON did not keep every episode (``--samples`` was smaller than the tasks)."""


def load_episodes(path: Path) -> list[dict[str, Any]]:
    """The episodes a ``toolgrpo eval`` JSON kept; ``IncompleteEval`` unless it kept them all."""
    record = json.loads(Path(path).read_text())
    samples = record.get("samples", [])
    if len(samples) < record.get("num_episodes", 0):
        raise IncompleteEval(
            f"{path} keeps {len(samples)} episodes of {record['num_episodes']}: "
            "re-run toolgrpo eval with --samples at least the tasks per type"
        )
    return samples


def load_outcomes(path: Path) -> dict[str, TaskOutcome]:
    """task id → outcome, from a ``toolgrpo eval`` JSON that kept every episode."""
    out = {}
    for s in load_episodes(path):
        reward = s["reward"]
        ok = reward is not None and math.isfinite(reward)
        ok = ok and reward >= success_threshold(s["task_type"])
        errors = s.get("tool_errors") or {}
        out[s["task_id"]] = TaskOutcome(s["task_type"], float(ok), int(sum(errors.values())))
    return out


def load_parts(path: Path, part: str) -> dict[str, tuple[str, float]]:
    """task id → (task type, one reward part as a number, 0 where the episode lacks it), from a
    ``toolgrpo eval`` JSON that kept every episode: e.g. ``format_valid`` or ``correct`` of the
    generated-schemas tasks."""
    return {
        s["task_id"]: (s["task_type"], float((s.get("reward_parts") or {}).get(part, 0.0)))
        for s in load_episodes(path)
    }


def paired(
    before: Mapping[str, TaskOutcome],
    after: Mapping[str, TaskOutcome],
    measure: str = "accuracy",
) -> dict[str, dict[str, Any]]:
    """Per task type and ``all``: the measure before and after, their difference, its paired SE
    and z, and how many tasks moved each way."""
    value = MEASURES[measure]
    common = sorted(before.keys() & after.keys())
    if not common:
        raise ValueError("the two evaluations share no task id")
    by_type: dict[str, list[str]] = defaultdict(list)
    for tid in common:
        by_type[before[tid].task_type].append(tid)
    by_type["all"] = common
    return {
        name: paired_values({t: value(before[t]) for t in ids}, {t: value(after[t]) for t in ids})
        for name, ids in sorted(by_type.items())
    }


def paired_values(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """One number per task id before and after: the mean of each, the mean difference over the
    ids both hold, its paired SE and z, and how many ids moved each way."""
    ids = sorted(before.keys() & after.keys())
    if not ids:
        raise ValueError("the two evaluations share no task id")
    diffs = [after[t] - before[t] for t in ids]
    n = len(diffs)
    mean = fmean(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    se = math.sqrt(var / n)
    return {
        "tasks": n,
        "before": fmean(before[t] for t in ids),
        "after": fmean(after[t] for t in ids),
        "diff": mean,
        "diff_se_paired": se,
        "z": mean / se if se > 0 else float("nan"),
        "up": sum(d > 0 for d in diffs),  # e.g. solved after, not before
        "down": sum(d < 0 for d in diffs),
    }


def load_single_turn(path: Path, field: str = "total") -> dict[str, float]:
    """task id → one number (``total`` reward, ``format``, ``correctness``; ``format_ok`` and
    ``exact_call`` as 0/1), averaged over a task's samples, from a single-turn ``toolgrpo eval``
    JSON that kept every sample."""
    record = json.loads(Path(path).read_text())
    samples = record.get("samples", [])
    want = record.get("num_samples", record.get("num_tasks", 0))
    if len(samples) < want:
        raise IncompleteEval(
            f"{path} keeps {len(samples)} samples of {want}: "
            "re-run toolgrpo eval with --samples at least the number it draws"
        )
    by_task: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        by_task[s["task_id"]].append(float(s[field]))
    return {t: fmean(v) for t, v in by_task.items()}


def format_rows(result: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per task type: before → after, difference ± paired SE."""
    return [
        f"{name:>12}: {r['before']:.3f} -> {r['after']:.3f}  diff {r['diff']:+.3f} "
        f"± {r['diff_se_paired']:.3f} (paired SE, z={r['z']:.2f}; "
        f"{r['up']} up, {r['down']} down of {r['tasks']})"
        for name, r in result.items()
    ]
