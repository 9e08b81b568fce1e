"""The startup prompt measurement asks a ``serve-env`` server for many tasks' openings in one
session (its ``openings`` op). Before, a remote environment could not derive other tasks'
openings, so the measurement opened one session and reset one episode per task: 10,000 sessions
for 10,000 tasks."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.envs.server_thread import serve_in_thread
from toolgrpo.data.task import Task
from toolgrpo.envs import remote_openings, server_openings
from toolgrpo.envs import server as server_mod
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.envs.remote import RemoteEnv, RemoteOptions
from toolgrpo.envs.server_session import Session
from toolgrpo.models.tiny import build_tiny_tokenizer
from toolgrpo.rollout.prompts import env_starts, filter_overlong, opening_length
from toolgrpo.tools.types import ToolCall, ToolResult

ENV = "openings_test"
SPEC = {"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}


@register_env(ENV)
class OpeningsEnv(Env):
    """A system prompt of the task's own, one tool; ``derive`` (option) tells others' openings
    from one reset; ``fail_reset`` / ``sleep`` (task meta) make a reset raise or hang."""

    resets = 0
    seen_answers: list[str] = []

    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        self.task = task
        self.derive = bool(options.get("derive"))

    @staticmethod
    def opening(task: Task) -> EnvStart:
        system = {"role": "system", "content": f"you serve {task.task_id}"}
        return EnvStart([system, *(dict(m) for m in task.messages)], [SPEC])

    async def reset(self) -> EnvStart:
        cls = type(self)
        cls.resets += 1
        cls.seen_answers.append(self.task.ground_truth + str(self.task.meta.get("output_sft", "")))
        if self.task.meta.get("fail_reset"):
            raise RuntimeError("reset exploded")
        await asyncio.sleep(float(self.task.meta.get("sleep", 0)))
        return self.opening(self.task)

    def opening_for(self, task: Task, start: EnvStart) -> EnvStart | None:
        return self.opening(task) if self.derive and not task.meta else None

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        return []

    async def reward(self, transcript: Transcript) -> EnvReward:
        return EnvReward(0.0)


def make_tasks(n: int, **meta_at: dict[str, Any]) -> list[Task]:
    """``meta_at``: ``t<i>`` -> that task's meta."""
    out = []
    for i in range(n):
        msgs = ({"role": "user", "content": "word " * (3 * i)},)
        meta = {"output_sft": f"solution {i}", **meta_at.get(f"t{i}", {})}
        out.append(Task(f"t{i}", msgs, f"answer-{i}", task_type="remote_open", meta=meta))
    return out


SESSIONS: list[Session] = []


class CountedSession(Session):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        SESSIONS.append(self)


class OldSession(CountedSession):
    """A server from before the op: it answers ``openings`` with 'unknown op'."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        del self._ops["openings"]


@contextmanager
def server(
    monkeypatch: pytest.MonkeyPatch, session: type[Session] = CountedSession, **options: Any
) -> Iterator[str]:
    monkeypatch.setattr(server_mod, "Session", session)
    SESSIONS.clear()
    OpeningsEnv.resets = 0
    OpeningsEnv.seen_answers = []
    with serve_in_thread(ENV, options) as url:
        yield url


def router(url: str) -> EnvRouter:
    return EnvRouter({"remote_open": {"type": "remote", "url": url}})


def remote(url: str, task: Task) -> RemoteEnv:
    return RemoteEnv(task, RemoteOptions.parse({"url": url}))


async def per_task_resets(url: str, tasks: list[Task]) -> list[EnvStart | None]:
    out: list[EnvStart | None] = []
    for t in tasks:
        env = remote(url, t)
        start = await env.reset()
        out.append(None if env.fatal_error else start)
        await env.close()
    return out


@pytest.mark.parametrize("derive", [False, True])
def test_openings_equal_per_task_resets_without_the_answer(monkeypatch, derive) -> None:
    tasks = make_tasks(5)
    with server(monkeypatch, derive=derive) as url:
        env = remote(url, tasks[0])
        got = asyncio.run(env.openings_for(tasks))
        batch_resets = OpeningsEnv.resets
        want = asyncio.run(per_task_resets(url, tasks))
    assert got == want == [OpeningsEnv.opening(t) for t in tasks]
    assert batch_resets == (1 if derive else 5)
    assert set(OpeningsEnv.seen_answers) == {""}  # no answer, no reference solution
    assert env.fatal_error is None and env._ws is None  # its session closed


def test_the_measurement_uses_one_session_for_many_tasks(monkeypatch) -> None:
    tasks = make_tasks(40)
    monkeypatch.setattr(remote_openings, "PER_REQUEST", 16)  # three requests, one session
    with server(monkeypatch) as url:
        starts = env_starts(router(url), tasks)
        assert len(SESSIONS) == 1 and SESSIONS[0].openings_served == 3
        assert starts == [OpeningsEnv.opening(t) for t in tasks]
        tok = build_tiny_tokenizer()
        lengths = [opening_length(tok, OpeningsEnv.opening(t)) for t in tasks]
        limit = sorted(lengths)[20]
        kept = filter_overlong(tok, tasks, limit, router(url))
    assert kept == [t for t, n in zip(tasks, lengths, strict=True) if n <= limit]
    assert 0 < len(kept) < len(tasks) and len(SESSIONS) == 2


def test_replies_cut_by_size_are_asked_again(monkeypatch) -> None:
    tasks = make_tasks(30)
    # max_concurrency: openings_for goes through the slot wrapper too
    spec = {"type": "remote", "url": "", "max_message_bytes": 8192, "max_concurrency": 1}
    with server(monkeypatch) as url:
        envs = EnvRouter({"remote_open": {**spec, "url": url}})
        starts = env_starts(envs, tasks)
        assert len(SESSIONS) == 1 and SESSIONS[0].openings_served > 2
    assert starts == [OpeningsEnv.opening(t) for t in tasks]


def test_an_older_server_gets_per_task_resets(monkeypatch) -> None:
    tasks = make_tasks(6)
    with server(monkeypatch, OldSession) as url:
        starts = env_starts(router(url), tasks)
        # the refused openings session, then the first env's reset and one per other task
        assert len(SESSIONS) == 1 + 6 and OpeningsEnv.resets == 6
    assert starts == [OpeningsEnv.opening(t) for t in tasks]


@pytest.mark.parametrize("bad", [0, 2])
def test_a_task_that_cannot_open_is_unmeasured_alone(monkeypatch, bad) -> None:
    tasks = make_tasks(5, **{f"t{bad}": {"fail_reset": True}})
    with server(monkeypatch, derive=True) as url:
        starts = env_starts(router(url), tasks)
        assert len(SESSIONS) == 1
    want: list[EnvStart | None] = [OpeningsEnv.opening(t) for t in tasks]
    want[bad] = None
    assert starts == want


def test_a_dead_server_leaves_the_tasks_unmeasured(caplog) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nobody listens there
    tasks = make_tasks(4)
    kept = filter_overlong(build_tiny_tokenizer(), tasks, 1, router(f"ws://127.0.0.1:{port}/ws"))
    assert kept == tasks and "kept 4 tasks unmeasured" in caplog.text


def _reply(tasks: list[Task], **msg: Any) -> list[dict[str, Any]]:
    make = lambda t: OpeningsEnv(t, {})  # noqa: E731
    wire = [{"task_id": t.task_id, "messages": list(t.messages), "meta": t.meta} for t in tasks]
    got = asyncio.run(server_openings.openings_reply(make, {"tasks": wire, **msg}))
    return got["openings"]


def test_a_hung_reset_costs_its_task_not_the_request() -> None:
    """At the deadline the reply holds the settled first tasks; a first task still running gets
    an error entry, so every request settles one task at least."""
    tasks = make_tasks(3, t1={"sleep": 30})
    got = _reply(tasks, timeout_s=1)
    assert [e["op"] for e in got] == ["start"]  # t1 hung: t1 and t2 are asked again
    got = _reply(tasks[1:], timeout_s=1)
    assert got == [{"op": "error", "message": "reset did not return within 1s"}]
    got = _reply(make_tasks(3, t1={"fail_reset": True}))
    assert [e["op"] for e in got] == ["start", "error", "start"]
    assert "reset exploded" in got[1]["message"]


def test_a_reply_stays_under_the_clients_size_limit() -> None:
    tasks = make_tasks(50)
    got = _reply(tasks, max_bytes=4096)
    assert 0 < len(got) < 50 and len(json.dumps({"op": "openings", "openings": got})) <= 4096
    assert [e["messages"] for e in got] == [
        OpeningsEnv.opening(t).messages for t in tasks[: len(got)]
    ]
    big = Task("big", ({"role": "user", "content": "x" * 10_000},), "")
    assert _reply([big, *tasks], max_bytes=4096)[0]["op"] == "error"  # alone, and over it


def test_openings_count_as_the_start_of_a_session(monkeypatch) -> None:
    """A measuring session has no episode: answered openings, not a reset, end its handshake
    deadline, and the session's idle limit applies after."""
    with server(monkeypatch, handshake_timeout_s=0.5) as url:

        async def measure() -> list[str]:
            ops = []
            async with connect(url) as ws:
                for _ in range(2):
                    await ws.send(
                        json.dumps({"op": "openings", "tasks": [{"task_id": 1, "messages": []}]})
                    )
                    ops.append(json.loads(await ws.recv())["op"])
                    await asyncio.sleep(0.8)
            return ops

        assert asyncio.run(measure()) == ["openings", "openings"]
