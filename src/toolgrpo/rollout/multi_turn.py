"""The episode loop: generate, run the tools the model called, append their results, repeat.

``play_task`` plays one episode; ``play_tasks`` plays G episodes per task concurrently (one
asyncio task each) with their generation requests batched by a ``GenerationBatcher``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
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
from toolgrpo.tools.types import ToolResult

log = logging.getLogger(__name__)

# Rewrites an episode's opening messages and tools (e.g. the router's route, toolgrpo.router).
Condition = Callable[[EnvStart], EnvStart]


@dataclass(frozen=True)
class EpisodeLimits:
    max_prompt_length: int = 1024  # the opening prompt
    max_response_length: int = 512  # all turns after the prompt, tool results included
    max_tokens_per_turn: int = 256  # one assistant turn
    max_tool_response_length: int = 256  # tokens of one tool result (0 = no limit)
    tool_response_truncate_side: str = "middle"  # right | left | middle
    error_reward: float = -1.0  # an episode whose environment failed (e.g. its server died)


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
    ``budget`` caps the negatives its GRPO group keeps."""
    start = await env.reset()
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
        if not calls:
            more = await env.next_user_turn(list(messages))
            if not more:
                break  # a final answer
            new = list(more)
        else:
            if ep.num_turns >= env.max_turns:
                ep.stop_reason = "max_turns"
                break
            try:
                results = await env.step(calls)
            except Exception as exc:  # the contract says step never raises; hold it to that
                log.warning("%s.step raised %s: %s", type(env).__name__, type(exc).__name__, exc)
                env.fatal_error = f"{type(exc).__name__}: {exc}"
                results = []
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
        if ep.num_turns >= env.max_turns:
            ep.stop_reason = "max_turns"
            break
        delta, exact = delta_text(tokenizer, stream_text, messages, new, tools)
        ep.prefix_mismatches += int(not exact)
        delta_ids = encode(tokenizer, delta)
        if len(ep.response_ids) + len(delta_ids) >= limits.max_response_length:
            ep.stop_reason, ep.truncated = "context", True
            break
        ep.append(delta_ids, None)
        stream_text += delta
        messages.extend(new)
    if guard is not None:
        guard.finish(ep)
    return await _finish(ep, env, tokenizer, step, limits)


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
        ep.stop_reason = "env_error"
        ep.reward, ep.reward_parts = limits.error_reward, {"env_error": 1.0}
        return ep
    text = decode(tokenizer, ep.prompt_ids + ep.response_ids)
    transcript = Transcript(list(ep.messages), text, ep.stop_reason, ep.num_turns, step)
    try:
        r = await env.reward(transcript)
    except Exception as exc:  # a broken reward must not end the run; it is counted
        log.warning("reward failed for %s: %s: %s", ep.task_id, type(exc).__name__, exc)
        r = EnvReward(limits.error_reward, {"env_error": 1.0})
    if env.fatal_error:
        r = EnvReward(limits.error_reward, {"env_error": 1.0})
        ep.stop_reason = "env_error"
    ep.reward, ep.reward_parts = float(r.score), dict(r.parts)
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
        env = router.make(task)
        try:
            if sem is None:
                return await _guarded(task, env, uid, budget, cond)
            async with sem:
                return await _guarded(task, env, uid, budget, cond)
        finally:
            try:
                await env.close()
            except Exception as exc:  # closing is best effort
                log.warning("closing env for %s failed: %s", task.task_id, exc)

    async def _guarded(
        task: Task, env: Env, uid: str, budget: NegativeBudget | None, cond: Condition | None
    ) -> Episode:
        try:
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
            log.warning("episode of %s failed: %s: %s", task.task_id, type(exc).__name__, exc)
            ep = Episode(task.task_id, task.task_type, uid, [], stop_reason="env_error")
            ep.reward, ep.reward_parts = limits.error_reward, {"env_error": 1.0}
            ep.policy_version = policy_version
            return ep

    jobs = []
    for t, task in enumerate(tasks):
        uid = uuid.uuid4().hex
        budget = NegativeBudget(rollback.max_negatives_per_group) if rollback else None
        conds = conditions[t * n : (t + 1) * n] if conditions is not None else [None] * n
        jobs.extend(one(task, uid, budget, c) for c in conds)
    return list(await asyncio.gather(*jobs))
