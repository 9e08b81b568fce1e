"""``toolgrpo serve-env``'s app run by uvicorn in a thread, for tests that need a live server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import uvicorn

from toolgrpo.envs.server import create_app
from toolgrpo.envs.server_http import HEADER_TIMEOUT_S, default_max_connections, uvicorn_options


@contextmanager
def serve_in_thread(
    env_type: str,
    options: Mapping[str, Any] | None = None,
    token: str | None = None,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    max_connections: int | None = None,
    **limits: Any,
) -> Iterator[str]:
    """The app on a pre-bound free loopback port (no race for the port); yields the ws:// URL
    and stops the server on exit. ``limits``: ``create_app``'s idle and handshake timeouts and
    session cap; the socket limits are ``serve``'s."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(env_type, dict(options or {}), token, **limits)
    cap = max_connections or default_max_connections(app.state.max_sessions)
    socket_limits = uvicorn_options(header_timeout_s, cap)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", **socket_limits)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
