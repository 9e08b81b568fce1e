"""Per-step metrics of multi-turn episodes, overall and per task type (pure)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from statistics import fmean

from toolgrpo.rollout.episode import STOP_REASONS, Episode


def _summary(eps: Sequence[Episode], prefix: str) -> dict[str, float]:
    calls = sum(e.tool_calls for e in eps)
    m = {
        f"{prefix}reward/mean": fmean(e.reward for e in eps),
        f"{prefix}turns/mean": fmean(e.num_turns for e in eps),
        f"{prefix}tool_calls/mean": fmean(e.tool_calls for e in eps),
        f"{prefix}tool_errors/mean": fmean(e.tool_errors for e in eps),
        f"{prefix}tool_error_rate": sum(e.tool_errors for e in eps) / calls if calls else 0.0,
        f"{prefix}truncated_frac": fmean(float(e.truncated) for e in eps),
        f"{prefix}tool_seconds/mean": fmean(e.tool_seconds for e in eps),
    }
    parts: dict[str, list[float]] = defaultdict(list)
    for e in eps:
        for k, v in e.reward_parts.items():
            parts[k].append(v)
    for k, vals in parts.items():
        m[f"{prefix}reward/{k}/mean"] = fmean(vals)
    return m


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Episodes whose environment failed are counted (``rollout/env_failures``, overall and per
    task type) and left out of every other statistic: they say nothing about the policy."""
    if not episodes:
        return {}
    m = env_failure_metrics(episodes)
    for reason in STOP_REASONS:
        m[f"episode/stop/{reason}"] = fmean(float(e.stop_reason == reason) for e in episodes)
    ok = [e for e in episodes if e.env_failure is None]
    if not ok:
        return m
    m.update(_summary(ok, "episode/"))
    lengths = [len(e.response_ids) for e in ok]
    m.update(
        {
            "response_length/mean": fmean(lengths),
            "response_length/max": float(max(lengths)),
            "response_length/sampled_mean": fmean(e.sampled_tokens for e in ok),
            # Truncated: cut by the token budget, a turn's cap, or max_turns with work pending.
            "response_length/clip_ratio": fmean(float(e.truncated) for e in ok),
            "prompt_length/mean": fmean(len(e.prompt_ids) for e in ok),
            "rollout/prefix_mismatch": float(sum(e.prefix_mismatches for e in ok)),
            # Summed over episodes, which overlap each other and other episodes' generation:
            # the tools' share of the rollout, not a wall-clock phase like timing/gen_s.
            "timing/tool_s": sum(e.tool_seconds for e in episodes),
        }
    )
    errors: dict[str, int] = defaultdict(int)
    for e in ok:
        for k, v in e.tool_error_types.items():
            errors[k] += v
    for k, v in errors.items():
        m[f"episode/tool_errors/{k}"] = float(v)
    by_type: dict[str, list[Episode]] = defaultdict(list)
    for e in ok:
        by_type[e.task_type].append(e)
    for t, eps in sorted(by_type.items()):
        m.update(_summary(eps, f"episode/{t}/"))
    m.update(rollback_metrics(ok))
    return m


def env_failure_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Episodes whose environment failed, overall and per task type (``rollout/env_errors`` is
    the older name of ``rollout/env_failures``)."""
    failed = float(sum(e.env_failure is not None for e in episodes))
    m = {
        "rollout/env_failures": failed,
        "rollout/env_errors": failed,
        "rollout/env_failure_frac": failed / len(episodes) if episodes else 0.0,
    }
    by_type: dict[str, int] = defaultdict(int)
    for e in episodes:
        by_type[e.task_type] += int(e.env_failure is not None)
    for t, k in sorted(by_type.items()):
        m[f"rollout/{t}/env_failures"] = float(k)
    return m


def rollback_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Tool rollback: turns rolled back, re-samplings, the share of rolled-back turns that
    recovered, negatives kept and groups that got any; what became of every failed attempt;
    fission's continuation rows and their mean reward (absent without any);
    per task type, the error rate of the calls that stand in the final transcripts
    (``tool_error_rate`` counts every attempt). A repaired episode's reward is not a first try's,
    so ``reward/first_try_mean`` and ``reward/repaired_mean`` split the episodes."""
    rollbacks = sum(e.rollback.rollbacks for e in episodes)
    groups: dict[str, int] = defaultdict(int)
    for e in episodes:
        groups[e.uid] += len(e.negatives)
    m = {
        "rollout/rollbacks": float(rollbacks),
        "rollout/retries": float(sum(e.rollback.retries for e in episodes)),
        "rollout/retry_success_rate": (
            sum(e.rollback.recovered for e in episodes) / rollbacks if rollbacks else 0.0
        ),
        "rollout/negative_samples": float(sum(groups.values())),
        "rollout/groups_with_negatives": float(sum(n > 0 for n in groups.values())),
    }
    for name in ("failed", "erased", "capped", "forks"):  # rollback/failed: every failed attempt
        m[f"rollback/{name}"] = float(sum(getattr(e.rollback, name) for e in episodes))
    repaired = sum(e.rollback.repaired for e in episodes)
    m["rollback/repaired_frac"] = repaired / len(episodes) if episodes else 0.0
    forks = [f for e in episodes for f in e.forks]  # fission's continuations: rows, not episodes
    if forks:
        m["rollout/fission_rows"] = float(len(forks))
        m["reward/fission_mean"] = fmean(f.reward for f in forks)
    m.update(first_try_metrics(episodes, "reward/"))
    by_type: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_type[e.task_type].append(e)
    for t, eps in sorted(by_type.items()):
        calls = sum(e.tool_calls - e.rollback.discarded_calls for e in eps)
        errors = sum(e.tool_errors - e.rollback.discarded_errors for e in eps)
        m[f"rollout/{t}/final_tool_error_rate"] = errors / calls if calls else 0.0
        if len(by_type) > 1:
            m.update(first_try_metrics(eps, f"reward/{t}/"))
    return m


def first_try_metrics(episodes: Sequence[Episode], prefix: str) -> dict[str, float]:
    """Mean reward of the episodes kept as first sampled, and of those rollback repaired (a
    failure undone or relabelled); a key is absent when no episode is of its kind."""
    first = [e.reward for e in episodes if not e.rollback.repaired]
    repaired = [e.reward for e in episodes if e.rollback.repaired]
    m: dict[str, float] = {}
    if first:
        m[f"{prefix}first_try_mean"] = fmean(first)
    if repaired:
        m[f"{prefix}repaired_mean"] = fmean(repaired)
    return m
