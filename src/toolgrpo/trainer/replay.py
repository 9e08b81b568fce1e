"""Asynchronous rollouts: a producer thread fills a replay buffer while the trainer learns.

Every batch carries the policy version (number of updates) whose weights generated it. The
producer may run at most ``max_staleness`` versions ahead of the trainer; the trainer drops any
batch older than that. With ``max_staleness=0`` the producer waits for each update before it
generates the next batch, which is exactly the synchronous loop (tests check identical runs).

PPO's ratio then uses the log-probs the tokens were sampled with (the behaviour policy), never
log-probs recomputed under the current weights, so stale samples stay correctly weighted.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass
class Versioned(Generic[T]):
    step: int  # the training step it was produced for
    version: int  # policy version of the weights that generated it
    item: T


class StaleBuffer(Generic[T]):
    """A FIFO of versioned items; ``get`` drops items more than ``max_staleness`` versions old."""

    def __init__(self, max_staleness: int, capacity: int) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.max_staleness, self.capacity = max_staleness, max(1, capacity)
        self._items: deque[Versioned[T]] = deque()
        self._cond = threading.Condition()
        self.dropped = 0
        self.error: BaseException | None = None

    def put(self, entry: Versioned[T]) -> None:
        with self._cond:
            self._cond.wait_for(lambda: len(self._items) < self.capacity)
            self._items.append(entry)
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self.error = error
            self._cond.notify_all()

    def get(self, current_version: int, timeout: float | None = None) -> Versioned[T]:
        with self._cond:
            while True:
                while self._items and current_version - self._items[0].version > self.max_staleness:
                    self._items.popleft()
                    self.dropped += 1
                    self._cond.notify_all()
                if self._items:
                    entry = self._items.popleft()
                    self._cond.notify_all()
                    return entry
                if self.error is not None:
                    raise RuntimeError("the rollout producer failed") from self.error
                if not self._cond.wait(timeout):
                    raise TimeoutError("no rollout batch arrived in time")


class AsyncRollout:
    """Runs ``produce(step, generator_model)`` for steps ``start..end`` on a thread, against a
    copy of the policy that is refreshed from the trainer's weights before each batch. With
    ``model=None`` the backend keeps its own copy (a Ray pool the trainer pushes weights to
    after each update): ``produce`` gets None, and a batch is labelled with the updates applied
    when it started (its samples may be a version newer, never older)."""

    def __init__(
        self,
        model: Any,
        produce: Callable[[int, Any], Any],
        start: int,
        end: int,
        max_staleness: int,
    ) -> None:
        self.model = model  # the trainer's (trained in place)
        self.rollout_model = copy.deepcopy(model).eval() if model is not None else None
        self.produce = produce
        self.buffer: StaleBuffer[Any] = StaleBuffer(max_staleness, max_staleness + 1)
        self.version = start - 1  # updates applied to the trainer's weights
        self.lock = threading.Lock()  # held by the trainer while it updates
        self._synced = -1
        self._versions = threading.Condition()
        self._stop = threading.Event()
        self.start_step, self.end_step = start, end
        self.thread = threading.Thread(target=self._run, name="toolgrpo-rollout", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def updated(self) -> None:
        """The trainer finished an update: the producer may use the new weights."""
        with self._versions:
            self.version += 1
            self._versions.notify_all()

    def _run(self) -> None:
        try:
            for step in range(self.start_step, self.end_step + 1):
                with self._versions:  # run at most max_staleness versions ahead
                    self._versions.wait_for(
                        lambda s=step: (
                            self._stop.is_set()
                            or (s - 1) - self.version <= self.buffer.max_staleness
                        )
                    )
                if self._stop.is_set():
                    return
                with self.lock:
                    version = self.version
                    if self.model is not None and self._synced != version:
                        self.rollout_model.load_state_dict(self.model.state_dict())
                        self._synced = version
                item = self.produce(step, self.rollout_model)
                self.buffer.put(Versioned(step, version, item))
        except BaseException as exc:  # surfaced to the trainer by buffer.get
            self.buffer.fail(exc)

    def close(self) -> None:
        self._stop.set()
        with self._versions:
            self._versions.notify_all()


def take_batch(producer: AsyncRollout) -> Any:
    """The rollout thread's next batch (a ``Rolled``) for the trainer's current version, with
    its staleness (updates since its weights) and the stale batches dropped so far."""
    got = producer.buffer.get(current_version=producer.version)
    rolled = got.item
    rolled.metrics["async/staleness"] = float(producer.version - got.version)
    rolled.metrics["async/dropped_stale"] = float(producer.buffer.dropped)
    return rolled
