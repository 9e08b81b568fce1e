"""serve-env refuses what a web page can send: a WebSocket handshake whose ``Origin`` is not
allow-listed (cross-site WebSocket hijacking: any page could call the env's tools), and a request
whose ``Host`` is not the bound address (DNS rebinding). Trainers and scripts, which send no
``Origin`` and name the bound address, play as before."""

from __future__ import annotations

import asyncio
import base64
import os
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.envs.server_thread import serve_in_thread
from toolgrpo.data.task import Task
from toolgrpo.envs.remote import RemoteEnv, RemoteOptions
from toolgrpo.envs.server import create_app
from toolgrpo.envs.server_guard import allowed_hosts, normalize_origin, refusal
from toolgrpo.tools.types import ToolCall

EVIL = "http://evil.example"


def _port(url: str) -> int:
    return int(url.removeprefix("ws://127.0.0.1:").removesuffix("/ws"))


def raw_status(url: str, path: str, headers: dict[str, str], upgrade: bool = False) -> str:
    """The status line the server answers to a request with exactly these headers."""
    lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    if upgrade:
        key = base64.b64encode(os.urandom(16)).decode()
        lines += [
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return s.recv(4096).decode("latin-1").splitlines()[0]


async def play(url: str) -> tuple[str, str | None]:
    """A trainer's episode: reset, one calculator call, close; (tool text, fatal error)."""
    task = Task("c#0", ({"role": "user", "content": "6*7?"},), "42", "calculator", "calculator")
    env = RemoteEnv(task, RemoteOptions.parse({"url": url, "timeout_s": 20}))
    try:
        await env.reset()
        results = await env.step([ToolCall("calculate", {"expression": "6*7"}, id="c")])
    finally:
        await env.close()
    return (results[0].text if results else ""), env.fatal_error


async def handshake(url: str, origin: str | None) -> None:
    async with connect(url, origin=origin, open_timeout=10) as ws:  # type: ignore[arg-type]
        await ws.send('{"op": "close"}')
        await ws.recv()


def test_a_web_page_origin_is_refused_and_a_trainer_still_plays():
    """Was: ``Origin: http://evil.example`` got ``reset -> start; step -> 42``."""
    with serve_in_thread("calculator") as url:
        with pytest.raises(InvalidStatus) as refused:
            asyncio.run(handshake(url, EVIL))
        assert refused.value.response.status_code == 403
        assert b"evil.example" in refused.value.response.body
        text, fatal = asyncio.run(play(url))  # no Origin: a trainer
        assert fatal is None and "42" in text
        headers = {"Host": f"127.0.0.1:{_port(url)}", "Origin": EVIL}
        assert " 403 " in raw_status(url, "/info", headers)
        assert " 403 " in raw_status(url, "/health", headers)


def test_allow_origin_admits_that_page_only():
    with serve_in_thread("calculator", allow_origins=["http://localhost:3000/"]) as url:
        asyncio.run(handshake(url, "http://localhost:3000"))  # allowed: no error
        with pytest.raises(InvalidStatus):
            asyncio.run(handshake(url, "http://localhost:3001"))
        with pytest.raises(InvalidStatus):
            asyncio.run(handshake(url, "null"))  # a sandboxed frame or a file:// page


def test_a_host_other_than_the_bound_address_is_refused():
    """DNS rebinding: a page on evil.example (resolving to 127.0.0.1) read ``/info``."""
    with serve_in_thread("calculator") as url:
        port = _port(url)
        assert " 403 " in raw_status(url, "/info", {"Host": f"evil.example:{port}"})
        ws = raw_status(url, "/ws", {"Host": f"evil.example:{port}"}, upgrade=True)
        assert " 403 " in ws
        for name in ("127.0.0.1", "localhost", "[::1]"):
            assert " 200 " in raw_status(url, "/info", {"Host": f"{name}:{port}"}), name
        ok = raw_status(url, "/ws", {"Host": f"localhost:{port}"}, upgrade=True)
        assert " 101 " in ok


def test_the_allowed_hosts_of_each_bind():
    assert allowed_hosts("0.0.0.0") is None and allowed_hosts("::") is None  # token-guarded
    assert allowed_hosts("127.0.0.1") >= {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts("10.1.2.3") == {"10.1.2.3"}
    assert allowed_hosts("10.1.2.3", ["Node5.cluster"]) == {"10.1.2.3", "node5.cluster"}
    hosts = allowed_hosts("10.1.2.3")
    assert refusal({"host": "10.1.2.3:8900"}, hosts, frozenset()) is None
    assert "--allow-host" in (refusal({"host": "node5:8900"}, hosts, frozenset()) or "")
    assert refusal({}, hosts, frozenset()) is None  # no Host (HTTP/1.0 scripts): not a browser


def test_bad_allow_origin_is_refused_at_startup():
    assert normalize_origin("HTTP://LocalHost:3000/") == "http://localhost:3000"
    for bad in ("localhost:3000", "http://x/path", "ftp://x", "null"):
        with pytest.raises(ValueError, match="--allow-origin"):
            create_app("calculator", {}, allow_origins=[bad])


def test_serve_env_allow_origin_option(monkeypatch, capsys):
    """``toolgrpo serve-env --allow-origin ORIGIN --allow-host NAME`` reach ``serve``; a bad
    origin is one line, exit 2."""
    from toolgrpo.cli import main
    from toolgrpo.envs import server

    seen = {}
    monkeypatch.setattr(server, "serve", lambda *a, **kw: seen.update(kw))
    argv = ["serve-env", "calculator", "--allow-origin", "http://localhost:3000"]
    assert main([*argv, "--allow-host", "node5"]) == 0
    assert seen["allow_origins"] == ["http://localhost:3000"] and seen["allow_hosts"] == ["node5"]
    monkeypatch.undo()
    assert main(["serve-env", "calculator", "--allow-origin", "evil", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "toolgrpo serve-env: error: --allow-origin expects" in err and "Traceback" not in err
