"""``serve-env``'s ``openings`` op: many tasks' opening messages and tools in one request.

A trainer measures every task's opening prompt at startup (``data.filter_overlong_prompts``);
asking for each over its own session (a handshake and a ``reset`` per task) costs 10,000
sessions for 10,000 tasks. Here the server builds its environment in-process for each task, resets
it and closes it at once; where the environment can tell another task's opening from its own
(``Env.opening_for``), one reset gives them all.

What one request may cost the server is bounded: at most ``MAX_TASKS`` tasks, ``CONCURRENCY``
resets at once, the client's deadline (``timeout_s``, at most ``MAX_TIMEOUT_S``) and its reply
size (``max_bytes``). The reply's ``openings`` are those of the request's first tasks, in order,
every one settled (an opening or an error entry); the client asks again for the rest. A reset
still running at the deadline is cancelled and its task left for the next request, except the
first task's, which then gets an error entry, so each request settles at least one task.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvStart, off_loop
from toolgrpo.envs.wire import WireError, start_to_dict, task_from_dict

log = logging.getLogger(__name__)

MAX_TASKS = 1024  # tasks in one request (the client sends 256)
CONCURRENCY = 8  # resets in flight at once for one request
MAX_TIMEOUT_S = 3600.0
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_CLOSE_TIMEOUT_S = 5.0
_ENTRY_OVERHEAD = 64  # bytes around the entries: '{"op": "openings", "openings": [...]}'

Entry = dict[str, Any]  # {"op": "start", "messages", "tools"} or {"op": "error", "message"}


def _error(message: str) -> Entry:
    return {"op": "error", "message": message}


def _number(msg: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = msg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise WireError(f"openings: field {key!r} must be a positive number")
    return min(max(float(value), low), high)


async def _close(env: Env) -> None:
    """Bounded: an environment that hangs in ``close`` must not hold the reply."""
    task = asyncio.ensure_future(off_loop(env.close))
    done, _ = await asyncio.wait({task}, timeout=_CLOSE_TIMEOUT_S)
    if not done:
        task.cancel()
    elif not task.cancelled() and task.exception() is not None:
        log.warning("env failed to close after its opening: %r", task.exception())


async def _opening(
    make: Callable[[Task], Env], task: Task, others: list[tuple[int, Task]]
) -> tuple[Entry, dict[int, Entry]]:
    """``task``'s opening from a reset, and those of ``others`` its environment can derive."""
    env = None
    try:
        env = make(task)
        start = await off_loop(env.reset)
        if not isinstance(start, EnvStart):
            return _error(f"reset returned {type(start).__name__}, not EnvStart"), {}
        if getattr(env, "fatal_error", None):
            return _error(f"environment failed at reset: {env.fatal_error}"), {}
        derived: dict[int, Entry] = {}
        for i, other in others:
            try:
                got = env.opening_for(other, start)
            except Exception:  # that task is reset on its own instead
                log.exception("opening_for failed; resetting the task on its own")
                break
            if got is not None:
                derived[i] = {"op": "start", **start_to_dict(got)}
        return {"op": "start", **start_to_dict(start)}, derived
    except Exception as e:  # the env's failure is this task's error entry, not the request's
        return _error(f"reset failed: {type(e).__name__}: {e}"), {}
    finally:
        if env is not None:
            await _close(env)


def _tasks(raw: Any) -> list[Task | str]:
    """The request's tasks; a task that cannot be decoded is its own error (a message)."""
    if not isinstance(raw, list):
        raise WireError("openings: field 'tasks' must be a list")
    if len(raw) > MAX_TASKS:
        raise WireError(f"openings: at most {MAX_TASKS} tasks a request, got {len(raw)}")
    out: list[Task | str] = []
    for d in raw:
        try:
            out.append(task_from_dict(d))
        except (WireError, TypeError, ValueError, AttributeError) as e:
            out.append(f"bad task: {e}")
    return out


async def openings_reply(make: Callable[[Task], Env], msg: Mapping[str, Any]) -> dict[str, Any]:
    """The reply to an ``openings`` request (see the module's docstring)."""
    tasks = _tasks(msg.get("tasks"))
    timeout_s = _number(msg, "timeout_s", DEFAULT_TIMEOUT_S, 1.0, MAX_TIMEOUT_S)
    max_bytes = int(_number(msg, "max_bytes", DEFAULT_MAX_BYTES, 4096, DEFAULT_MAX_BYTES))
    deadline = time.monotonic() + timeout_s
    settled: dict[int, Entry] = {i: _error(t) for i, t in enumerate(tasks) if isinstance(t, str)}
    todo = [(i, t) for i, t in enumerate(tasks) if isinstance(t, Task)]
    if todo:  # one reset, and every opening its environment derives from it
        (i0, first), rest = todo[0], todo[1:]
        seed = asyncio.ensure_future(_opening(make, first, rest))
        if await _within(seed, deadline):
            settled[i0], derived = seed.result()
            settled.update(derived)
        todo = [(i, t) for i, t in todo if i not in settled]
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(task: Task) -> Entry:
        async with sem:
            return (await _opening(make, task, []))[0]

    running = {i: asyncio.ensure_future(one(t)) for i, t in todo if time.monotonic() < deadline}
    if running:
        await asyncio.wait(running.values(), timeout=max(deadline - time.monotonic(), 0.0))
    for i, fut in running.items():
        if fut.done():
            settled[i] = fut.result()
        else:  # cancelled: its ``finally`` closes the environment
            fut.cancel()
    if tasks and 0 not in settled:
        settled[0] = _error(f"reset did not return within {timeout_s:g}s")
    return {"op": "openings", "openings": _prefix(settled, len(tasks), max_bytes)}


async def _within(fut: asyncio.Future[Any], deadline: float) -> bool:
    done, _ = await asyncio.wait({fut}, timeout=max(deadline - time.monotonic(), 0.0))
    if not done:
        fut.cancel()
    return bool(done)


def _prefix(settled: dict[int, Entry], n: int, max_bytes: int) -> list[Entry]:
    """The settled entries of the first tasks, in order, that fit in ``max_bytes``; a first
    entry too large on its own becomes an error entry."""
    out: list[Entry] = []
    size = _ENTRY_OVERHEAD
    for i in range(n):
        if i not in settled:
            break
        entry = settled[i]
        try:
            nbytes = len(json.dumps(entry, default=str).encode()) + 2
        except (RecursionError, TypeError, ValueError) as e:
            entry, nbytes = _error(f"the opening could not be encoded: {type(e).__name__}"), 128
        if size + nbytes > max_bytes:
            if not out:
                out.append(_error(f"the opening ({nbytes} bytes) is over the reply limit"))
            break
        out.append(entry)
        size += nbytes
    return out
