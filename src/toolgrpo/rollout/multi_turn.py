"""The episode loop: generate, run the tools the model called, append their results, repeat.

``play_task`` plays one episode; ``play_tasks`` plays G episodes per task concurrently (one
asyncio task each) with their generation requests batched by a ``GenerationBatcher``. Every
environment call has a deadline (``env_calls``); what happens between turns is in ``turns``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolgrpo import progress
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvStart, Transcript
from toolgrpo.envs.concurrency import slot_taker
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.env_calls import EnvClock, bounded, failure_reason, timeout_failure
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import GenerationError
from toolgrpo.rollout.render import decode, encode_prompt, with_tools
from toolgrpo.rollout.rollback import (
    NegativeBudget,
    RollbackPolicy,
    SnapshotUnsupported,
    make_guard,
)
from toolgrpo.rollout.tool_parsers import get_format
from toolgrpo.rollout.turns import (
    append_delta,
    assistant_message,
    count_tools,
    result_call_ids,
    run_calls,
    tool_message,
    turn_calls,
)
from toolgrpo.tools.executor import expecting

log = logging.getLogger(__name__)

# Rewrites an episode's opening messages and tools (e.g. the router's route, toolgrpo.router).
# A condition may also have ``refuse(call) -> str | None``: a call it refuses (a tool its
# opening no longer offers) comes back as that error message, never reaching the environment.
Condition = Callable[[EnvStart], EnvStart]


@dataclass(frozen=True)
class EpisodeLimits:
    max_prompt_length: int = 1024  # the opening prompt
    max_response_length: int = 512  # all turns after the prompt, tool results included
    max_tokens_per_turn: int = 256  # one assistant turn
    max_tool_response_length: int = 256  # tokens of one tool result (0 = no limit)
    tool_response_truncate_side: str = "middle"  # right | left | middle
    # The score recorded on an episode whose environment failed; such episodes are never trained
    # on nor averaged into reward metrics (``Episode.env_failure``), so it is informational.
    error_reward: float = -1.0
    # Deadlines (``env_calls.EnvClock``): one environment call, and all of an episode's calls
    # together (generation not counted); past either, an environment failure. 0 = no limit.
    # Waiting for a ``max_concurrency`` slot spends only the episode's budget, not a call's.
    env_call_timeout_s: float = 60.0
    env_episode_timeout_s: float = 900.0
    # How the model writes tool calls (``rollout.tool_parsers``): hermes | llama3_json | mistral.
    tool_format: str = "hermes"

    def __post_init__(self) -> None:
        get_format(self.tool_format)  # an unknown format fails here, not mid-rollout


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
) -> Episode:
    """One episode of ``task`` in ``env``; never raises for what the model or the tools do.
    With ``rollback``, a turn whose tools fail is undone and re-sampled (``rollback.TurnGuard``);
    ``budget`` caps the negatives its GRPO group keeps. An environment that raises, sets
    ``fatal_error``, misses a deadline or times out a tool call ends the episode with
    ``env_failure`` set (``env_failed``)."""
    clock = EnvClock(limits.env_call_timeout_s, limits.env_episode_timeout_s)
    take_slot = slot_taker(env)
    try:
        if take_slot is not None:  # a queue, not the reset's call time (``envs/concurrency``)
            why = f"waited for a max_concurrency slot of task type {task.task_type!r}"
            await clock.wait(why, take_slot)
        start = await clock.call("reset", env.reset)
    except Exception as exc:
        ep = Episode(task.task_id, task.task_type, uid, [])
        ep.policy_version = policy_version
        _note_slot_wait(ep, take_slot, clock)
        return env_failed(ep, failure_reason("reset", exc), limits)
    if condition is not None:
        start = condition(start)
    messages, tools = with_tools(tokenizer, start.messages, start.tools, limits.tool_format)
    prompt_text, prompt_ids = encode_prompt(tokenizer, messages, tools)
    ep = Episode(task.task_id, task.task_type, uid, prompt_ids, messages=messages)
    ep.policy_version = policy_version
    _note_slot_wait(ep, take_slot, clock)
    if env.fatal_error:  # e.g. a remote environment that could not be reached
        return await _finish(ep, env, tokenizer, step, limits, clock)
    if len(ep.prompt_ids) > limits.max_prompt_length:
        ep.stop_reason, ep.truncated = "prompt_too_long", True
        return await _finish(ep, env, tokenizer, step, limits, clock)
    guard = make_guard(env, task.task_type, rollback, budget)
    stream_text = prompt_text
    eos = {tokenizer.eos_token_id} | set(getattr(batcher.generator, "eos_ids", []) or [])
    while True:
        room = limits.max_response_length - len(ep.response_ids)
        if room <= 0:
            ep.stop_reason, ep.truncated = "context", True
            break
        if guard is not None:
            await clock.call("snapshot", guard.begin_turn, ep, env, stream_text)
            if env.fatal_error:  # a remote snapshot or restore failed
                ep.stop_reason = "env_error"
                break
        comp = await batcher.generate(
            ep.prompt_ids + ep.response_ids, min(limits.max_tokens_per_turn, room)
        )
        ep.append(comp.token_ids, comp.logprobs)
        ep.num_turns += 1
        stream_text += decode(tokenizer, comp.token_ids)
        body = (
            comp.token_ids[:-1] if comp.token_ids and comp.token_ids[-1] in eos else comp.token_ids
        )
        text = decode(tokenizer, body)
        cut = comp.finish_reason == "length"  # complete calls before the cap still run
        calls = [] if env.single_turn else turn_calls(text, cut, limits.tool_format)
        turn = assistant_message(text, calls, messages)
        messages.append(turn)
        if cut and not calls:
            ep.stop_reason, ep.truncated = "length", True
            break
        if env.single_turn:
            break
        last_turn = ep.num_turns >= env.max_turns
        if not calls:
            try:
                more = await clock.call("next_user_turn", env.next_user_turn, list(messages))
            except Exception as exc:
                env.fatal_error = failure_reason("next_user_turn", exc)
                ep.stop_reason = "env_error"
                break
            if not more:
                break  # a final answer
            if last_turn:  # the dialogue goes on, but this episode has no turn left for it
                ep.stop_reason, ep.truncated = "max_turns", True
                break
            new = list(more)
        else:
            t0 = time.perf_counter()
            refuse = getattr(condition, "refuse", None)
            try:  # a parse error shows the call in the episode's format
                with expecting(get_format(limits.tool_format).example):
                    results = await clock.call("step", run_calls, env, calls, refuse)
            except Exception as exc:  # the contract says step never raises; hold it to that
                env.fatal_error = failure_reason("step", exc)
                results = []
            ep.tool_seconds += time.perf_counter() - t0
            count_tools(ep, results)
            # One rule for every environment type: a timed-out call is its failure.
            env.fatal_error = env.fatal_error or timeout_failure(results)
            if env.fatal_error:
                ep.stop_reason = "env_error"
                break
            if guard is not None:
                resume = await clock.call("restore", guard.after_tools, ep, env, calls, results)
                if resume is not None:  # rolled back to before this turn: sample it again
                    stream_text = resume
                    continue
            ids = result_call_ids(turn.get("tool_calls") or [], calls, results)
            new = [tool_message(tokenizer, r, limits, i) for r, i in zip(results, ids, strict=True)]
            if any(r.done for r in results) or last_turn:
                # The environment ended the episode, or this was the last turn: the calls ran,
                # and their results join the transcript the reward sees (tokens if they fit).
                if any(r.done for r in results):
                    ep.stop_reason = "done"
                else:  # the model still had work under way
                    ep.stop_reason, ep.truncated = "max_turns", True
                append_delta(ep, tokenizer, stream_text, messages, new, tools, limits)
                messages.extend(new)
                break
        delta = append_delta(ep, tokenizer, stream_text, messages, new, tools, limits)
        if delta is None:
            ep.stop_reason, ep.truncated = "context", True
            break
        stream_text += delta
        messages.extend(new)
    if guard is not None:
        guard.finish(ep)
    return await _finish(ep, env, tokenizer, step, limits, clock)


def _note_slot_wait(ep: Episode, take_slot: Any, clock: EnvClock) -> None:
    """Record how long a capped task type's episode queued for its slot (``Episode.meta``)."""
    if take_slot is not None:
        ep.meta["env_slot_wait_s"] = clock.waited_s


async def _finish(
    ep: Episode, env: Env, tokenizer: Any, step: int, limits: EpisodeLimits, clock: EnvClock
) -> Episode:
    if env.fatal_error:
        return env_failed(ep, env.fatal_error, limits)
    text = decode(tokenizer, ep.prompt_ids + ep.response_ids)
    transcript = Transcript(list(ep.messages), text, ep.stop_reason, ep.num_turns, step)
    try:
        r = await clock.call("reward", env.reward, transcript)
    except Exception as exc:  # a broken reward is the environment's failure, not the model's
        return env_failed(ep, failure_reason("reward", exc), limits)
    if env.fatal_error:  # e.g. the server died while scoring
        return env_failed(ep, env.fatal_error, limits)
    ep.reward, ep.reward_parts = float(r.score), dict(r.parts)
    return ep


def env_failed(ep: Episode, reason: str, limits: EpisodeLimits) -> Episode:
    """Mark an episode its environment failed: ``env_failure`` says why; the trainer leaves it
    out of the batch and of reward means (the score is ``error_reward``, for the record only)."""
    log.debug("episode of %s: environment failed: %s", ep.task_id, reason)
    ep.stop_reason, ep.env_failure = "env_error", reason
    ep.reward, ep.reward_parts = limits.error_reward, {"env_error": 1.0}
    return ep


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
    episode's opening prompt."""
    if conditions is not None and len(conditions) != len(tasks) * n:
        raise ValueError(f"{len(conditions)} conditions for {len(tasks) * n} episodes")
    sem = asyncio.Semaphore(max_concurrent) if max_concurrent > 0 else None

    async def one(
        task: Task, uid: str, budget: NegativeBudget | None, cond: Condition | None
    ) -> Episode:
        if sem is None:
            return await _guarded(task, uid, budget, cond)
        async with sem:
            return await _guarded(task, uid, budget, cond)

    async def _guarded(
        task: Task, uid: str, budget: NegativeBudget | None, cond: Condition | None
    ) -> Episode:
        env: Env | None = None
        try:
            env = router.make(task)  # a constructor that raises fails this episode only
            return await play_task(
                task,
                env,
                batcher,
                tokenizer,
                limits,
                uid,
                step,
                policy_version,
                rollback,
                budget,
                cond,
            )
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
            progress.tick()  # one more episode finished (live progress, issue #20)

    jobs = []
    for t, task in enumerate(tasks):
        uid = uuid.uuid4().hex
        budget = NegativeBudget(rollback.max_negatives_per_group) if rollback else None
        conds = conditions[t * n : (t + 1) * n] if conditions is not None else [None] * n
        jobs.extend(one(task, uid, budget, c) for c in conds)
    return list(await asyncio.gather(*jobs))
