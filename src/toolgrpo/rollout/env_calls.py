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
method that blocks the event loop itself cannot be interrupted by anything, but it is caught: each
stretch a call's coroutines run without yielding is timed (``_Stretches``), and a stretch longer
than the call's deadline fails the call (``EnvDeadline`` saying it blocked the loop) once it
returns, while one over ``STALL_WARN_S`` is logged. Blocking work belongs in a sync method or
``asyncio.to_thread``. The environment's constructor (``make_env``) runs in a thread under the
call deadline; one that returns late has its environment closed there.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

from toolgrpo.tools.schema import in_thread
from toolgrpo.tools.types import ToolResult

if TYPE_CHECKING:
    from toolgrpo.data.task import Task
    from toolgrpo.envs.base import Env
    from toolgrpo.envs.registry import EnvRouter

log = logging.getLogger(__name__)
_KEY = "actor_rollout_ref.rollout.multi_turn."
STARTUP_TIMEOUT_S = 60.0  # each call of a startup check (construction, reset, close)
STALL_WARN_S = 1.0  # an environment coroutine that holds the event loop this long is logged
_WARNED: set[str] = set()


class _Stretches:
    """The longest stretch the coroutines of one environment call ran without yielding to the
    event loop (nested calls and the tasks they start share it, through a context variable)."""

    def __init__(self) -> None:
        self.longest = 0.0


_STRETCHES: contextvars.ContextVar[_Stretches | None] = contextvars.ContextVar(
    "toolgrpo_env_stretches", default=None
)


class _Timed:
    """Awaits ``coro`` step by step as a task would, timing each step into ``stretches``."""

    def __init__(self, coro: Any, stretches: _Stretches) -> None:
        self.coro, self.stretches = coro, stretches

    def __await__(self) -> Generator[Any, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = time.perf_counter()
            try:
                if error is None:
                    yielded = self.coro.send(value)
                else:
                    yielded = self.coro.throw(error)
            except StopIteration as stop:
                self._note(t0)
                return stop.value
            except BaseException:
                self._note(t0)
                raise
            self._note(t0)
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # cancellation and the like go to the coroutine
                value, error = None, exc

    def _note(self, t0: float) -> None:
        self.stretches.longest = max(self.stretches.longest, time.perf_counter() - t0)


async def _timed(coro: Any) -> Any:
    stretches = _STRETCHES.get()
    if stretches is None or not inspect.iscoroutine(coro):
        return await coro
    return await _Timed(coro, stretches)


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
        stretches = _Stretches()
        token = _STRETCHES.set(stretches)
        try:
            value = await bounded(fn, args, limit, what)
        except CallTimeout:
            _blocked(what, stretches, limit, reason)
            if reason.endswith("env_episode_timeout_s"):
                raise EnvDeadline(
                    f"{what} did not return before the episode's {self.episode_timeout_s:g}s of "
                    f"environment time ran out ({reason})"
                ) from None
            raise EnvDeadline(f"{what} did not return within {limit:g}s ({reason})") from None
        finally:
            _STRETCHES.reset(token)
            self.spent_s += time.perf_counter() - t0
        _blocked(what, stretches, limit, reason)
        return value


def _blocked(what: str, stretches: _Stretches, limit: float | None, reason: str) -> None:
    """An environment coroutine that held the event loop past the call's deadline fails the
    call (nothing could interrupt it, and every other episode stood still meanwhile); a
    shorter stall over ``STALL_WARN_S`` is logged once per method."""
    took = stretches.longest
    if limit is not None and took > limit:
        raise EnvDeadline(
            f"{what} blocked the event loop for {took:.1f}s, past its {limit:g}s deadline "
            f"({reason}): an async environment method must not block (make it a plain def, "
            "which runs in a thread, or use asyncio.to_thread)"
        )
    if took > STALL_WARN_S and what not in _WARNED:
        _WARNED.add(what)
        log.warning(
            "environment %s blocked the event loop for %.1fs (every episode waited): an async "
            "environment method must not block; make it a plain def or use asyncio.to_thread",
            what,
            took,
        )


async def bounded(
    fn: Callable[..., Any], args: Sequence[Any], limit: float | None, name: str = ""
) -> Any:
    """``fn(*args)`` awaited at most ``limit`` seconds (None: no limit), else ``CallTimeout``;
    a sync ``fn`` runs in a daemon thread (abandoned at the limit, not stopped)."""
    deadline = None if limit is None else time.monotonic() + limit
    if inspect.iscoroutinefunction(fn):
        value = await _wait(_timed(fn(*args)), deadline)
    else:
        value = await _wait(in_thread(functools.partial(fn, *args), {}, name), deadline)
    if inspect.isawaitable(value):  # a sync wrapper that hands back a coroutine
        value = await _wait(_timed(value), deadline)
    return value


async def make_env(router: EnvRouter, task: Task, limit: float | None) -> Env:
    """``router.make(task)`` in a thread of its own within ``limit`` seconds (None: no limit),
    else ``EnvDeadline``: a constructor that hangs (a server that never answers, an import that
    waits on a lock) fails its episode, not the step. One that returns after the deadline has
    its environment closed in that thread, since nobody else will."""
    late = threading.Event()

    def build() -> Env:
        env = router.make(task)
        if late.is_set():
            _close_late(env)
        return env

    try:
        return await bounded(build, (), limit, "construction")
    except CallTimeout:
        late.set()
        raise EnvDeadline(
            f"construction did not return within {limit:g}s ({_KEY}env_call_timeout_s)"
        ) from None


async def startup_probe(
    router: EnvRouter,
    task: Task,
    fn: Callable[[Env], Awaitable[Any]] | None,
    limit: float | None = STARTUP_TIMEOUT_S,
) -> tuple[Env, Any]:
    """A startup check's look at ``task``'s environment: built, ``fn(env)`` awaited (each within
    ``limit``), then closed (within ``limit``; a close that fails is logged). Returns the
    environment (closed: for its attributes) and ``fn``'s value."""
    env = await make_env(router, task, limit)
    try:
        return env, (None if fn is None else await bounded(fn, (env,), limit, "startup"))
    finally:
        try:
            await bounded(env.close, (), limit, "close")
        except Exception as exc:  # closing is best effort
            log.warning("closing the startup environment of %s failed: %r", task.task_id, exc)


def _close_late(env: Env) -> None:
    try:
        asyncio.run(asyncio.wait_for(_close(env), 60.0))
    except Exception as exc:  # best effort: nobody is waiting for this environment
        log.warning("closing a late environment failed: %r", exc)


async def _close(env: Env) -> None:
    value = env.close()
    if inspect.isawaitable(value):
        await value


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
