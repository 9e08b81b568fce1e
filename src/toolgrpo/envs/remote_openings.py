"""Many tasks' openings from a ``serve-env`` server over one session (its ``openings`` op).

The startup prompt measurement would otherwise open a session and reset an episode per task.
Tasks go in chunks of at most ``PER_REQUEST``, each request under half the frame limit; the server
answers the first tasks of each request (all of them unless its deadline or the reply's size cut
it short) and the rest go in the next request. A server that does not know the op (an older one)
answers the first request with an error: the caller then resets per task, as before.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from toolgrpo.envs.base import EnvStart
from toolgrpo.envs.wire import WireError, start_from_dict

PER_REQUEST = 256  # tasks a request (the server takes up to 1024)
SERVER_FRAME_BYTES = 16 * 1024 * 1024  # what serve-env reads in one frame (server_http.py)

Request = Callable[[dict[str, Any], str], Awaitable[dict[str, Any] | None]]


def _size(task: dict[str, Any]) -> int:
    return len(json.dumps(task, default=str).encode()) + 2


def _chunk(tasks: Sequence[dict[str, Any]], budget: int) -> int:
    """How many of the first ``tasks`` go in one request: at most ``PER_REQUEST``, their JSON
    within ``budget`` bytes; 0 when the first alone is over it."""
    size = 0
    for n, task in enumerate(tasks[:PER_REQUEST]):
        size += _size(task)
        if size > budget:
            return n
    return min(len(tasks), PER_REQUEST)


def _start(entry: Any) -> EnvStart | None:
    if not isinstance(entry, dict) or entry.get("op") != "start":
        return None
    try:
        return start_from_dict(entry)
    except WireError:
        return None


async def request_openings(
    request: Request, tasks: Sequence[dict[str, Any]], timeout_s: float, max_bytes: int
) -> list[EnvStart | None] | None:
    """Each wire task's opening, ``None`` where it cannot open (an error entry, a task too large
    to send, a lost connection); ``None`` overall when the server does not know the op.
    ``request`` sends one message and returns its reply (op ``openings`` or ``error``), or
    ``None`` once the connection is lost."""
    budget = min(max_bytes, SERVER_FRAME_BYTES) // 2
    out: list[EnvStart | None] = []
    answered = False
    while len(out) < len(tasks):
        pending = tasks[len(out) :]
        n = _chunk(pending, budget)
        if n == 0:  # one task over the frame limit: a reset could not send it either
            out.append(None)
            continue
        msg = {
            "op": "openings",
            "tasks": list(pending[:n]),
            "timeout_s": 0.8 * timeout_s,  # answer with what is settled before we give up
            "max_bytes": max_bytes - 4096,
        }
        reply = await request(msg, "openings")
        if reply is not None and reply["op"] == "error" and not answered:
            return None  # an older server: unknown op
        answered = True
        entries = reply.get("openings") if reply is not None else None
        if not isinstance(entries, list) or not 0 < len(entries) <= n:
            return out + [None] * len(pending)  # lost or garbled: the rest unmeasured
        out += [_start(e) for e in entries]
    return out
