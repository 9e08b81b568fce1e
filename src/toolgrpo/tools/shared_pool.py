"""This process's one pool of isolated-tool workers: created on first use, sized by the largest
request of any environment, rebuilt in a forked child, and shut down at exit (or by the trainer
and Ray workers when they close)."""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from toolgrpo.tools.isolated import DEFAULT_MAX_WORKERS, WorkerPool

_POOL: WorkerPool | None = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()
_REQUESTED_WORKERS: list[int] = []


def request_workers(n: int) -> None:
    """An environment asks for ``n`` isolated workers; the pool's cap is the largest request
    (``DEFAULT_MAX_WORKERS`` if none). Applies to a pool created after the call."""
    if n < 1:
        raise ValueError(f"the number of tool workers must be >= 1, got {n}")
    with _POOL_LOCK:
        _REQUESTED_WORKERS.append(int(n))
        if _POOL is not None and n > _POOL.max_workers:
            _POOL.max_workers = int(n)


def modules_of(fn: Callable[..., Any]) -> tuple[str, ...]:
    """What a zygote should import for ``fn`` (its module, if it has one)."""
    module = getattr(fn, "__module__", None)
    return (module,) if isinstance(module, str) and module != "__main__" else ()


def shared_pool(preload: Sequence[str] = ()) -> WorkerPool:
    """This process's pool, created on first use (a forked child gets a fresh one)."""
    global _POOL, _POOL_PID
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != os.getpid():
            cap = max(_REQUESTED_WORKERS) if _REQUESTED_WORKERS else DEFAULT_MAX_WORKERS
            _POOL = WorkerPool(cap, preload)
            _POOL_PID = os.getpid()
        pool = _POOL
    pool.add_preload(preload)
    return pool


def shutdown_shared_pool() -> None:
    """Kill this process's workers (also run at exit); the next call starts a new pool."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = (_POOL if _POOL_PID == os.getpid() else None), None
    if pool is not None:
        pool.close()


atexit.register(shutdown_shared_pool)
