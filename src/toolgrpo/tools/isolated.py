"""Run a tool where it can be killed: a shared pool of worker processes with hard deadlines.

A thread cannot be stopped, and a tool stuck in C code (sympy building a million-digit integer)
holds the GIL and freezes the event loop. Tools declared ``isolated`` run here instead: each call
runs in a worker process; past its deadline the worker is killed (SIGKILL) and replaced. Workers
are forked from a zygote, a clean interpreter (``worker_process``), cap their own address space
(RLIMIT_AS) per call, and ignore SIGINT.

One pool per process, shared by every environment and event loop (``EpisodeRunner.play`` runs
``asyncio.run`` once per step); it grows on demand up to ``max_workers`` busy workers, and a call
that finds them all busy waits for one: its deadline counts from when it starts running, so a
slow call never makes another one look slow.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from toolgrpo.tools.worker_process import Zygote, reference

log = logging.getLogger(__name__)

DEFAULT_MAX_WORKERS = 4
DEFAULT_MEMORY_LIMIT_MB = 1024.0
START_TIMEOUT_S = 120.0  # a worker's start (the zygote's first start imports the tools)


class IsolatedTimeout(Exception):
    """The call ran past its deadline; its worker was killed."""


class IsolatedCrash(Exception):
    """The worker died during the call (out of memory, a signal, a crash in C code)."""


class IsolationUnavailable(RuntimeError):
    """No worker could be started: the environment's failure, not the model's."""


def check_isolatable(fn: Callable[..., Any], name: str) -> None:
    """A worker receives ``fn`` by reference (module and name) or pickled: it must be either."""
    try:
        reference(fn)
    except Exception as exc:
        raise ValueError(
            f"tool {name!r} is declared isolated, but its function cannot be sent to a worker "
            f"process ({type(exc).__name__}: {exc}); use a function defined at module level "
            "in an importable module"
        ) from None


# ---------------------------------------------------------------- the parent's side


@dataclass(eq=False)
class _Worker:
    pid: int
    pidfd: int | None  # signals reach this process even if its pid were reused
    conn: Connection
    modules: set[str] = field(default_factory=set)  # imported (the zygote's, then on demand)
    killed: bool = False

    def kill(self) -> None:
        """SIGKILL: C code holding the GIL cannot ignore it. The zygote reaps the process. Once
        only: after the zygote reaps it, the pid may belong to someone else."""
        if self.killed:
            return
        self.killed = True
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                os.close(self.pidfd)
                self.pidfd = None
            else:
                os.kill(self.pid, signal.SIGKILL)
        except OSError:  # already gone
            pass
        self.conn.close()


@dataclass(eq=False)
class _Claim:
    """A caller waiting for a worker (or for a free slot to start one). Whoever changes it holds
    the pool's lock, so a worker handed over has exactly one owner even if the caller is
    cancelled at the same moment or its event loop has gone."""

    loop: asyncio.AbstractEventLoop
    fut: asyncio.Future
    worker: _Worker | None = None  # handed over by _release
    slot: bool = False  # a worker died: the caller may start one
    gone: bool = False  # the caller stopped waiting
    error: BaseException | None = None  # a start failed (for start claims)


class WorkerPool:
    """Worker processes shared by every caller in this process (any thread, any event loop)."""

    def __init__(self, max_workers: int = DEFAULT_MAX_WORKERS, preload: Sequence[str] = ()) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.preload = tuple(preload)
        self._zygote = Zygote(self.preload)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self._starting = 0
        self._waiters: deque[_Claim] = deque()
        self._closed = False
        self._warmed = False
        self.started = 0  # workers started, for tests and metrics

    async def call(
        self,
        fn: Callable[..., Any],
        kwargs: Mapping[str, Any],
        timeout_s: float | None,
        memory_limit_mb: float | None = DEFAULT_MEMORY_LIMIT_MB,
    ) -> Any:
        """``fn(**kwargs)`` in a worker; raises what ``fn`` raised, ``IsolatedTimeout`` past
        ``timeout_s`` (counted from when a worker took the call) or ``IsolatedCrash``."""
        ref = reference(fn)
        worker = await self._acquire()
        healthy = False
        try:
            if ref[0] == "name" and ref[1] not in worker.modules:
                await self._import(worker, ref[1])
            worker.conn.send(("call", ref, dict(kwargs), timeout_s, memory_limit_mb))
            reply = await _reply(worker.conn, timeout_s)
            healthy = reply[0] in ("ok", "raised")
        except asyncio.TimeoutError:
            raise IsolatedTimeout(f"ran past {timeout_s:g}s and was stopped") from None
        except (EOFError, OSError):
            raise IsolatedCrash("crashed: its worker process died") from None
        finally:  # a cancelled or timed-out call leaves its worker mid-call: kill it
            self._release(worker) if healthy else self._discard(worker)
        if reply[0] == "memory":
            raise IsolatedCrash(f"ran out of memory (limit {reply[1]:g} MB) and was stopped")
        if reply[0] == "raised":
            raise reply[1]
        return reply[1]

    async def _import(self, worker: _Worker, module: str) -> None:
        """The tool's module, imported before the call's deadline starts (so a first call
        does not pay for, say, sympy's import); a module that cannot import is the
        environment's failure."""
        worker.conn.send(("import", module))
        try:
            status, detail = await _reply(worker.conn, START_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise IsolationUnavailable(f"importing {module} in a tool worker timed out") from None
        if status != "imported":
            raise IsolationUnavailable(f"a tool worker {detail}")
        worker.modules.add(module)
        self.add_preload((module,))

    def add_preload(self, modules: Sequence[str]) -> None:
        """More modules for the zygote to import, if it has not started yet."""
        with self._lock:
            new = tuple(m for m in modules if m not in self.preload)
            if new and not self._zygote.started:
                self.preload += new
                self._zygote.preload = self.preload

    def close(self) -> None:
        """Kill every worker; callers waiting for one get ``IsolationUnavailable``."""
        with self._lock:
            self._closed = True
            workers = list(self._live)
            self._idle.clear()
            self._live.clear()
            waiters = list(self._waiters)
            self._waiters.clear()
        for w in workers:
            w.kill()
        self._zygote.close()
        for claim in waiters:
            _wake(claim)

    def warm(self) -> None:
        """Start the zygote in the background, once, so the first call does not wait for its
        imports (an environment with isolated tools calls this when it is made)."""
        with self._lock:
            if self._warmed or self._closed:
                return
            self._warmed = True
        threading.Thread(
            target=self._zygote.start, name="toolgrpo-tool-zygote", daemon=True
        ).start()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"live": len(self._live), "idle": len(self._idle), "started": self.started}

    # -- acquiring and returning workers

    async def _acquire(self) -> _Worker:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._closed:
                    raise IsolationUnavailable("the tool worker pool was shut down")
                idle = self._idle.pop() if self._idle else None
                if idle is not None:
                    claim = None
                elif len(self._live) + self._starting < self.max_workers:
                    self._starting += 1
                    claim = None
                else:
                    claim = _Claim(loop, loop.create_future())
                    self._waiters.append(claim)
            if idle is not None:
                if not idle.conn.poll():  # an idle worker has nothing to say unless it died
                    return idle
                self._discard(idle)
                continue
            if claim is None:
                return await self._start(loop)
            try:
                await claim.fut
            except BaseException:  # cancelled: pass on whatever we were handed
                self._take_back(claim)
                raise
            with self._lock:
                claim.gone = True
                worker, claim.worker, claim.slot = claim.worker, None, False
            if worker is not None:
                return worker  # else a slot freed up (or the pool closed): look again

    async def _start(self, loop: asyncio.AbstractEventLoop) -> _Worker:
        """Start a worker in a helper thread: the zygote's first start imports the tools'
        modules, which must not block the event loop."""
        claim = _Claim(loop, loop.create_future())

        def target() -> None:
            try:
                outcome: Any = self._spawn()
            except BaseException as exc:
                outcome = exc
            worker = outcome if isinstance(outcome, _Worker) else None
            with self._lock:
                self._starting -= 1
                if worker is not None and self._closed:  # shut down meanwhile
                    worker.kill()
                    worker, outcome = (
                        None,
                        IsolationUnavailable("the tool worker pool was shut down"),
                    )
                if worker is not None:
                    self._live.add(worker)
                    self.started += 1
                abandoned = claim.gone
                if not abandoned:
                    claim.worker, claim.error = worker, None if worker else outcome
            if worker is None:
                self._wake_one()  # the slot is free again
            if abandoned:
                if worker is not None:
                    self._release(worker)
            elif not _wake(claim):
                self._take_back(claim)

        threading.Thread(target=target, name="toolgrpo-tool-worker-start", daemon=True).start()
        try:
            await claim.fut
        except BaseException:  # cancelled: a worker that arrives goes back to the pool
            self._take_back(claim)
            raise
        with self._lock:
            claim.gone = True
            worker, error, claim.worker = claim.worker, claim.error, None
        if worker is None:
            raise error or IsolationUnavailable("a tool worker could not start")
        return worker

    def _take_back(self, claim: _Claim) -> None:
        """The claim's caller was cancelled or its event loop closed: whatever it was handed
        goes to someone else."""
        with self._lock:
            claim.gone = True
            worker, slot = claim.worker, claim.slot
            claim.worker, claim.slot = None, False
        if worker is not None:
            self._release(worker)
        elif slot:
            self._wake_one()

    def _spawn(self) -> _Worker:
        try:
            pid, pidfd, conn = self._zygote.fork()
            worker = _Worker(pid, pidfd, conn, modules=set(self._zygote.loaded))
        except (OSError, EOFError) as exc:
            raise IsolationUnavailable(f"cannot start a tool worker: {exc}") from None
        try:
            if not worker.conn.poll(START_TIMEOUT_S):
                raise IsolationUnavailable(f"a tool worker did not start in {START_TIMEOUT_S:g}s")
            status, detail = worker.conn.recv()
        except (EOFError, OSError):
            worker.kill()
            raise IsolationUnavailable("a tool worker died while starting") from None
        except BaseException:
            worker.kill()
            raise
        if status != "ready":
            worker.kill()
            raise IsolationUnavailable(f"a tool worker could not start: {detail}")
        return worker

    def _release(self, worker: _Worker) -> None:
        """A healthy worker goes to the first waiting caller, else back to the idle list."""
        while True:
            with self._lock:
                if self._closed or worker not in self._live:
                    break
                claim = self._next_waiter()
                if claim is None:
                    self._idle.append(worker)
                    return
                claim.worker = worker
            if _wake(claim):
                return
            with self._lock:  # its loop is closed: take the worker back, try the next one
                claim.gone, claim.worker = True, None
        worker.kill()

    def _next_waiter(self) -> _Claim | None:
        """The first waiting caller that has not given up, or None (caller holds the lock)."""
        while self._waiters:
            candidate = self._waiters.popleft()
            if not candidate.gone:
                return candidate
        return None

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)
        self._wake_one()

    def _wake_one(self) -> None:
        """Tell one waiting caller that a slot is free (it then starts a worker itself)."""
        while True:
            with self._lock:
                claim = self._next_waiter()
                if claim is None:
                    return
                claim.slot = True
            if _wake(claim):
                return
            with self._lock:
                claim.gone, claim.slot = True, False


async def _reply(conn: Connection, timeout_s: float | None) -> tuple[Any, ...]:
    """The worker's reply, waited for on the event loop (no thread is tied up waiting)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()
    fd = conn.fileno()

    def readable() -> None:
        loop.remove_reader(fd)
        if fut.done():
            return
        try:
            fut.set_result(conn.recv())
        except BaseException as exc:  # EOF: the worker died; or a reply that cannot unpickle
            fut.set_exception(exc if isinstance(exc, (EOFError, OSError)) else EOFError(exc))

    loop.add_reader(fd, readable)
    try:
        if timeout_s is None or timeout_s <= 0:
            return await fut
        return await asyncio.wait_for(fut, timeout_s)
    finally:
        loop.remove_reader(fd)


def _wake(claim: _Claim) -> bool:
    """Wake the claim's caller on its own loop; ``False`` if that loop is closed."""

    def deliver() -> None:
        if not claim.fut.done():
            claim.fut.set_result(None)

    try:
        claim.loop.call_soon_threadsafe(deliver)
    except RuntimeError:  # the loop is closed
        return False
    return True
