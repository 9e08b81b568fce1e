"""Progress inside a step: episodes finished in generation, validation tasks, update mini-batches.

A step can take many minutes; a bare step counter looks hung. Layers below the trainer only call
``tick()`` (a no-op unless a reporter is installed); the trainer and ``toolgrpo eval`` install a
``Reporter`` that draws rich bars on a terminal, or prints one line per phase otherwise (logs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Reporter:
    """Phases as rich tasks on an existing ``Progress`` (only one live display may run), or one
    line per phase through ``console`` when it is not a terminal."""

    def __init__(self, console: Any, progress: Any = None, live: bool | None = None) -> None:
        self.console = console
        self.progress = progress
        self.live = (console.is_terminal if live is None else live) and progress is not None
        self.label = ""  # e.g. "step 3", set by the trainer

    def start(self, name: str, total: int, unit: str) -> Any:
        if self.live:
            return self.progress.add_task(f"{self.label} {name}".strip(), total=total)
        return None

    def advance(self, handle: Any, n: int) -> None:
        if self.live and handle is not None:
            self.progress.advance(handle, n)

    def finish(self, handle: Any, name: str, done: int, total: int, unit: str, secs: float) -> None:
        if self.live:
            if handle is not None:
                self.progress.remove_task(handle)
            return
        shown = f"{done}/{total}" if done != total and done > 0 else f"{total}"
        line = f"{self.label} {name}: {shown} {unit} in {secs:.1f}s".strip()
        self.console.print(line, soft_wrap=True, markup=False, highlight=False)


_lock = threading.Lock()
_reporter: Reporter | None = None
# Open phases per thread, innermost last, as [handle, done]: with asynchronous rollouts the
# rollout thread's generation and the main thread's update run at once and must not mix. Ticks
# come from the thread that opened the phase (episodes run on its event loop).
_local = threading.local()


def _stack() -> list[list[Any]]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def set_reporter(reporter: Reporter | None) -> Reporter | None:
    """Install ``reporter`` (None = off); returns the previous one so callers can restore it."""
    global _reporter
    with _lock:
        old, _reporter = _reporter, reporter
    return old


def current() -> Reporter | None:
    return _reporter


@contextmanager
def phase(name: str, total: int, unit: str = "") -> Iterator[None]:
    """A phase of ``total`` units; ``tick()`` inside it advances it."""
    rep = _reporter
    if rep is None:
        yield
        return
    t0 = time.perf_counter()
    with _lock:
        slot = [rep.start(name, total, unit), 0]
    stack = _stack()
    stack.append(slot)
    try:
        yield
    finally:
        if slot in stack:
            stack.remove(slot)
        rep.finish(slot[0], name, slot[1], total, unit, time.perf_counter() - t0)


def tick(n: int = 1) -> None:
    """``n`` more units of this thread's innermost open phase (a no-op with no reporter)."""
    rep = _reporter
    stack = _stack()
    if rep is None or not stack:
        return
    slot = stack[-1]
    slot[1] += n
    with _lock:
        rep.advance(slot[0], n)


@contextmanager
def console_progress(label: str = "") -> Iterator[Reporter]:
    """A reporter of its own on stderr, for commands without a ``Tracker`` (``toolgrpo eval``)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    bars = None
    if console.is_terminal:
        bars = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        bars.start()
    rep = Reporter(console, bars)
    rep.label = label
    old = set_reporter(rep)
    try:
        yield rep
    finally:
        set_reporter(old)
        if bars is not None:
            bars.stop()
