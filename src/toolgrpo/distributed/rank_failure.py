"""One failure protocol for every FSDP2 rank, whoever samples (every rank, rank 0 alone, or rank
0's rollout thread).

Before each collective the loop runs through ``Ranks`` (a broadcast, a gather, a reduction), the
ranks meet on the process group's key-value store: each says it has arrived and waits for the
others. A rank whose work raised posts one line there instead, "rank R failed at step S: <type>:
<message>" (the first posted wins), and every rank raises that line as ``RankFailed``: at its
next meeting, or at once when it is busy with work of its own (its share of the rollout), which a
watcher thread interrupts. Without this, the other ranks sat in a collective until the backend's
timeout (gloo's is 30 minutes) or until the failed rank's exit broke the connection, then failed
with a transport error that named nothing. A meeting also ends, naming what it waited for and who
never came, when a rank left the run, went silent (its heartbeat stopped for ``SILENT_S``) or
did not come within ``MEET_TIMEOUT_S``. Leaving the run is a meeting too, with a timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import threading
import time
from typing import Any

from toolgrpo.errors import UserError

log = logging.getLogger(__name__)

MEET_TIMEOUT_S = 3600.0  # the longest a rank waits at a meeting (rank 0's validation included)
SILENT_S = 120.0  # a rank whose heartbeat stopped this long is gone (killed, frozen)
EXIT_TIMEOUT_S = 60.0  # leaving: how long a rank waits for the others
EXIT_AFTER_FAILURE_S = 15.0  # ... once a failure is known (interrupted ranks come in seconds)
BEAT_S = 0.5  # the watcher's period: heartbeat, and a look for a posted failure
SIGNUM = getattr(signal, "SIGUSR1", None)  # interrupts this rank's main thread


class RankFailed(UserError):
    """A rank failed (this one or another): every rank raises it with the same line, so the CLI
    prints that line on every rank and every rank exits with the same code."""


def describe(e: BaseException) -> str:
    """The error and its causes, outermost first (the rollout thread's error is a cause)."""
    parts: list[str] = []
    cause: BaseException | None = e
    while cause is not None and len(parts) < 4:
        parts.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__
    return "; caused by ".join(parts)


class RankBoard:
    """This rank's view of the meeting place (a store shared by the ranks): arrivals, heartbeats,
    the run's failure line, departures. ``step`` is what a failure line names."""

    def __init__(self, store: Any, rank: int, world: int) -> None:
        self.store, self.rank, self.world = store, rank, world
        self.step = 0
        self.failure: str | None = None  # the run's failure line, once this rank knows it
        self.raised = False  # this rank raised it already (a signal must not raise it twice)
        self.left = False
        self._seq = 0
        self._lock = threading.Lock()  # the store client is shared with the watcher
        self._watcher: _Watcher | None = None

    def start(self) -> RankBoard:
        """Start the heartbeat and the watcher that interrupts this rank on a failure; a
        process that ends without leaving (an error before the trainer could close) still
        tells the others it left."""
        self._watcher = _Watcher(self, _install_handler(self))
        self._watcher.start()
        atexit.register(self._exit)
        return self

    def _exit(self) -> None:
        if not self.left:
            with contextlib.suppress(_StoreGone):
                self._op(lambda s: s.set(f"left/{self.rank}", "1"))

    # ---- meetings --------------------------------------------------------------------------
    def meet(self, what: str) -> None:
        """Wait until every rank has reached this meeting (the n-th on every rank): raises
        ``RankFailed`` with the run's failure line when one is posted meanwhile, or naming
        ``what`` and the missing ranks when one left, went silent or never came."""
        try:
            self._meet(what)
        except _StoreGone as e:  # the rank that hosts the store has ended
            why = f"lost the store the ranks meet on ({e.__cause__})"
            self.raised = True
            raise RankFailed(self.failure or self._waited(what, why, None)) from e

    def _meet(self, what: str) -> None:
        self._seq += 1
        keys = [f"at/{self._seq}/{r}" for r in range(self.world)]
        self._op(lambda s: s.set(keys[self.rank], "1"))
        start = time.monotonic()
        delay, beats = 0.0005, {}  # beats: rank -> (count, when it last changed)
        look = start + 1.0  # departures and heartbeats: once a second
        while True:
            self.raise_posted()  # first: a rank that gave up on this meeting had arrived
            if self._op(lambda s: s.check(keys)):
                break
            now = time.monotonic()
            if now >= look:
                look = now + 1.0
                self._look(what, keys, beats, now)
            if now - start > MEET_TIMEOUT_S:
                missing = self._missing(keys)
                raise self.post(self._waited(what, f"rank(s) {missing} never came", now - start))
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        if self._seq > 1:  # every rank has left the meeting before this one
            self._op(lambda s: s.delete_key(f"at/{self._seq - 1}/{self.rank}"))

    def _look(self, what: str, keys: list[str], beats: dict, now: float) -> None:
        for r in self._missing(keys):
            if self._op(lambda s, r=r: s.check([f"left/{r}"])):
                raise self.post(self._waited(what, f"rank {r} left the run", None))
            n = int(self._op(lambda s, r=r: s.add(f"beat/{r}", 0)))
            if r not in beats or beats[r][0] != n:
                beats[r] = (n, now)
            elif now - beats[r][1] > SILENT_S:
                quiet = f"rank {r} went silent (no heartbeat for {SILENT_S:g} s)"
                raise self.post(self._waited(what, quiet, None))

    def _missing(self, keys: list[str]) -> list[int]:
        return [r for r, k in enumerate(keys) if not self._op(lambda s, k=k: s.check([k]))]

    def _waited(self, what: str, why: str, waited: float | None) -> str:
        after = f" after {waited:.0f} s" if waited is not None else ""
        return f"rank {self.rank} stopped {self.at} waiting for {what}{after}: {why}"

    @property
    def at(self) -> str:
        """When, in a failure line: the step the loop runs, or the start."""
        return f"at step {self.step}" if self.step > 0 else "before step 1"

    # ---- failures --------------------------------------------------------------------------
    def post(self, line: str) -> RankFailed:
        """Post ``line`` as the run's failure unless one is posted already; the ``RankFailed``
        of the one that stands (the same on every rank)."""
        try:
            got = self._op(lambda s: s.compare_set("failed", "", line))
            line = got.decode() if isinstance(got, bytes) else str(got)
        except Exception:  # the store is gone (its rank left): this rank's line stands
            log.debug("could not post the failure", exc_info=True)
        self.failure = self.failure or line
        self.raised = True
        return RankFailed(self.failure)

    def fail(self, e: BaseException) -> RankFailed:
        """This rank's work raised ``e``: the line every rank raises (this rank's own, unless
        another rank's failure came first, as when ``e`` is the broken connection to it)."""
        known, self.raised = self.failure, True  # no signal from here on
        if isinstance(e, RankFailed):
            return e
        own = f"rank {self.rank} failed {self.at}: {describe(e)}"
        if known is None and not isinstance(e, UserError):  # a bug: keep its traceback
            log.error("rank %d failed %s", self.rank, self.at, exc_info=e)
        err = self.post(own)
        err.__cause__ = e
        return err

    def broke(self, what: str, e: BaseException) -> RankFailed:
        """A collective raised (a peer's connection broke, a timeout): the run's failure when a
        rank posted one, else one naming ``what``."""
        with contextlib.suppress(_StoreGone):
            self._learn()
        line = f"rank {self.rank} failed {self.at} in {what}: {describe(e)}"
        return self.post(self.failure or line)

    def raise_posted(self) -> None:
        """Raise ``RankFailed`` if a rank posted a failure."""
        self._learn()
        if self.failure is not None:
            self.raised = True
            raise RankFailed(self.failure)

    def _learn(self) -> None:
        if self.failure is None and self._op(lambda s: s.check(["failed"])):
            self.failure = self._op(lambda s: s.get("failed")).decode()

    # ---- leaving ---------------------------------------------------------------------------
    def leave(self, error: BaseException | None = None) -> bool:
        """Say this rank leaves and wait for the others (``EXIT_TIMEOUT_S``, shorter once a
        failure is known); whether they all came. ``error``: what ends this rank when it leaves
        outside the loop (a failed start-up), posted for the others first."""
        self.left = True
        if isinstance(error, Exception) and not self.raised:
            self.fail(error)  # posting never raises
        if self._watcher is not None:
            self._watcher.stop()
        if _active and _active[0] is self:  # a late signal finds no board to raise for
            _active.clear()
        keys = [f"left/{r}" for r in range(self.world)]
        try:
            self._op(lambda s: s.set(keys[self.rank], "1"))
            wait = EXIT_AFTER_FAILURE_S if self.failure is not None else EXIT_TIMEOUT_S
            end = time.monotonic() + wait
            while not self._op(lambda s: s.check(keys)):
                if time.monotonic() > end:
                    missing = self._missing(keys)
                    log.warning("leaving without rank(s) %s after %.0f s", missing, wait)
                    return False
                time.sleep(0.01)
        except Exception as e:  # the store's host left first: nobody is left to wait for
            log.debug("leaving: %s", e)
            return False
        return True

    def _op(self, fn: Any) -> Any:
        with self._lock:
            try:
                return fn(self.store)
            except Exception as e:  # DistStoreError, a reset connection
                raise _StoreGone(str(e)) from e


class _StoreGone(RuntimeError):
    """The store the ranks meet on cannot be reached (the rank hosting it has ended)."""


class _Watcher(threading.Thread):
    """Beats for this rank, and interrupts its main thread once when another rank's failure is
    posted while this rank is busy (``interrupt``: whether a signal handler is in place)."""

    def __init__(self, board: RankBoard, interrupt: bool) -> None:
        super().__init__(name="toolgrpo-rank-watch", daemon=True)
        self.board, self.interrupt = board, interrupt
        self.main = threading.main_thread().ident
        self._done = threading.Event()

    def run(self) -> None:
        board, signalled = self.board, False
        while not self._done.wait(BEAT_S):
            try:
                board._op(lambda s: s.add(f"beat/{board.rank}", 1))
                board._learn()
            except Exception:  # the store is gone: its host rank left; nothing more to watch
                return
            if board.failure and not board.raised and self.interrupt and not signalled:
                signalled = True
                signal.pthread_kill(self.main, SIGNUM)  # type: ignore[arg-type]

    def stop(self) -> None:
        self._done.set()
        if self is not threading.current_thread():
            self.join(timeout=5.0)


_active: list[RankBoard] = []  # the board whose failures interrupt this process's main thread


def _install_handler(board: RankBoard) -> bool:
    """Route ``SIGNUM`` to ``_interrupt`` (once per process, from the main thread only, and
    never over a handler someone else installed); whether interrupts can reach this rank."""
    _active[:] = [board]
    if SIGNUM is None or threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(SIGNUM)
    if current is _interrupt:
        return True
    if current not in (signal.SIG_DFL, None):
        return False
    signal.signal(SIGNUM, _interrupt)
    return True


def _interrupt(signum: int, frame: Any) -> None:
    """Raise the run's failure in the main thread, wherever it is (once)."""
    board = _active[0] if _active else None
    if board is not None and board.failure is not None and not board.raised:
        board.raised = True
        raise RankFailed(board.failure)
