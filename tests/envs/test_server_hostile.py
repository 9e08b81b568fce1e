"""serve-env under hostile clients: slow headers, too many sockets, a silent WebSocket, a client
that reads nothing, and frames that cannot be parsed. Each test names the defect it pins; a real
client (``RemoteEnv``) must keep working beside the attack.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.uri import parse_uri

from tests.envs.server_thread import serve_in_thread
from toolgrpo.data.task import Task
from toolgrpo.envs import server_session
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import register_env
from toolgrpo.envs.remote import RemoteEnv, RemoteOptions
from toolgrpo.envs.server import serve
from toolgrpo.tools.types import ToolCall, ToolResult

ENV = "hostile_echo_test"


@register_env(ENV)
class EchoEnv(Env):
    """``echo`` returns its ``text`` argument; the reward is 1 when the answer is in the text."""

    max_turns = 2

    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        self.task = task

    async def reset(self) -> EnvStart:
        return EnvStart(list(self.task.messages), [])

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        return [
            ToolResult(str(c.arguments.get("text", "")), name=c.name, call_id=c.id) for c in calls
        ]

    async def reward(self, t: Transcript) -> EnvReward:
        return EnvReward(float(self.task.ground_truth in t.text))


def make_task(i: int = 0) -> Task:
    return Task(f"t{i}", ({"role": "user", "content": f"say {i}"},), f"answer-{i}")


def http(ws_url: str) -> str:
    return ws_url.replace("ws://", "http://").removesuffix("/ws")


def host_port(ws_url: str) -> tuple[str, int]:
    host, _, port = ws_url.removeprefix("ws://").removesuffix("/ws").partition(":")
    return host, int(port)


def sessions(ws_url: str) -> int:
    return httpx.get(http(ws_url) + "/info").json()["sessions"]


async def episode(url: str, i: int, pause_s: float = 0.0) -> tuple[float, str, str | None]:
    """A real client's episode (reset, a pause, one call, the reward)."""
    env = RemoteEnv(make_task(i), RemoteOptions.parse({"url": url, "timeout_s": 20}))
    await env.reset()
    await asyncio.sleep(pause_s)
    results = await env.step([ToolCall("echo", {"text": f"answer-{i}"}, id="c")])
    reward = await env.reward(Transcript([], results[0].text if results else "", "answer", 1))
    await env.close()
    return reward.score, results[0].text, env.fatal_error


async def slow_headers(url: str, give_up_s: float, out: list[float | None]) -> None:
    """A slowloris client: a request line, then one header line every 0.25 s, never the blank
    line that ends them. Appends the seconds until the server closed it (``None``: never)."""
    host, port = host_port(url)
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
    try:
        while time.monotonic() - t0 < give_up_s:
            try:
                data = await asyncio.wait_for(reader.read(4096), 0.25)
            except asyncio.TimeoutError:
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
                continue
            if not data:  # EOF: the server closed it (after a 408, which is read first)
                out.append(time.monotonic() - t0)
                return
        out.append(None)
    except (ConnectionError, OSError):
        out.append(time.monotonic() - t0)
    finally:
        writer.close()


def test_slow_header_clients_are_closed_while_a_real_session_works() -> None:
    """Defect: uvicorn has no deadline for request headers, so sockets trickling header lines
    stayed open for good (300 of them: 314 descriptors after 30 s). Now each is closed at
    ``--header-timeout``, and an episode played meanwhile (lasting longer than that timeout)
    is unaffected."""
    n, timeout = 200, 1.0

    async def attack(url: str) -> tuple[list[float | None], tuple[float, str, str | None]]:
        closed: list[float | None] = []
        clients = [asyncio.create_task(slow_headers(url, 8.0, closed)) for _ in range(n)]
        await asyncio.sleep(0.3)  # the attack is under way
        played = await episode(url, 7, pause_s=1.5)
        await asyncio.gather(*clients)
        return closed, played

    with serve_in_thread(ENV, header_timeout_s=timeout) as url:
        closed, played = asyncio.run(attack(url))
        assert sessions(url) == 0 and httpx.get(http(url) + "/health").status_code == 200
    assert played == (1.0, "answer-7", None)
    still_open = [t for t in closed if t is None]
    assert not still_open, f"{len(still_open)} of {n} slow sockets still open after 8 s"
    assert len(closed) == n and timeout * 0.9 <= min(closed) and max(closed) <= timeout + 2.5


def test_oversized_and_kept_alive_slow_headers() -> None:
    """Defects: httptools reads request headers of any size (a client could send gigabytes of
    them), and a kept-alive connection that trickled its next request after a response was never
    closed (uvicorn's keep-alive timer stops at the first byte)."""

    async def go(url: str) -> tuple[bytes, bytes, float]:
        host, port = host_port(url)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Big: " + b"a" * 100_000)
        big = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        ok = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 5.0)
        t0 = time.monotonic()
        writer.write(b"GET /health HTTP/1.1\r\n")
        try:
            while not reader.at_eof() and time.monotonic() - t0 < 8.0:
                try:
                    await asyncio.wait_for(reader.read(4096), 0.25)
                except asyncio.TimeoutError:
                    writer.write(b"X-Slow: 1\r\n")
        except (ConnectionError, OSError):
            pass
        writer.close()
        return big, ok, time.monotonic() - t0

    with serve_in_thread(ENV, header_timeout_s=1.0) as url:
        big, ok, took = asyncio.run(go(url))
    assert big.startswith(b"HTTP/1.1 431") and ok.startswith(b"HTTP/1.1 200")
    assert took < 4.0


def test_connections_are_capped_not_only_sessions() -> None:
    """Defect: ``--max-sessions`` counted WebSocket sessions only; any number of sockets could
    be opened. Past ``--max-connections`` a socket gets HTTP 503 and is closed at once; when the
    holders leave, a real session works again."""
    cap = 12

    async def go(url: str) -> tuple[bytes, tuple[float, str, str | None]]:
        host, port = host_port(url)
        held = [await asyncio.open_connection(host, port) for _ in range(cap)]
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            refused = await asyncio.wait_for(reader.read(), 5.0)  # all of it, up to EOF
        finally:
            writer.close()
        for _, w in held:
            w.close()
        await asyncio.sleep(0.3)  # the server sees them go
        return refused, await episode(url, 3)

    with serve_in_thread(ENV, header_timeout_s=30.0, max_connections=cap, max_sessions=4) as u:
        refused, played = asyncio.run(go(u))
    assert refused.startswith(b"HTTP/1.1 503") and b"connection limit (12)" in refused
    assert played == (1.0, "answer-3", None)


def test_connection_limit_options_are_checked(monkeypatch, capsys) -> None:
    import uvicorn

    from toolgrpo.cli import main

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("serve-env started serving despite bad input")

    monkeypatch.setattr(uvicorn, "run", never)
    with pytest.raises(ValueError, match="--max-connections"):
        serve(ENV, {}, max_sessions=10, max_connections=5)
    for argv, want in [
        (["--header-timeout", "0"], "--header-timeout must be > 0"),
        (["--handshake-timeout", "-1"], "--handshake-timeout must be > 0"),
        (["--max-connections", "8", "--max-sessions", "16"], "must be at least --max-sessions"),
    ]:
        assert main(["serve-env", "calculator", *argv]) == 2
        err = capsys.readouterr().err
        assert want in err and len(err.strip().splitlines()) == 1, err


def test_a_websocket_that_never_starts_its_episode_is_closed() -> None:
    """Defect: an upgraded connection that sent nothing (or only garbage) held a session slot
    for the whole idle timeout (600 s), so ``--max-sessions`` such clients locked trainers out.
    It now has ``--handshake-timeout`` to start its episode, and is closed with code 1008."""

    async def silent(url: str, garbage: bool) -> tuple[int | None, float]:
        t0 = time.monotonic()
        async with connect(url, proxy=None) as ws:
            try:
                while True:
                    if garbage:
                        await ws.send("not json")
                    await asyncio.wait_for(ws.recv(), 10.0)
                    await asyncio.sleep(0.1)
            except ConnectionClosed as e:
                return (e.rcvd.code if e.rcvd else None), time.monotonic() - t0

    with serve_in_thread(ENV, handshake_timeout_s=0.6, idle_timeout_s=60.0) as url:
        for garbage in (False, True):
            code, took = asyncio.run(silent(url, garbage))
            assert code == 1008 and 0.5 <= took < 5.0, (garbage, code, took)
        assert asyncio.run(episode(url, 1, pause_s=1.0)) == (1.0, "answer-1", None)
        assert sessions(url) == 0


def test_a_client_that_reads_no_replies_loses_its_session() -> None:
    """Defect: the server waited forever to send a reply to a client that never read, pinning
    its session and environment (the idle timeout covered receiving only)."""
    with serve_in_thread(ENV, idle_timeout_s=1.0) as url:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # no room to absorb replies
        sock.connect(host_port(url))
        ws = ClientProtocol(parse_uri(url))
        ws.send_request(ws.connect())
        sock.sendall(b"".join(ws.data_to_send()))
        while ws.state is State.CONNECTING:
            ws.receive_data(sock.recv(4096))
        assert ws.state is State.OPEN
        ws.send_text(json.dumps({"op": "reset", "task": {"task_id": "x", "messages": []}}).encode())
        big = {"op": "step", "calls": [{"name": "echo", "arguments": {"text": "x" * 2**20}}]}
        for _ in range(16):  # replies of 1 MiB each, never read: the buffers fill
            ws.send_text(json.dumps(big).encode())
        sock.settimeout(2.0)
        try:
            sock.sendall(b"".join(ws.data_to_send()))
        except TimeoutError:  # the server stopped reading too: it is stuck sending
            pass
        deadline = time.monotonic() + 15
        while sessions(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = sessions(url)
        sock.close()
        assert left == 0
        assert asyncio.run(episode(url, 2)) == (1.0, "answer-2", None)


def test_frames_nested_too_deeply_get_an_error_reply() -> None:
    """Defect: a frame of 100,000 ``[`` made ``json`` raise ``RecursionError`` (a
    ``RuntimeError``), which the server took for a lost client: the session closed without a
    reply. It is a bad frame like any other: an error reply, and the session goes on."""

    async def go(url: str) -> list[dict[str, Any]]:
        replies = []
        async with connect(url, proxy=None) as ws:
            for frame in (
                "[" * 100_000,
                ('{"op": "reset", "task": ' + "[" * 100_000).encode(),  # a binary frame
                json.dumps({"op": "reset", "task": {"task_id": "n", "messages": []}}),
                "{" + '"a":{' * 50_000,
                json.dumps({"op": "close"}),
            ):
                await ws.send(frame)
                replies.append(json.loads(await asyncio.wait_for(ws.recv(), 10.0)))
        return replies

    with serve_in_thread(ENV) as url:
        replies = asyncio.run(go(url))
    assert [r["op"] for r in replies] == ["error", "error", "start", "error", "closed"]
    assert all("nested too deeply" in r["message"] for i, r in enumerate(replies) if i in (0, 1))
    assert replies[0]["request"] is None


def test_replies_that_cannot_be_encoded_become_error_replies() -> None:
    """An env echoing a structure nested too deeply to write back must not drop the session."""
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    text = server_session.encode_reply({"op": "user", "messages": deep})
    assert json.loads(text) == {
        "op": "error",
        "message": "the reply to this request could not be encoded: RecursionError",
        "request": "user",
    }
    with pytest.raises(server_session.WireError, match="nested too deeply"):
        server_session.decode_frame("[" * 100_000)
