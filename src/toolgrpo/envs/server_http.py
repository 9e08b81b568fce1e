"""``serve-env``'s sockets before they are sessions: a deadline and a size cap for request
headers, a cap on open connections, and the uvicorn options that carry them.

uvicorn (httptools or h11) has no header-read timeout: its keep-alive timer starts only after a
response and stops at the next byte, and ``limit_concurrency`` answers 503 only once a request's
headers are complete. A client trickling header bytes held its socket forever (a probe of 300
such sockets left 314 descriptors open after 30 s), and httptools reads headers of any size.
``guarded_protocol`` wraps the HTTP protocol uvicorn would pick with those limits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # one WebSocket frame (larger: closed with code 1009)
MAX_HEADER_BYTES = 64 * 1024  # a request's line and headers (larger: HTTP 431)
HEADER_TIMEOUT_S = 10.0
CONNECTION_HEADROOM = 64  # connections beyond --max-sessions: /health, /info, refused handshakes
_FD_HEADROOM = 256  # descriptors beyond the connection cap: the env's tools, logs, the listener


def default_max_connections(max_sessions: int) -> int:
    return max_sessions + CONNECTION_HEADROOM


def _response(status: int, reason: str, text: str) -> bytes:
    body = text.encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class _Tally:
    """Connections cut off, by reason; logged at most once a minute, so an attack cannot flood
    the log."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._logged = 0.0

    def add(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged >= 60.0:
            self._logged = now
            log.warning("serve-env closed connections so far: %s", self.counts)


def guarded_protocol(
    header_timeout_s: float, max_connections: int, base: type[asyncio.Protocol] | None = None
) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's automatic HTTP protocol by default) with these limits: a connection
    past ``max_connections`` open ones gets HTTP 503 and is closed; one whose request line and
    headers are not complete ``header_timeout_s`` after it opened (or after its previous
    response) is closed, with HTTP 408 if it had sent part of them; one sending more than
    ``MAX_HEADER_BYTES`` of them gets HTTP 431. Nothing changes once a request is being served
    or the connection became a WebSocket (whose own limits are the app's)."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        base = AutoHTTPProtocol
    tally = _Tally()

    class GuardedHTTPProtocol(base):  # type: ignore[valid-type, misc]
        _deadline: asyncio.TimerHandle | None = None
        _received = 0  # bytes of the request still waiting for its headers
        _cut = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:  # uvicorn's set, WebSockets included
                msg = f"server at its connection limit ({max_connections}): retry later"
                self._cut_off("connection_limit", _response(503, "Service Unavailable", msg))
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._cut:
                return
            waiting = self._deadline is not None
            super().data_received(data)
            if not waiting or self.transport.is_closing():
                return
            if self._serving():
                self._disarm()
                return
            self._received += len(data)
            if self._received > MAX_HEADER_BYTES:
                msg = f"request headers over {MAX_HEADER_BYTES} bytes"
                self._cut_off("headers_too_large", _response(431, "Header Too Large", msg))

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # a kept-alive connection's next request gets the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _serving(self) -> bool:
            """A request's headers are in (it is being served), or it became a WebSocket."""
            if self.transport.get_protocol() is not self:
                return True
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._received = 0
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if self.transport.is_closing() or self._serving():
                return  # being served: the next response re-arms the deadline
            msg = f"request headers not complete within {header_timeout_s:g}s"
            reply = _response(408, "Request Timeout", msg) if self._received else b""
            self._cut_off("header_timeout", reply)

        def _cut_off(self, reason: str, reply: bytes) -> None:
            self._disarm()
            self._cut = True
            tally.add(reason)
            if reply:
                self.transport.write(reply)
            self.transport.close()

    return GuardedHTTPProtocol


def uvicorn_options(header_timeout_s: float, max_connections: int) -> dict[str, Any]:
    """The options ``serve`` gives uvicorn (tests serving in a thread use them too); raises
    ``ValueError`` for limits out of range."""
    if not header_timeout_s > 0:
        raise ValueError(f"--header-timeout must be > 0 seconds, got {header_timeout_s}")
    if max_connections < 1:
        raise ValueError(f"--max-connections must be >= 1, got {max_connections}")
    # No keepalive pings: a trainer busy generating for a minute must not lose its sessions;
    # a dead peer is noticed by the closed socket, the idle timeout or the client's timeout.
    return {
        "http": guarded_protocol(header_timeout_s, max_connections),
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,  # h11's own cap (httptools has none)
        "ws_max_size": MAX_MESSAGE_BYTES,
        "ws_ping_interval": None,
        "ws_ping_timeout": None,
    }


def raise_fd_limit(max_connections: int) -> None:
    """Lift the soft open-file limit to fit the connection cap: each socket is a descriptor, and
    running out of them fails the env's tools and stalls ``accept`` rather than refusing."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    want = max_connections + _FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        new = soft
    if new < want:
        log.warning(
            "the open-file limit (%d) is below --max-connections + %d: lower --max-connections "
            "or raise `ulimit -n`",
            new,
            _FD_HEADROOM,
        )
