"""What tool rollback and fission check at startup, before any episode: environments that can
snapshot where the mode needs it, and a ``negative_reward`` no higher than any environment's
lowest score. Each check builds one environment per task type (under a deadline) and closes it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.rollout.env_calls import STARTUP_TIMEOUT_S, startup_probe

log = logging.getLogger(__name__)
TIMEOUT_S = STARTUP_TIMEOUT_S  # each check's construction and close


class SnapshotUnsupported(EnvConfigError):
    """Rollback (``retry``) or fission is on but an environment cannot snapshot its state (or,
    for fission, not into another instance): a setup error, so it stops the run instead of
    silently wasting episodes."""


class NegativeRewardTooHigh(EnvConfigError):
    """``negative_reward`` above the worst score an environment gives: a rolled-back attempt
    would be ranked above a real failure."""


def check_snapshot_support(router: EnvRouter, tasks: Sequence[Task], mode: str = "retry") -> None:
    """At startup, for ``retry`` and ``fission``: every task type that runs tools must have an
    environment that can snapshot. One environment per type is built (not reset) and closed; a
    type that only learns at reset whether it can (a remote one) is checked then, by the episode
    loop, under ``retry``, and refused under ``fission`` (its snapshots live in one session,
    and a fork restores into a new one)."""
    if mode == "relabel":
        return
    seen: dict[str, Task] = {}
    for t in tasks:
        seen.setdefault(t.task_type, t)
    for task_type, task in sorted(seen.items()):
        env, _ = _probe(router, [task], None)
        if env is None or env.single_turn or env.owns_turn:
            continue
        if env.supports_snapshot and not env.snapshot_known_at_reset:
            continue
        if env.snapshot_known_at_reset and mode == "retry":
            continue
        kind = router.spec(task_type).type
        raise SnapshotUnsupported(unsupported_message(task_type, env, kind, mode))


def check_negative_reward(router: EnvRouter, tasks: Sequence[Task], negative_reward: float) -> None:
    """At startup, when negatives are kept: per task type that runs tools, ``negative_reward``
    must not exceed the lowest score of the environment's declared ``reward_range``. Types whose
    range is unknown (None) are not checked; their negatives' advantages are still clamped <= 0.
    An environment that fails to build is skipped here (the episode loop reports it)."""
    by_type: dict[str, list[Task]] = {}
    for t in tasks:
        by_type.setdefault(t.task_type, []).append(t)
    for task_type, group in sorted(by_type.items()):
        env, _ = _probe(router, group, None)
        if env is None or env.single_turn or env.reward_range is None:
            continue
        low = float(env.reward_range[0])
        if negative_reward > low:
            raise NegativeRewardTooHigh(
                f"actor_rollout_ref.rollout.multi_turn.negative_reward={negative_reward:g} is "
                f"above the lowest reward ({low:g}) of task type {task_type!r} "
                f"({type(env).__name__}, rewards in [{low:g}, {env.reward_range[1]:g}]): a failed "
                f"attempt would outrank a real failure; set negative_reward <= {low:g}"
            )


def _probe(
    router: EnvRouter,
    tasks: Sequence[Task],
    fn: Callable[[Env], Awaitable[Any]] | None,
) -> tuple[Env | None, Any]:
    """The first of ``tasks`` whose environment builds (within the deadline), and ``fn``'s
    value on it; the environment is closed either way. ``(None, None)`` when none builds."""
    for task in tasks:
        try:
            return asyncio.run(startup_probe(router, task, fn, TIMEOUT_S))
        except EnvConfigError:  # an unknown type, bad options: the user's to fix
            raise
        except Exception as exc:  # a bad row: the next one of its type tells us
            log.debug("startup check: the environment of %s did not build: %s", task.task_id, exc)
            continue
    return None, None


def unsupported_message(task_type: str, env: Env, env_type: str = "", mode: str = "retry") -> str:
    kind = (
        f"environment type {env_type!r} ({type(env).__name__})" if env_type else type(env).__name__
    )
    if mode == "fission":
        return (
            "actor_rollout_ref.rollout.multi_turn.rollback_mode=fission restores a failed call's "
            f"environment state into a new environment, but task type {task_type!r} uses {kind}, "
            "which cannot snapshot its state (or only within its own remote session); use "
            "rollback_mode=relabel, turn rollback off or leave that task type out of "
            "data.train_files"
        )
    return (
        "actor_rollout_ref.rollout.multi_turn.enable_tool_rollback needs environments that can "
        f"snapshot their state, but task type {task_type!r} uses {kind}, which cannot; turn "
        "rollback off or leave that task type out of data.train_files"
    )
