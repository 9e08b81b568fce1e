"""MCP sessions that outlive an episode: a pool per server configuration, on a loop of its own.

Starting a stdio MCP server costs seconds (a Python interpreter and the SDK's imports); a tool call
costs milliseconds. So a stdio server that can be reset (it offers the tool named by the
``reset_tool`` option) is kept after its episode and reused by the next one, reset first; a server
that cannot be reset, or one whose episode failed in the environment (a dead process, a call past
its deadline, a broken session), is stopped, never handed on. Every episode still sees a server
in the state its reset leaves.

The trainer plays each step under a fresh ``asyncio.run``, and an MCP session belongs to the loop
that opened it, so every session lives on one background loop (a daemon thread) and episodes
reach it through ``on_pool_loop``. ``close_env_pools`` stops every pooled server (also at exit).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
_CLOSE_TIMEOUT_S = 10.0


class _LoopThread:
    """An event loop running forever in a daemon thread (one per process; a fork makes anew)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="toolgrpo-env-pool", daemon=True
        )
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


_LOOP: _LoopThread | None = None
_LOCK = threading.Lock()


def _loop_thread() -> _LoopThread:
    global _LOOP, _POOLS
    with _LOCK:
        if _LOOP is None or _LOOP.pid != os.getpid():
            _LOOP, _POOLS = _LoopThread(), {}  # a forked child cannot use its parent's servers
            _STARTS.clear()
        return _LOOP


async def on_pool_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` run on the pool's loop, from any loop; cancelling the caller cancels it."""
    return await asyncio.wrap_future(_loop_thread().submit(coro))


@dataclass(frozen=True)
class ServerKey:
    """What makes two episodes' servers interchangeable."""

    server: Any  # a URL, or the stdio command line with its environment (hashable forms)
    env: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 30.0
    reset_tool: str = ""  # "" = never reused


class MCPSession:
    """One MCP client session, opened and closed by a task of its own on the pool's loop (the SDK
    requires both in one task); calls may come from any task of that loop."""

    def __init__(self, key: ServerKey, params: Any) -> None:
        self.key, self.params = key, params
        self.tools: list[Any] = []
        self.client: Any = None
        self.resettable = False
        self.episodes = 0  # episodes served (tests and metrics)
        self._stop = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None

    async def open(self, connect_timeout_s: float) -> None:
        from mcp import Client

        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def own() -> None:
            try:
                client = Client(self.params, read_timeout_seconds=self.key.timeout_s)
                async with client as opened:
                    self.client = opened
                    self.tools = list((await opened.list_tools()).tools)
                    ready.set_result(None)
                    await self._stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
                if not isinstance(exc, Exception):
                    raise
            finally:
                self.client = None

        self._owner = asyncio.get_running_loop().create_task(own())
        try:
            await asyncio.wait_for(asyncio.shield(ready), connect_timeout_s)
        except BaseException:
            self._owner.cancel()  # still starting: stop it now, not after the close timeout
            await asyncio.wait({self._owner}, timeout=_CLOSE_TIMEOUT_S)
            raise
        names = {t.name for t in self.tools}
        self.resettable = bool(self.key.reset_tool) and self.key.reset_tool in names

    @property
    def alive(self) -> bool:
        return self._owner is not None and not self._owner.done() and self.client is not None

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        if not self.alive:
            raise ConnectionError("the MCP session is closed")
        return await self.client.call_tool(name, arguments)

    async def reset(self) -> None:
        """The server's own reset tool; an error result or a failed call means it cannot be
        trusted with another episode."""
        res = await asyncio.wait_for(self.call_tool(self.key.reset_tool, {}), self.key.timeout_s)
        if getattr(res, "is_error", False):
            raise RuntimeError(f"the server's {self.key.reset_tool!r} tool reported an error")

    async def close(self) -> None:
        self._stop.set()
        owner = self._owner
        if owner is None or owner.done():
            return
        done, _ = await asyncio.wait({owner}, timeout=_CLOSE_TIMEOUT_S)
        if not done:  # a server that does not stop: cancel the owner (the SDK kills it)
            owner.cancel()
            await asyncio.wait({owner}, timeout=_CLOSE_TIMEOUT_S)


@dataclass
class SessionPool:
    """Idle sessions of one server configuration; used only on the pool's loop."""

    key: ServerKey
    params: Any
    connect_timeout_s: float
    reuse: bool = True
    idle: list[MCPSession] = field(default_factory=list)
    live: set[MCPSession] = field(default_factory=set)  # every open one (lent ones too)
    orphans: list[asyncio.Task[MCPSession]] = field(default_factory=list)  # starts nobody awaits
    started: int = 0  # servers started (the benchmark and tests read it)
    closed: bool = False
    _warned: bool = False

    async def acquire(self) -> MCPSession:
        """An idle session reset for a new episode, else a freshly opened one. An idle session
        whose reset fails (its server died, or refuses) is stopped and the next one tried."""
        while self.idle:
            session = self.idle.pop()
            try:
                if not session.alive:
                    raise ConnectionError("the server exited while idle")
                await session.reset()
            except Exception as exc:
                log.info("mcp server %s not reused: %s", _name(self.key), exc)
                self.live.discard(session)
                await session.close()
                continue
            except BaseException:  # the episode was cancelled mid-reset: stop it, not leak it
                _spawn(session.close())
                raise
            session.episodes += 1
            return session
        session = await self._fresh()
        session.episodes = 1
        if self.reuse and not session.resettable and not self._warned:
            self._warned = True
            log.warning(
                "mcp server %s offers no %r tool: it cannot be reset, so each episode starts "
                "its own (set the mcp option reset_tool, or pool_sessions=false to silence this)",
                _name(self.key),
                self.key.reset_tool,
            )
        return session

    async def _fresh(self) -> MCPSession:
        """A newly started server. Its start goes on if the episode stops waiting for it (a
        deadline): the server then waits idle for the next episode, so a burst of starts on a
        busy machine is not thrown away and started again at the next step."""
        if self.orphans:  # a start no episode waits for any more: take it over
            start = self.orphans.pop(0)
        else:
            start = asyncio.get_running_loop().create_task(self._start())
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            self.orphans.append(start)
            start.add_done_callback(self._adopt)
            raise

    async def _start(self) -> MCPSession:
        # A process's start waits its turn (its connect timeout runs from when it may start);
        # an HTTP session is only a handshake.
        spawns = not isinstance(self.params, str)
        async with _starts() if spawns else contextlib.nullcontext():
            session = MCPSession(self.key, self.params)
            await session.open(self.connect_timeout_s)
        if self.closed:  # the trainer closed while it started
            await session.close()
            raise ConnectionError("the session pool was closed")
        self.live.add(session)
        self.started += 1
        return session

    def _adopt(self, start: asyncio.Task[MCPSession]) -> None:
        if start not in self.orphans:  # another episode took it over
            return
        self.orphans.remove(start)
        if start.cancelled() or start.exception() is not None:
            return
        session = start.result()
        if self.reuse and session.resettable and not self.closed:
            self.idle.append(session)
        else:
            _spawn(self.release(session, False))

    async def release(self, session: MCPSession, healthy: bool) -> None:
        """Back to the idle list when it served its episode without an environment failure
        and can be reset; otherwise stopped."""
        if healthy and self.reuse and not self.closed and session.resettable and session.alive:
            self.idle.append(session)
        else:
            self.live.discard(session)
            await session.close()

    async def close(self) -> None:
        """Stop every server, idle or still lent (an episode that never gave its back)."""
        self.closed = True
        for start in self.orphans:
            start.cancel()
        live, self.idle, self.live, self.orphans = self.live, [], set(), []
        await asyncio.gather(*(s.close() for s in live), return_exceptions=True)


_POOLS: dict[ServerKey, SessionPool] = {}
_STARTS: list[asyncio.Semaphore] = []


def _starts() -> asyncio.Semaphore:
    """Servers starting at once in this process. Starting is mostly an interpreter importing
    modules: 96 at once on 2 cores each took over a minute and all missed their connect timeout,
    where a few at a time finish one after another."""
    if not _STARTS:
        _STARTS.append(asyncio.Semaphore(max(4, os.cpu_count() or 1)))
    return _STARTS[0]


def session_pool(key: ServerKey, params: Any, connect_timeout_s: float, reuse: bool) -> SessionPool:
    """This process's pool for ``key`` (created on first use)."""
    _loop_thread()
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.closed or pool.reuse != reuse:
            pool = _POOLS[key] = SessionPool(key, params, connect_timeout_s, reuse)
        return pool


def close_env_pools() -> None:
    """Stop every pooled MCP server of this process (the trainer's and eval's close; also run
    at exit). Pools made afterwards start afresh."""
    global _POOLS
    with _LOCK:
        loop = _LOOP if _LOOP is not None and _LOOP.pid == os.getpid() else None
        pools, _POOLS = list(_POOLS.values()), {}
    if loop is None or not pools:
        return

    async def close_all() -> None:
        await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)

    try:
        loop.submit(close_all()).result(timeout=2 * _CLOSE_TIMEOUT_S)
    except Exception as exc:  # best effort: the servers' stdin closes with this process anyway
        log.warning("stopping pooled mcp servers failed: %r", exc)


_BACKGROUND: set[asyncio.Task[Any]] = set()  # held, or asyncio may collect them mid-flight


def _spawn(coro: Coroutine[Any, Any, Any]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _name(key: ServerKey) -> str:
    server = key.server
    return " ".join(server) if isinstance(server, tuple) else str(server)


atexit.register(close_env_pools)
