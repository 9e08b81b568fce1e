"""The episode loop: generate, run the tools the model called, append their results, repeat.

``play_task`` plays one episode; ``play_tasks`` plays G episodes per task concurrently (one
asyncio task each) with their generation requests batched by a ``GenerationBatcher``, then, under
fission, the continuation groups of the failures it forks (``rollout.fission``). Every
environment call has a deadline (``env_calls``); what happens between turns is in ``turns``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from toolgrpo import progress
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvStart
from toolgrpo.envs.concurrency import slot_taker
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.env_calls import EnvClock, bounded, failure_reason, make_env
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.episode_end import env_failed, finish, note_slot_wait
from toolgrpo.rollout.fission import ForkPoint, keep_trainable, make_recorder, select_forks
from toolgrpo.rollout.generator import GenerationError
from toolgrpo.rollout.limits import EpisodeLimits
from toolgrpo.rollout.render import encode_prompt, with_tools
from toolgrpo.rollout.rollback import (
    NegativeBudget,
    RollbackPolicy,
    SnapshotUnsupported,
    make_guard,
)
from toolgrpo.rollout.turn_loop import Condition, TurnState, run_turns

__all__ = ["Condition", "EpisodeLimits", "env_failed", "play_task", "play_tasks"]

log = logging.getLogger(__name__)


async def play_task(
    task: Task,
    env: Env,
    batcher: GenerationBatcher,
    tokenizer: Any,
    limits: EpisodeLimits,
    uid: str = "",
    step: int = 0,
    policy_version: int = 0,
    rollback: RollbackPolicy | None = None,
    budget: NegativeBudget | None = None,
    condition: Condition | None = None,
    on_fork: Callable[[ForkPoint], None] | None = None,
) -> Episode:
    """One episode of ``task`` in ``env``; never raises for what the model or the tools do.
    With ``rollback``, a turn whose tools fail is undone and re-sampled (``rollback.TurnGuard``);
    ``budget`` caps the negatives its GRPO group keeps; under fission, the episode's fork point
    goes to ``on_fork``. An environment that raises, sets ``fatal_error``, misses a deadline or
    times out a tool call ends the episode with ``env_failure`` set (``env_failed``)."""
    clock = EnvClock(limits.env_call_timeout_s, limits.env_episode_timeout_s)
    take_slot = slot_taker(env)
    try:
        start = await _reset(env, clock, task, take_slot)
    except Exception as exc:
        ep = Episode(task.task_id, task.task_type, uid, [])
        ep.policy_version = policy_version
        note_slot_wait(ep, take_slot, clock)
        return env_failed(ep, failure_reason("reset", exc), limits)
    if condition is not None:
        start = condition(start)
    messages, tools = with_tools(tokenizer, start.messages, start.tools, limits.tool_format)
    prompt_text, prompt_ids = encode_prompt(tokenizer, messages, tools, limits.tool_format)
    ep = Episode(task.task_id, task.task_type, uid, prompt_ids, messages=messages)
    ep.policy_version = policy_version
    note_slot_wait(ep, take_slot, clock)
    if env.fatal_error:  # e.g. a remote environment that could not be reached
        return await finish(ep, env, tokenizer, step, limits, clock)
    if len(ep.prompt_ids) > limits.max_prompt_length:
        ep.stop_reason, ep.truncated = "prompt_too_long", True
        return await finish(ep, env, tokenizer, step, limits, clock)
    run = TurnState(ep, env, clock, messages, tools, prompt_text, condition=condition)
    run.guard = make_guard(env, task.task_type, rollback, budget)
    run.recorder = make_recorder(env, task, rollback, tools)
    await run_turns(run, batcher, tokenizer, limits)
    if run.guard is not None:
        run.guard.finish(ep)
    if run.recorder is not None and run.recorder.point is not None and on_fork is not None:
        on_fork(run.recorder.point)
    return await finish(ep, env, tokenizer, step, limits, clock)


async def _reset(env: Env, clock: EnvClock, task: Task, take_slot: Any) -> EnvStart:
    if take_slot is not None:  # a queue, not the reset's call time (``envs/concurrency``)
        why = f"waited for a max_concurrency slot of task type {task.task_type!r}"
        await clock.wait(why, take_slot)
    return await clock.call("reset", env.reset)


async def play_tasks(
    tasks: Sequence[Task],
    n: int,
    router: EnvRouter,
    batcher: GenerationBatcher,
    tokenizer: Any,
    limits: EpisodeLimits,
    step: int = 0,
    policy_version: int = 0,
    max_concurrent: int = 0,
    rollback: RollbackPolicy | None = None,
    conditions: Sequence[Condition | None] | None = None,
) -> list[Episode]:
    """``n`` episodes per task, all in flight at once (or ``max_concurrent``), grouped by task in
    task order; the episodes of one task share a fresh uid (and, with ``rollback``, one cap on
    the negatives they keep). ``conditions`` (one per episode, task-major) rewrite each
    episode's opening prompt. Under fission, the forked episodes' continuation groups are
    played once every episode has ended, and hang off their parents (``Episode.forks``)."""
    if conditions is not None and len(conditions) != len(tasks) * n:
        raise ValueError(f"{len(conditions)} conditions for {len(tasks) * n} episodes")
    sem = asyncio.Semaphore(max_concurrent) if max_concurrent > 0 else None
    conds = list(conditions) if conditions is not None else [None] * (len(tasks) * n)
    points: list[ForkPoint | None] = [None] * len(conds)

    async def held(job: Awaitable[Episode]) -> Episode:
        if sem is None:
            return await job
        async with sem:
            return await job

    async def with_env(task: Task, uid: str, body: Callable[[Env], Awaitable[Episode]]) -> Episode:
        """``body`` in a fresh environment of ``task``, closed after (within its deadline)."""
        env: Env | None = None
        try:
            env = await make_env(router, task, limits.env_call_timeout_s or None)
            return await body(env)
        except (SnapshotUnsupported, GenerationError):  # setup or backend: stop, do not score
            raise
        except Exception as exc:  # an environment bug ends its episode, not the run
            where = "construction" if env is None else "episode"
            ep = Episode(task.task_id, task.task_type, uid, [])
            ep.policy_version = policy_version
            return env_failed(ep, failure_reason(where, exc), limits)
        finally:
            if env is not None:
                try:  # a close that hangs is abandoned at the call deadline
                    await bounded(env.close, (), limits.env_call_timeout_s or None, "close")
                except Exception as exc:  # closing is best effort
                    log.warning("closing env for %s failed: %r", task.task_id, exc)

    async def episode(j: int, task: Task, uid: str, budget: NegativeBudget | None) -> Episode:
        def fork_at(point: ForkPoint) -> None:
            points[j] = point

        def played(env: Env) -> Awaitable[Episode]:
            args = (uid, step, policy_version, rollback, budget, conds[j], fork_at)
            return play_task(task, env, batcher, tokenizer, limits, *args)

        try:
            return await held(with_env(task, uid, played))
        finally:
            progress.tick()  # one more episode finished (live progress)

    async def continuation(j: int, uid: str) -> Episode:
        point = points[j]
        assert point is not None

        def played(env: Env) -> Awaitable[Episode]:
            args = (uid, batcher, tokenizer, limits, step, policy_version, conds[j])
            return _continue(point, env, *args)

        return await held(with_env(point.task, uid, played))

    jobs = []
    for t, task in enumerate(tasks):
        uid = uuid.uuid4().hex
        budget = NegativeBudget(rollback.max_negatives_per_group) if rollback else None
        jobs.extend(episode(t * n + k, task, uid, budget) for k in range(n))
    episodes = list(await asyncio.gather(*jobs))
    if rollback is None or rollback.mode != "fission":
        return episodes
    live = [p if e.env_failure is None else None for p, e in zip(points, episodes, strict=True)]
    chosen = select_forks(live, n, rollback.max_forks_per_step)
    groups = {j: uuid.uuid4().hex for j in chosen}
    size = rollback.fission_group_size
    played = await asyncio.gather(
        *(continuation(j, groups[j]) for j in chosen for _ in range(size))
    )
    for g, j in enumerate(chosen):
        episodes[j].forks = keep_trainable(list(played[g * size : (g + 1) * size]))
        episodes[j].rollback.forks = int(bool(episodes[j].forks))
    return episodes


async def _continue(
    point: ForkPoint,
    env: Env,
    uid: str,
    batcher: GenerationBatcher,
    tokenizer: Any,
    limits: EpisodeLimits,
    step: int,
    policy_version: int,
    condition: Condition | None,
) -> Episode:
    """One continuation of a fork point, in ``env`` reset and restored to the saved state; its
    prompt is the fork point, so only its own turns train (``rollout.fission``)."""
    task = point.task
    ep = Episode(
        task.task_id, task.task_type, uid, list(point.prompt_ids), fork_of=point.parent_uid
    )
    ep.messages = copy.deepcopy(point.messages)
    ep.policy_version, ep.num_turns = policy_version, point.num_turns
    ep.step_rewards = list(point.step_rewards)
    ep.meta["fork_errors"] = list(point.errors)
    clock = EnvClock(limits.env_call_timeout_s, limits.env_episode_timeout_s)
    try:
        await _reset(env, clock, task, slot_taker(env))
        await clock.call("restore", env.arestore, point.env_state)
    except Exception as exc:
        return env_failed(ep, failure_reason("fork restore", exc), limits)
    if not env.fatal_error:
        run = TurnState(ep, env, clock, ep.messages, point.tools, point.stream_text, point.spent)
        run.condition = condition
        await run_turns(run, batcher, tokenizer, limits)
    return await finish(ep, env, tokenizer, step, limits, clock)
