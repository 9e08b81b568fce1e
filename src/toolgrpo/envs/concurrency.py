"""A cap on how many environments of one task type are open at once (``max_concurrency``).

A server with a session limit (an OpenEnv server's ``max_concurrent_envs``, ``toolgrpo serve-env
--max-sessions``) or a machine that can start only so many tool servers is asked for no more
sessions than it holds: an episode first waits for one of the type's slots, then resets, and its
``close`` gives the slot back (also after a failure or a cancellation). The wait is a queue, not a
call that may hang: the episode loop awaits it before the reset (``slot_taker``), so the reset's
deadline (``multi_turn.env_call_timeout_s``) starts once the slot is held. The episode's budget of
environment time (``multi_turn.env_episode_timeout_s``) bounds the wait without being spent by it.
One process's cap: each Ray rollout worker has its own.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from toolgrpo.envs.base import Env, off_loop

_TAKER = "_toolgrpo_take_slot"  # set on a capped environment by ``hold_slot``


class EnvSlots:
    """``limit`` slots, counted per event loop (the trainer runs each step under a new one)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {limit}")
        self.limit = limit
        self._sems: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def __reduce__(self) -> tuple[type[EnvSlots], tuple[int]]:  # routers travel to Ray workers
        return (EnvSlots, (self.limit,))

    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._sems.get(loop)
        if sem is None:
            sem = self._sems[loop] = asyncio.Semaphore(self.limit)
        return sem


def hold_slot(env: Env, slots: EnvSlots) -> Env:
    """``env`` with a slot taken before its ``reset`` or ``openings_for`` (if ``slot_taker`` did
    not already) and given back after its ``close`` (also when reset never got one, or the
    episode failed or was cancelled); ``env`` itself, not a wrapper, so the episode loop sees its
    attributes as they are."""
    reset, close, openings = env.reset, env.close, env.openings_for
    held: list[asyncio.Semaphore] = []

    async def take() -> None:
        if not held:
            sem = slots.semaphore()
            await sem.acquire()  # cancelled while waiting: nothing is held
            held.append(sem)

    async def reset_in_slot() -> Any:
        await take()
        return await off_loop(reset)

    async def openings_in_slot(tasks: Any) -> Any:  # a remote one holds a server session too
        await take()
        return await openings(tasks)

    async def close_and_free() -> None:
        try:
            await off_loop(close)
        finally:
            while held:
                held.pop().release()

    env.reset = reset_in_slot  # type: ignore[method-assign]
    env.close = close_and_free  # type: ignore[method-assign]
    env.openings_for = openings_in_slot  # type: ignore[method-assign]
    setattr(env, _TAKER, take)
    return env


def slot_taker(env: Env) -> Callable[[], Awaitable[None]] | None:
    """What waits for ``env``'s slot, for the episode loop to await before the reset, so that
    queueing is not counted as the reset's call time; None when its task type has no cap."""
    return getattr(env, _TAKER, None)
