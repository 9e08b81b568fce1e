"""Per-task-type scores of played episodes: the one summary behind both ``toolgrpo eval`` and
the trainer's in-training validation, so the two report the same numbers for the same episodes.

Pure functions over ``Episode`` objects. Accuracy is the share of episodes whose reward reaches
the environment's full marks (``success_threshold``); its binomial standard error says how far
two accuracies must differ before a learning claim means anything.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.rollout.episode import STOP_REASONS, Episode

ALL = "all"  # the row over every episode, beside one row per task type
# Full marks per task type: calculator and direct score 0/1 (exact answer), search scores token
# F1 (1.0 only for the exact answer after normalisation), bfcl_multi_turn the share of turns
# passed (1.0 = every turn). Task types not listed (remote environments) use DEFAULT_THRESHOLD;
# RLLA episodes are judged on their reward parts (``succeeded``).
SUCCESS_THRESHOLDS: dict[str, float] = {
    "calculator": 1.0,
    "search": 1.0,
    "direct": 1.0,
    "bfcl_multi_turn": 1.0,
}
DEFAULT_THRESHOLD = 1.0


def success_threshold(task_type: str, overrides: Mapping[str, float] | None = None) -> float:
    if overrides and task_type in overrides:
        return float(overrides[task_type])
    return SUCCESS_THRESHOLDS.get(task_type, DEFAULT_THRESHOLD)


def binomial_se(p: float, n: int) -> float:
    """Standard error of a proportion ``p`` measured on ``n`` independent episodes."""
    return math.sqrt(p * (1.0 - p) / n) if n > 0 else 0.0


def succeeded(e: Episode, thresholds: Mapping[str, float] | None = None) -> bool:
    """Full marks. RLLA's total depends on its reward flags and step, so an RLLA episode
    succeeds on its exact-call part (tool-call ground truths) or its format (response ones)."""
    if not math.isfinite(e.reward):
        return False
    if e.task_type == "rlla" and (thresholds is None or "rlla" not in thresholds):
        part = "exact_call" if "exact_call" in e.reward_parts else "format_ok"
        return e.reward_parts.get(part, 0.0) >= 1.0
    return e.reward >= success_threshold(e.task_type, thresholds)


def _summary(eps: Sequence[Episode], thresholds: Mapping[str, float] | None) -> dict[str, Any]:
    n = len(eps)
    wins = [float(succeeded(e, thresholds)) for e in eps]
    acc = fmean(wins)
    calls = sum(e.tool_calls for e in eps)
    errors: dict[str, int] = defaultdict(int)
    for e in eps:
        for k, v in e.tool_error_types.items():
            errors[k] += v
    parts: dict[str, list[float]] = defaultdict(list)
    for e in eps:
        for k, v in e.reward_parts.items():
            parts[k].append(v)
    return {
        "episodes": n,
        "tasks": len({e.task_id for e in eps}),
        "accuracy": acc,
        "accuracy_se": binomial_se(acc, n),
        "reward_mean": fmean(e.reward for e in eps),
        "tool_call_rate": fmean(float(e.tool_calls > 0) for e in eps),  # episodes with a call
        "calls_per_episode": calls / n,
        "tool_error_rate": sum(e.tool_errors for e in eps) / calls if calls else 0.0,
        "tool_errors": {k: {"count": v, "rate": v / calls} for k, v in sorted(errors.items())},
        "turns_mean": fmean(e.num_turns for e in eps),
        "prompt_tokens_mean": fmean(len(e.prompt_ids) for e in eps),
        "response_tokens_mean": fmean(len(e.response_ids) for e in eps),
        "sampled_tokens_mean": fmean(e.sampled_tokens for e in eps),
        "truncated_frac": fmean(float(e.truncated) for e in eps),
        "stop_reasons": {
            r: fmean(float(e.stop_reason == r) for e in eps)
            for r in STOP_REASONS
            if any(e.stop_reason == r for e in eps)
        },
        "reward_parts": {k: fmean(v) for k, v in sorted(parts.items())},
    }


def _route_shares(routes: Sequence[str]) -> dict[str, float]:
    return {r: routes.count(r) / len(routes) for r in sorted(set(routes))}


def summarize_episodes(
    episodes: Sequence[Episode],
    thresholds: Mapping[str, float] | None = None,
    routes: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{task_type: summary, ..., "all": summary}``; ``"all"`` also carries the mean accuracy
    over task types (each type weighted equally, as the issue's mixed-task goal counts it).
    ``routes`` (one per episode, when a router chose them) adds each route's share."""
    if not episodes:
        return {}
    if routes is not None and len(routes) != len(episodes):
        raise ValueError(f"{len(routes)} routes for {len(episodes)} episodes")
    by_type: dict[str, list[Episode]] = defaultdict(list)
    routes_of: dict[str, list[str]] = defaultdict(list)
    for i, e in enumerate(episodes):
        by_type[e.task_type].append(e)
        if routes is not None:
            routes_of[e.task_type].append(routes[i])
    out = {t: _summary(eps, thresholds) for t, eps in sorted(by_type.items())}
    if routes is not None:
        for t in out:
            out[t]["routes"] = _route_shares(routes_of[t])
    overall = _summary(episodes, thresholds)
    if routes is not None:
        overall["routes"] = _route_shares(list(routes))
    accs = [s["accuracy"] for s in out.values()]
    overall["type_mean_accuracy"] = fmean(accs)
    # SE of a mean of independent proportions: sqrt(sum(se_i^2)) / k.
    overall["type_mean_accuracy_se"] = math.sqrt(
        sum(s["accuracy_se"] ** 2 for s in out.values())
    ) / len(out)
    out[ALL] = overall
    return out


def summary_metrics(summary: Mapping[str, Mapping[str, Any]], prefix: str = "val") -> dict:
    """The summary flattened to scalar metrics (``val/calculator/accuracy``, ...)."""
    m: dict[str, float] = {}
    for t, s in summary.items():
        for k, v in s.items():
            if isinstance(v, (int, float)):
                m[f"{prefix}/{t}/{k}"] = float(v)
        for k, d in s["tool_errors"].items():
            m[f"{prefix}/{t}/tool_errors/{k}/rate"] = float(d["rate"])
        for k, v in s["stop_reasons"].items():
            m[f"{prefix}/{t}/stop/{k}"] = float(v)
        for k, v in s.get("routes", {}).items():
            m[f"{prefix}/{t}/route/{k}"] = float(v)
    return m


def sample_transcripts(
    episodes: Sequence[Episode],
    tasks: Sequence[Task],
    per_type: int,
    routes: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The first ``per_type`` episodes of each task type, as readable transcripts."""
    truth = {t.task_id: t.ground_truth for t in tasks}
    kept: dict[str, int] = defaultdict(int)
    out = []
    for i, e in enumerate(episodes):
        if kept[e.task_type] >= per_type:
            continue
        kept[e.task_type] += 1
        out.append(
            {
                "task_id": e.task_id,
                "task_type": e.task_type,
                "ground_truth": truth.get(e.task_id, ""),
                "route": routes[i] if routes is not None else None,
                "reward": e.reward,
                "reward_parts": dict(e.reward_parts),
                "stop_reason": e.stop_reason,
                "num_turns": e.num_turns,
                "tool_calls": e.tool_calls,
                "tool_errors": dict(e.tool_error_types),
                "messages": [dict(m) for m in e.messages],
            }
        )
    return out
