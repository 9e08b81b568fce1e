"""``serve-env``'s answer to requests from a web browser: a page the user has open must not reach
the environment's tools.

A browser lets any page open ``ws://127.0.0.1:8900/ws`` (WebSockets are not bound by the
same-origin policy) and sends the page's ``Origin``; a page on a name that resolves to 127.0.0.1
(DNS rebinding) reaches ``/info`` with its own name as ``Host``. Trainers and scripts send no
``Origin`` and name the server by the address it is bound to. So a request is refused (HTTP 403,
before any handshake) when its ``Origin`` is not allow-listed (none are by default;
``--allow-origin`` adds one), or when its ``Host`` names anything but the bound address (or, bound
to loopback, ``localhost`` and the loopback addresses; ``--allow-host`` adds a name). A wildcard
bind (``0.0.0.0``, ``::``) takes any ``Host``: it serves only with a token.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from toolgrpo.envs.wire import is_loopback

log = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def _host_name(value: str) -> str:
    """The name part of a ``Host`` header or an address: no port, no brackets, lower case."""
    value = value.strip().lower().rstrip(".")
    if value.startswith("["):  # [::1]:8900
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:  # name:port
        return value.partition(":")[0]
    return value  # a name, or a bare IPv6 address


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The ``Host`` names a server bound to ``bind_host`` answers, or None for any (a wildcard
    bind). ``extra``: ``--allow-host`` names."""
    name = _host_name(bind_host)
    if name in WILDCARDS:
        return None
    names = {name, *(_host_name(h) for h in extra)}
    if is_loopback(name):
        names.update(LOOPBACK_NAMES)
    try:  # 127.0.0.1 and its other spellings (127.000.000.001 is refused by ipaddress)
        names.add(str(ipaddress.ip_address(name)))
    except ValueError:
        pass
    return frozenset(names)


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, as browsers send it; raises ``ValueError`` for a
    value that is no origin (for ``--allow-origin``)."""
    text = origin.strip().lower().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise ValueError(
            f"--allow-origin expects scheme://host[:port] (e.g. http://localhost:3000), "
            f"got {origin!r}"
        )
    return f"{parts.scheme}://{parts.netloc}"


def refusal(
    headers: dict[str, str], hosts: frozenset[str] | None, origins: frozenset[str]
) -> str | None:
    """Why a request with these (lower-case) headers is refused, or None to serve it."""
    origin = headers.get("origin")
    if origin is not None and origin.strip().lower().rstrip("/") not in origins:
        return (
            f"origin {origin[:100]!r} is not allowed: serve-env answers no web page unless "
            "started with --allow-origin ORIGIN"
        )
    host = headers.get("host")
    if hosts is not None and host is not None and _host_name(host) not in hosts:
        return (
            f"host {host[:100]!r} is not the address this server is bound to: connect to that "
            "address, or start serve-env with --allow-host NAME"
        )
    return None


class RequestGuard:
    """ASGI middleware: HTTP requests and WebSocket handshakes that ``refusal`` names are
    answered 403 before the app sees them."""

    def __init__(self, app: Any, hosts: frozenset[str] | None, origins: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins  # normalized (``normalize_origin``)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        why = refusal(headers, self.hosts, self.origins)
        if why is None:
            await self.app(scope, receive, send)
            return
        log.info("serve-env refused a request: %s", why)
        body = why.encode()
        head = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 403, "headers": head})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": 403, "headers": head})
            await send({"type": "websocket.http.response.body", "body": body})
        else:  # a server without denial responses: a plain refusal (HTTP 403 all the same)
            await send({"type": "websocket.close", "code": 1008, "reason": why[:120]})
