"""The episode loop: generate, run the tools the model called, append their results, repeat.

``play_task`` plays one episode; ``play_tasks`` plays G episodes per task concurrently (one
asyncio task each) with their generation requests batched by a ``GenerationBatcher``.
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
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import GenerationError
from toolgrpo.rollout.render import decode, delta_text, encode, render_text, with_tools
from toolgrpo.rollout.rollback import (
    NegativeBudget,
    RollbackPolicy,
    SnapshotUnsupported,
    make_guard,
)
from toolgrpo.tools.executor import truncate_text
from toolgrpo.tools.parser import parse_tool_calls
from toolgrpo.tools.types import ToolCall, ToolResult

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
    ``budget`` caps the negatives its GRPO group keeps. An environment that raises or sets
    ``fatal_error`` ends the episode with ``env_failure`` set (``env_failed``)."""
    try:
        start = await env.reset()
    except Exception as exc:
        ep = Episode(task.task_id, task.task_type, uid, [])
        ep.policy_version = policy_version
        return env_failed(ep, f"reset raised {type(exc).__name__}: {exc}", limits)
    if condition is not None:
        start = condition(start)
    messages, tools = with_tools(tokenizer, start.messages, start.tools)
    prompt_text = render_text(tokenizer, messages, tools, True)
    ep = Episode(
        task.task_id, task.task_type, uid, encode(tokenizer, prompt_text), messages=messages
    )
    ep.policy_version = policy_version
    if env.fatal_error:  # e.g. a remote environment that could not be reached
        return await _finish(ep, env, tokenizer, step, limits)
    if len(ep.prompt_ids) > limits.max_prompt_length:
        ep.stop_reason, ep.truncated = "prompt_too_long", True
        return await _finish(ep, env, tokenizer, step, limits)
    guard = make_guard(env, task.task_type, rollback, budget)
    stream_text = prompt_text
    eos = {tokenizer.eos_token_id} | set(getattr(batcher.generator, "eos_ids", []) or [])
    while True:
        room = limits.max_response_length - len(ep.response_ids)
        if room <= 0:
            ep.stop_reason, ep.truncated = "context", True
            break
        if guard is not None:
            await guard.begin_turn(ep, env, stream_text)
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
        messages.append({"role": "assistant", "content": text})
        if comp.finish_reason == "length":
            ep.stop_reason, ep.truncated = "length", True
            break
        if env.single_turn:
            break
        calls = parse_tool_calls(text)
        last_turn = ep.num_turns >= env.max_turns
        if not calls:
            more = await env.next_user_turn(list(messages))
            if not more:
                break  # a final answer
            if last_turn:  # the dialogue goes on, but this episode has no turn left for it
                ep.stop_reason, ep.truncated = "max_turns", True
                break
            new = list(more)
        else:
            t0 = time.perf_counter()
            try:
                results = await _run_calls(env, calls, getattr(condition, "refuse", None))
            except Exception as exc:  # the contract says step never raises; hold it to that
                env.fatal_error = f"step raised {type(exc).__name__}: {exc}"
                results = []
            ep.tool_seconds += time.perf_counter() - t0
            _count_tools(ep, results)
            if env.fatal_error:
                ep.stop_reason = "env_error"
                break
            if guard is not None:
                resume = await guard.after_tools(ep, env, calls, results)
                if resume is not None:  # rolled back to before this turn: sample it again
                    stream_text = resume
                    continue
            new = [_tool_message(tokenizer, r, limits) for r in results]
            if any(r.done for r in results) or last_turn:
                # The environment ended the episode, or this was the last turn: the calls ran,
                # and their results join the transcript the reward sees (tokens if they fit).
                if any(r.done for r in results):
                    ep.stop_reason = "done"
                else:  # the model still had work under way
                    ep.stop_reason, ep.truncated = "max_turns", True
                _append_delta(ep, tokenizer, stream_text, messages, new, tools, limits)
                messages.extend(new)
                break
        delta = _append_delta(ep, tokenizer, stream_text, messages, new, tools, limits)
        if delta is None:
            ep.stop_reason, ep.truncated = "context", True
            break
        stream_text += delta
        messages.extend(new)
    if guard is not None:
        guard.finish(ep)
    return await _finish(ep, env, tokenizer, step, limits)


async def _run_calls(
    env: Env, calls: list[ToolCall], refuse: Callable[[ToolCall], str | None] | None
) -> list[ToolResult]:
    """The environment's results for the calls the episode's condition lets through, and a
    ``not_offered`` error for each it refuses, in call order (refused calls still count as
    calls: the model wrote them)."""
    refusals = [refuse(c) if refuse is not None else None for c in calls]
    if not any(r is not None for r in refusals):
        return await env.step(calls)  # the environment's results, exactly as it gives them
    allowed = [c for c, r in zip(calls, refusals, strict=True) if r is None]
    ran = list(await env.step(allowed)) if allowed else []
    out: list[ToolResult] = []
    for c, r in zip(calls, refusals, strict=True):
        if r is not None:
            out.append(ToolResult(r, True, "not_offered", c.name, c.id))
        elif ran:
            out.append(ran.pop(0))
    return out + ran  # any results beyond one per call, as the environment gave them


def _append_delta(
    ep: Episode,
    tokenizer: Any,
    stream_text: str,
    messages: list[dict[str, Any]],
    new: list[dict[str, Any]],
    tools: Any,
    limits: EpisodeLimits,
) -> str | None:
    """Append the rendered text between turns (``new`` messages and the next generation prompt)
    as mask-0 tokens; ``None`` (nothing appended) when it would fill the response budget."""
    delta, exact = delta_text(tokenizer, stream_text, messages, new, tools)
    delta_ids = encode(tokenizer, delta)
    if len(ep.response_ids) + len(delta_ids) >= limits.max_response_length:
        return None
    ep.prefix_mismatches += int(not exact)
    ep.append(delta_ids, None)
    return delta


def _tool_message(tokenizer: Any, r: ToolResult, limits: EpisodeLimits) -> dict[str, Any]:
    text = truncate_text(
        tokenizer, r.text, limits.max_tool_response_length, limits.tool_response_truncate_side
    )
    return {"role": "tool", "name": r.name, "content": text}


def _count_tools(ep: Episode, results: Sequence[ToolResult]) -> None:
    ep.tool_calls += len(results)
    for r in results:
        if r.is_error:
            ep.tool_errors += 1
            key = r.error_type or "unknown"
            ep.tool_error_types[key] = ep.tool_error_types.get(key, 0) + 1


async def _finish(
    ep: Episode, env: Env, tokenizer: Any, step: int, limits: EpisodeLimits
) -> Episode:
    if env.fatal_error:
        return env_failed(ep, env.fatal_error, limits)
    text = decode(tokenizer, ep.prompt_ids + ep.response_ids)
    transcript = Transcript(list(ep.messages), text, ep.stop_reason, ep.num_turns, step)
    try:
        r = await env.reward(transcript)
    except Exception as exc:  # a broken reward is the environment's failure, not the model's
        return env_failed(ep, f"reward raised {type(exc).__name__}: {exc}", limits)
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
            return env_failed(ep, f"{where} raised {type(exc).__name__}: {exc}", limits)
        finally:
            if env is not None:
                try:
                    await env.close()
                except Exception as exc:  # closing is best effort
                    log.warning("closing env for %s failed: %s", task.task_id, exc)
            progress.tick()  # one more episode finished (live progress, issue #20)

    jobs = []
    for t, task in enumerate(tasks):
        uid = uuid.uuid4().hex
        budget = NegativeBudget(rollback.max_negatives_per_group) if rollback else None
        conds = conditions[t * n : (t + 1) * n] if conditions is not None else [None] * n
        jobs.extend(one(task, uid, budget, c) for c in conds)
    return list(await asyncio.gather(*jobs))
