"""Rendering task messages into prompt token ids with the tokenizer's chat template."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from toolgrpo.config.loader import ConfigError
from toolgrpo.data.loader import DataError
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvStart
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rollout.env_calls import bounded, make_env
from toolgrpo.rollout.render import encode_prompt, with_tools

log = logging.getLogger(__name__)


class PromptTooLong(ValueError):
    """A prompt over ``data.max_prompt_length`` with ``data.truncation=error``."""


def render_prompt(
    tokenizer: Any,
    messages: Sequence[dict[str, str]],
    max_length: int,
    truncation: str = "left",
) -> list[int]:
    """Chat-templated prompt ids ending in the generation prompt; long prompts lose their left part
    (ToolRL/verl's behaviour) or raise, as configured."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # transformers 5 may return a BatchEncoding
        ids = list(ids["input_ids"])
    if len(ids) <= max_length:
        return ids
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "error":
        raise PromptTooLong(f"prompt has {len(ids)} tokens > data.max_prompt_length={max_length}")
    raise ValueError(f"data.truncation must be 'left' or 'error', got {truncation!r}")


# Rewrites an episode's opening (the router's routes); the trainer passes one per route.
Condition = Callable[[EnvStart], EnvStart]
_MEASURE_CONCURRENCY = 16  # environments reset at once while measuring (remote ones hold a session)
# A construction, reset (or close) that takes longer while measuring: the task is kept,
# unmeasured.
_MEASURE_TIMEOUT_S = 60.0


def opening_length(
    tokenizer: Any, start: EnvStart, conditions: Sequence[Condition] = (), env: bool = True
) -> int:
    """Tokens of the longest opening prompt the model can see for ``start``: each route's
    rewrite (or ``start`` itself without routes), rendered as the episode loop renders it
    (``with_tools`` + ``encode_prompt``), or as single-turn rollouts do (``env=False``)."""
    longest = 0
    for cond in conditions or (None,):
        s = cond(start) if cond is not None else start
        if env:
            messages, tools = with_tools(tokenizer, s.messages, s.tools)
            n = len(encode_prompt(tokenizer, messages, tools)[1])
        else:
            n = len(render_prompt(tokenizer, s.messages, 10**9))
        longest = max(longest, n)
    return longest


async def _env_start(
    envs: EnvRouter, task: Task, sem: asyncio.Semaphore, others: Sequence[Task] = ()
) -> tuple[list[EnvStart | None], bool]:
    """The environment's opening for ``task`` and for ``others`` of the same task type, and
    whether those are final. With ``others``, an environment that tells openings in one batch
    (``Env.openings_for``: remote ones) is asked for all of them (final: ``None`` where a task
    cannot open); else ``task``'s is reset and the others' derived where the environment can
    (``Env.opening_for``), ``None`` for those it cannot (the caller resets their own). ``None``
    where it cannot open (or build, within the deadline): that failure is reported when the
    episode is played, not here. The environment is always closed."""
    group = [task, *others]
    async with sem:
        env = None
        try:
            env = await make_env(envs, task, _MEASURE_TIMEOUT_S)  # in a thread, with a deadline
            if others:
                # A batch may take what resetting its tasks one by one could, at most.
                limit = _MEASURE_TIMEOUT_S * (1 + len(group) / _MEASURE_CONCURRENCY)
                got = await bounded(env.openings_for, (group,), limit, "openings_for")
                if got is not None:
                    ok = isinstance(got, list) and len(got) == len(group)
                    return (list(got) if ok else [None] * len(group)), True
            start = await bounded(env.reset, (), _MEASURE_TIMEOUT_S, "reset")
            if env.fatal_error:
                return [None] * len(group), False
            return [start, *(env.opening_for(t, start) for t in others)], False
        except Exception:  # a hung reset too (TimeoutError)
            return [None] * len(group), False
        finally:
            if env is not None:
                try:
                    await bounded(env.close, (), _MEASURE_TIMEOUT_S, "close")
                except Exception:
                    pass


async def _env_starts(envs: EnvRouter, tasks: Sequence[Task]) -> list[EnvStart | None]:
    """One environment reset per task type: the other tasks' openings are derived from it where
    the environment can (servers: same system prompt and tools), or all asked in one batch where
    it can (remote ones: one session for the type), else each task's own is reset (in-process
    environments, whose reset costs nothing). A type whose first environment cannot open is left
    unmeasured; so is a task its batch could not open."""
    sem = asyncio.Semaphore(_MEASURE_CONCURRENCY)
    by_type: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        by_type.setdefault(t.task_type, []).append(i)
    samples = await asyncio.gather(
        *(
            _env_start(envs, tasks[ix[0]], sem, [tasks[i] for i in ix[1:]])
            for ix in by_type.values()
        )
    )
    out: list[EnvStart | None] = [None] * len(tasks)
    rest: list[int] = []
    for ix, (got, final) in zip(by_type.values(), samples, strict=True):
        if got[0] is None and not final:
            continue
        for i, start in zip(ix, got, strict=True):
            out[i] = start
            if start is None and not final:
                rest.append(i)
    own = await asyncio.gather(*(_env_start(envs, tasks[i], sem) for i in rest))
    for i, ((start,), _) in zip(rest, own, strict=True):
        out[i] = start
    return out


def env_starts(envs: EnvRouter, tasks: Sequence[Task]) -> list[EnvStart | None]:
    """Each task's environment opening (``None`` where it cannot open), opened concurrently."""
    return asyncio.run(_env_starts(envs, tasks))


def route_lengths(
    tokenizer: Any,
    tasks: Sequence[Task],
    envs: EnvRouter | None = None,
    conditions: Sequence[Condition] = (),
) -> list[list[int] | None]:
    """Per task, the opening's length under each condition (one length without conditions),
    measured as ``filter_overlong`` measures; ``None`` where the environment cannot open."""
    if envs is not None:
        starts = env_starts(envs, tasks)
    else:
        starts = [EnvStart([dict(m) for m in t.messages], []) for t in tasks]
    return [
        None
        if start is None
        else [opening_length(tokenizer, start, [c], env=envs is not None) for c in conditions]
        or [opening_length(tokenizer, start, (), env=envs is not None)]
        for start in starts
    ]


def split_routes(
    tasks: Sequence[Task], lengths: Sequence[list[int] | None], max_length: int
) -> list[int]:
    """Indices of the tasks some of whose routes fit ``max_length`` while others do not: played
    as they are, one route would be cut (or stopped as ``prompt_too_long``) and the others not."""
    return [
        i for i, got in enumerate(lengths) if got is not None and min(got) <= max_length < max(got)
    ]


def refuse_split_routes(
    tokenizer: Any,
    tasks: Sequence[Task],
    max_length: int,
    envs: EnvRouter | None,
    conditions: Sequence[Condition],
) -> None:
    """With the router on and ``data.filter_overlong_prompts=false``: refuse (one line) tasks
    that some routes would cut and others not. A route whose prompt is cut or stopped for length
    where another route of the same task is not loses for its length, not its choice."""
    if not conditions:
        return
    lengths = route_lengths(tokenizer, tasks, envs, conditions)
    split = split_routes(tasks, lengths, max_length)
    if split:
        i = split[0]
        got = lengths[i] or []
        raise ConfigError(
            f"{len(split)} task(s) fit data.max_prompt_length={max_length} under some router "
            f"routes but not others (e.g. {tasks[i].task_id}: {min(got)} to {max(got)} tokens): "
            "set data.filter_overlong_prompts=true to drop them, or raise data.max_prompt_length"
        )


def filter_overlong(
    tokenizer: Any,
    tasks: Sequence[Task],
    max_length: int,
    envs: EnvRouter | None = None,
    conditions: Sequence[Condition] = (),
) -> list[Task]:
    """Tasks whose opening prompt fits ``max_length`` (verl's ``filter_overlong_prompts``),
    measured on what the model sees: with ``envs`` (multi-turn), the environment's own opening
    (its system prompt and tool specs, from a reset that is closed at once: one per task type
    where the environment derives the others, ``Env.opening_for``, or one batch per task type
    where it tells them all, ``Env.openings_for``); with
    ``conditions`` (the router's routes), the longest route's rewrite. A task whose environment
    cannot open is kept: it fails as an environment error when played."""
    kept: list[Task] = []
    dropped: Counter[str] = Counter()
    unmeasured: Counter[str] = Counter()
    lengths = route_lengths(tokenizer, tasks, envs, conditions)
    for task, got in zip(tasks, lengths, strict=True):
        if got is None:
            unmeasured[task.task_type] += 1
            kept.append(task)
        elif max(got) <= max_length:
            kept.append(task)
        else:
            dropped[task.task_type] += 1
    if unmeasured:
        log.warning(
            "kept %d tasks unmeasured for data.max_prompt_length: their environment failed to "
            "open (%s)",
            sum(unmeasured.values()),
            _per_type(unmeasured),
        )
    if not kept:
        raise DataError(f"every prompt exceeds data.max_prompt_length={max_length}")
    if dropped:
        log.warning(
            "dropped %d of %d prompts over %d tokens (%s)%s",
            sum(dropped.values()),
            len(tasks),
            max_length,
            _per_type(dropped),
            ", longest route measured" if conditions else "",
        )
    return kept


def _per_type(counts: Counter[str]) -> str:
    return ", ".join(f"{t}: {n}" for t, n in sorted(counts.items()))
