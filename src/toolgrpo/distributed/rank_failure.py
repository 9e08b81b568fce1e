"""Rank 0's failure reaches every FSDP2 rank.

Some of a step runs on rank 0 alone before a broadcast: its rollout, or the async rollout
thread's batch. When that raises, the other ranks are already waiting in the broadcast; without
word from rank 0 they sit there until the backend's timeout (gloo's is 30 minutes) or until
rank 0's exit breaks the connection, then fail with a transport error that names nothing. So
rank 0 broadcasts the failure in the result's place, and every rank raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from toolgrpo.distributed.fsdp import Ranks

T = TypeVar("T")


class RankFailed(RuntimeError):
    """Raised on the other ranks when rank 0 failed in work they were waiting for."""


@dataclass(frozen=True)
class _Failed:
    message: str


def from_rank0(ranks: Ranks, step: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` run on rank 0 alone, its result on every rank (a collective). When it
    raises, rank 0 sends word of it, then raises its own error; the others raise ``RankFailed``."""
    try:
        got = fn(*args) if ranks.main else None
    except Exception as e:
        if ranks.world > 1:
            with contextlib.suppress(Exception):  # a rank already gone: rank 0's error stands
                ranks.broadcast(_Failed(f"rank 0 failed at step {step}: {describe(e)}"))
        raise
    got = ranks.broadcast(got)
    if isinstance(got, _Failed):
        raise RankFailed(got.message)
    return got


def describe(e: BaseException) -> str:
    """The error and its causes, outermost first (the rollout thread's error is a cause)."""
    parts: list[str] = []
    cause: BaseException | None = e
    while cause is not None and len(parts) < 4:
        parts.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__
    return "; caused by ".join(parts)
