"""Deadlines on an episode's environment calls, and the one rule for timeouts.

Every call the episode loop makes into its environment (``reset``, ``step``, ``next_user_turn``,
``reward``, rollback's snapshot/restore, ``close``) gets a deadline: the call's own
(``multi_turn.env_call_timeout_s``) or what is left of the episode's budget of environment time
(``multi_turn.env_episode_timeout_s``; generation does not count: a slow backend is not the
environment's failure), whichever comes first. A call past it raises ``EnvDeadline``, which the
loop turns into an environment failure; the other episodes of the step go on. Waiting in a queue
(a ``max_concurrency`` slot, ``EnvClock.wait``) is not a call: it is bounded by the episode's
budget but does not spend it, so the reset's call deadline, and the episode's budget for its
calls, start once the slot is held.

A coroutine method is awaited until the deadline, then cancelled and abandoned. A plain (sync)
method runs in a daemon thread of its own, not on the event loop, so a blocking one (a simulator
stuck in a loop, ``time.sleep``) cannot hold the step: at the deadline nobody waits for it, but
Python cannot stop a thread, so it may linger until it returns or the process exits. An ``async``
method that blocks the event loop itself cannot be interrupted by anything: blocking work belongs
in a sync method or ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from toolgrpo.tools.schema import in_thread
from toolgrpo.tools.types import ToolResult

_KEY = "actor_rollout_ref.rollout.multi_turn."


class EnvDeadline(Exception):
    """An environment call did not return in time; ``str()`` is the one-line reason."""


class CallTimeout(TimeoutError):
    """``bounded``'s own limit passed (not a ``TimeoutError`` the call raised itself)."""


class EnvClock:
    """One episode's deadlines: ``call_timeout_s`` per call, ``episode_timeout_s`` for the sum of
    its calls (0 or None = no limit)."""

    def __init__(self, call_timeout_s: float | None, episode_timeout_s: float | None) -> None:
        self.call_timeout_s = call_timeout_s or None
        self.episode_timeout_s = episode_timeout_s or None
        self.spent_s = 0.0  # wall time inside environment calls so far
        self.waited_s = 0.0  # queued (``wait``) before the calls, not counted in ``spent_s``

    async def wait(self, why: str, fn: Callable[[], Awaitable[Any]]) -> float:
        """Await ``fn()``, a queue rather than a call that may hang (a ``max_concurrency`` slot):
        no call deadline, bounded by the episode's budget without spending it (queueing is not
        the environment's time). Returns the seconds waited; past the budget, ``EnvDeadline``
        saying ``why``."""
        left = None
        if self.episode_timeout_s is not None:
            left = max(self.episode_timeout_s - self.spent_s, 0.0)
        t0 = time.perf_counter()
        try:  # wait_for, not bounded: the wait is over (cancelled) when this returns
            await asyncio.wait_for(fn(), left)
        except TimeoutError:
            raise EnvDeadline(
                f"{why} until the episode's {self.episode_timeout_s:g}s of environment time "
                f"ran out ({_KEY}env_episode_timeout_s)"
            ) from None
        finally:
            waited = time.perf_counter() - t0
            self.waited_s += waited
        return waited

    async def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (a coroutine function or a sync one) within the deadline, or
        ``EnvDeadline``; whatever ``fn`` raises propagates."""
        limit, reason = self.call_timeout_s, f"{_KEY}env_call_timeout_s"
        if self.episode_timeout_s is not None:
            left = self.episode_timeout_s - self.spent_s
            if limit is None or left < limit:
                limit, reason = max(left, 0.0), f"{_KEY}env_episode_timeout_s"
        t0 = time.perf_counter()
        try:
            return await bounded(fn, args, limit, what)
        except CallTimeout:
            if reason.endswith("env_episode_timeout_s"):
                raise EnvDeadline(
                    f"{what} did not return before the episode's {self.episode_timeout_s:g}s of "
                    f"environment time ran out ({reason})"
                ) from None
            raise EnvDeadline(f"{what} did not return within {limit:g}s ({reason})") from None
        finally:
            self.spent_s += time.perf_counter() - t0


async def bounded(
    fn: Callable[..., Any], args: Sequence[Any], limit: float | None, name: str = ""
) -> Any:
    """``fn(*args)`` awaited at most ``limit`` seconds (None: no limit), else ``CallTimeout``;
    a sync ``fn`` runs in a daemon thread (abandoned at the limit, not stopped)."""
    deadline = None if limit is None else time.monotonic() + limit
    if inspect.iscoroutinefunction(fn):
        value = await _wait(fn(*args), deadline)
    else:
        value = await _wait(in_thread(functools.partial(fn, *args), {}, name), deadline)
    if inspect.isawaitable(value):  # a sync wrapper that hands back a coroutine
        value = await _wait(value, deadline)
    return value


async def _wait(awaitable: Any, deadline: float | None) -> Any:
    """Not ``asyncio.wait_for``: that waits for the cancelled call to finish, which a call that
    swallows its cancellation never does. Here the call is cancelled and left behind."""
    task = asyncio.ensure_future(awaitable)
    timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:  # the episode itself was cancelled: take the call with it
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise CallTimeout
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Read an abandoned call's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


def failure_reason(what: str, exc: BaseException) -> str:
    """The one-line reason an environment call failed: a deadline says so itself."""
    if isinstance(exc, EnvDeadline):
        return str(exc)
    return f"{what} raised {type(exc).__name__}: {exc}"


def timeout_failure(results: Sequence[ToolResult]) -> str | None:
    """The one timeout rule, for every environment type: a tool call that timed out (a
    ``timeout`` result, however the environment reports it: a thread tool, an isolated worker,
    MCP, OpenEnv, BFCL, a remote server) is the environment's failure, never the model's error.
    Returns the reason, or None when no call timed out."""
    late = next((r for r in results if r.is_error and r.error_type == "timeout"), None)
    if late is None:
        return None
    detail = (late.text.splitlines() or [""])[0].removeprefix("Error: ").strip()[:160]
    return f"tool call timed out ({detail or repr(late.name or 'a tool')})"
