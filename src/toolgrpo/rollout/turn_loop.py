"""One episode's turns: generate, hand the turn to the environment (parsed calls, the text to a
text environment, or a request for the next user turn), append what comes back, repeat.

``run_turns`` plays from any point: an opening prompt (``multi_turn.play_task``) or a fission
fork point (``multi_turn``'s continuations). The last delta carries no generation prompt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolgrpo.envs.base import Env, EnvStart, TextStep
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.env_calls import EnvClock, failure_reason, timeout_failure
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.fission import ForkRecorder
from toolgrpo.rollout.limits import EpisodeLimits
from toolgrpo.rollout.render import decode
from toolgrpo.rollout.rollback import TurnGuard
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

# Rewrites an episode's opening messages and tools (e.g. the router's route, toolgrpo.router).
# A condition may also have ``refuse(call) -> str | None``: a call it refuses (a tool its
# opening no longer offers) comes back as that error message, never reaching the environment.
Condition = Callable[[EnvStart], EnvStart]
Stop = tuple[str, bool]  # (stop reason, truncated)


@dataclass
class TurnState:
    """What the turn loop carries for one episode."""

    ep: Episode
    env: Env
    clock: EnvClock
    messages: list[dict[str, Any]]  # the episode's own list (``ep.messages``)
    tools: list[dict[str, Any]] | None  # the ``tools=`` the prompt was rendered with
    stream_text: str  # the episode's tokens so far, decoded
    spent: int = 0  # response tokens before this episode's own (a fission fork's parent's)
    guard: TurnGuard | None = None
    recorder: ForkRecorder | None = None
    condition: Condition | None = None


async def run_turns(
    run: TurnState, batcher: GenerationBatcher, tokenizer: Any, limits: EpisodeLimits
) -> None:
    """Turns until the episode stops; ``ep.stop_reason`` and ``truncated`` say why."""
    ep, env, clock, guard, messages = run.ep, run.env, run.clock, run.guard, run.messages
    eos = {tokenizer.eos_token_id} | set(getattr(batcher.generator, "eos_ids", []) or [])
    while True:
        room = limits.max_response_length - run.spent - len(ep.response_ids)
        if room <= 0:
            ep.stop_reason, ep.truncated = "context", True
            return
        if guard is not None:
            await clock.call("snapshot", guard.begin_turn, ep, env, run.stream_text)
            if env.fatal_error:  # a remote snapshot or restore failed
                ep.stop_reason = "env_error"
                return
        comp = await batcher.generate(
            ep.prompt_ids + ep.response_ids, min(limits.max_tokens_per_turn, room)
        )
        ep.append(comp.token_ids, comp.logprobs)
        ep.num_turns += 1
        run.stream_text += decode(tokenizer, comp.token_ids)
        body = (
            comp.token_ids[:-1] if comp.token_ids and comp.token_ids[-1] in eos else comp.token_ids
        )
        text = decode(tokenizer, body)
        cut = comp.finish_reason == "length"  # complete calls before the cap still run
        parses = not (env.single_turn or env.owns_turn)
        calls = turn_calls(text, cut, limits.tool_format) if parses else []
        turn = assistant_message(text, calls, messages)
        messages.append(turn)
        last_turn = ep.num_turns >= env.max_turns
        stop: Stop | None
        if cut and not calls:
            stop, new = ("length", True), []
        elif env.single_turn:
            stop, new = ("answer", False), []
        elif env.owns_turn:
            stop, new = await _text_step(run, text, last_turn)
        elif not calls:
            stop, new = await _user_turn(run, last_turn)
        else:
            outcome = await _tool_step(run, calls, turn, tokenizer, limits, last_turn)
            if outcome is None:  # rolled back to before this turn: sample it again
                continue
            stop, new = outcome
        if stop is not None:
            ep.stop_reason, ep.truncated = stop
            if new and ep.stop_reason != "env_error":
                # The environment's last messages join the transcript the reward sees (tokens
                # if they fit), with no generation prompt after them: no turn follows.
                append_delta(ep, tokenizer, run.stream_text, messages, new, run.tools, limits,
                             final=True, spent=run.spent)  # fmt: skip
                messages.extend(new)
            return
        delta = append_delta(ep, tokenizer, run.stream_text, messages, new, run.tools, limits,
                             spent=run.spent)  # fmt: skip
        if delta is None:
            ep.stop_reason, ep.truncated = "context", True
            return
        run.stream_text += delta
        messages.extend(new)
        if run.recorder is not None:
            run.recorder.after_delta(ep, run.stream_text, messages)


async def _text_step(run: TurnState, text: str, last_turn: bool) -> tuple[Stop | None, list[Any]]:
    """A text environment's turn (``TextEnv``): it reads the action itself."""
    ep, env = run.ep, run.env
    t0 = time.perf_counter()
    try:
        out = await run.clock.call("step", env.step, text)
        if not isinstance(out, TextStep):
            raise TypeError(f"a TextEnv's step must return a TextStep, got {type(out).__name__}")
    except Exception as exc:  # the contract says step never raises; hold it to that
        env.fatal_error = failure_reason("step", exc)
        return ("env_error", False), []
    finally:
        ep.tool_seconds += time.perf_counter() - t0
    ep.step_rewards.append(float(out.reward))
    new = [dict(m) for m in out.observations]
    if out.done:
        return ("done", False), new
    if not new:
        return ("answer", False), []
    return (("max_turns", True) if last_turn else None), new


async def _user_turn(run: TurnState, last_turn: bool) -> tuple[Stop | None, list[Any]]:
    """An answer without calls: the environment's next user turn, or the end."""
    env = run.env
    try:
        more = await run.clock.call("next_user_turn", env.next_user_turn, list(run.messages))
    except Exception as exc:
        env.fatal_error = failure_reason("next_user_turn", exc)
        return ("env_error", False), []
    if not more:
        return ("answer", False), []  # a final answer
    if last_turn:  # the dialogue goes on, but this episode has no turn left for it
        return ("max_turns", True), []
    return None, list(more)


async def _tool_step(
    run: TurnState,
    calls: list[Any],
    turn: dict[str, Any],
    tokenizer: Any,
    limits: EpisodeLimits,
    last_turn: bool,
) -> tuple[Stop | None, list[Any]] | None:
    """Run a turn's calls; ``None`` when rollback undid the turn (it is sampled again)."""
    ep, env, clock = run.ep, run.env, run.clock
    t0 = time.perf_counter()
    refuse = getattr(run.condition, "refuse", None)
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
        return ("env_error", False), []
    ep.step_rewards.append(sum(float(r.reward) for r in results))
    if run.guard is not None:
        resume = await clock.call("restore", run.guard.after_tools, ep, env, calls, results)
        if resume is not None:
            run.stream_text = resume
            return None
    done = any(r.done for r in results)
    if run.recorder is not None:  # a failure another turn follows is a fork point
        forkable = not (done or last_turn)
        await clock.call("snapshot", run.recorder.after_tools, ep, env, results, forkable)
        if env.fatal_error:
            return ("env_error", False), []
    ids = result_call_ids(turn.get("tool_calls") or [], calls, results)
    new = [tool_message(tokenizer, r, limits, i) for r, i in zip(results, ids, strict=True)]
    if done:
        return ("done", False), new  # the environment ended the episode
    if last_turn:  # the calls ran, but the model still had work under way
        return ("max_turns", True), new
    return None, new
