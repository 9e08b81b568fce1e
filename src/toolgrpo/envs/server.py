"""Serve any registered environment over a WebSocket, one connection per episode.

Running an environment in its own process (or machine) keeps heavy or fragile tools away from the
trainer: if the server dies, only the episodes it was serving end, with an error reward.

Protocol (JSON text frames; every request gets exactly one reply, in order)::

    {"op": "reset", "task": {task_id, messages, data_source, task_type, tools, meta}}
      -> {"op": "start", "messages": [...], "tools": [...], "max_turns": N, "single_turn": bool,
          "snapshot": bool}
    {"op": "step", "calls": [{name, arguments, raw, parse_error, id}, ...]}
      -> {"op": "results", "results": [{text, is_error, error_type, name, call_id, metrics}, ...],
          "fatal_error": str | null}
    {"op": "next_user", "messages": [...]}          -> {"op": "user", "messages": [...] | null}
    {"op": "reward", "transcript": {messages, text, stop_reason, num_turns, step},
     "ground_truth": str}  -> {"op": "reward", "score": x, "parts": {...}}
    {"op": "snapshot"}                               -> {"op": "snapshot", "id": k}
    {"op": "restore", "id": k}  (id defaults to the latest snapshot) -> {"op": "restored", "id": k}
    {"op": "close"}                                  -> {"op": "closed"}, then the socket closes
    {"op": "openings", "tasks": [task, ...], "timeout_s": s, "max_bytes": b}
      -> {"op": "openings", "openings": [{"op": "start", "messages", "tools"}
                                         | {"op": "error", "message"}, ...]}
    anything unusable -> {"op": "error", "message": "...", "request": op | null} (session lives on)

The first ``reset`` builds the session's environment with the server's fixed options (a client
cannot change them); a second ``reset`` on the same connection is refused. Snapshots stay on the
server, the client holds only their ids. ``openings`` (a trainer's startup prompt measurement)
answers many tasks' openings in one session, each from an environment built, reset and closed on
the server; its reply covers the request's first tasks, and the client asks again for the rest
(``server_openings.py``). ``GET /health`` is open; when the server has a token,
``GET /info`` (else 401) and the ``/ws`` handshake (else 403) need ``Authorization: Bearer <tok>``
(scheme name in any case). There is no ``/docs`` or ``/openapi.json``. A request carrying a
browser's ``Origin`` (unless ``--allow-origin`` names it) or a ``Host`` other than the bound
address (unless ``--allow-host`` names it) is refused with HTTP 403 (``server_guard.py``).

The answer stays with the trainer during the episode: the handshake reply's
``x-toolgrpo-ground-truth`` header says ``reward`` (the default: ``reset`` carries no ground truth,
``reward`` does, and the server puts it into the task the environment was built with just before
scoring) or ``reset`` (an environment type that sets ``needs_ground_truth_at_reset``, e.g. one that
runs the reference solution beside the model's calls, gets it with the task).

Limits on what one client can hold, and for how long (``serve``'s arguments): a connection must
send its request headers within ``header_timeout_s`` (uvicorn has no such deadline), and past
``max_connections`` open sockets a new one gets HTTP 503 (``server_http.py``). A WebSocket session
must start its episode (``reset``, or a first ``openings`` answered) within
``handshake_timeout_s`` of the upgrade (else code 1008); one idle for ``idle_timeout_s``, waiting
for a frame or for its client to read a reply, is closed (code 1001); past ``max_sessions`` open
sessions a new handshake is refused with HTTP 503. A frame that cannot be parsed (bad JSON, nested
too deeply) gets an error reply like any bad request; one over 16 MiB closes the session with
code 1009. Frames and ops: ``server_session.py``; startup input: ``server_setup.py``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, WebSocket, WebSocketDisconnect
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocketState

from toolgrpo.envs.registry import get_env_factory
from toolgrpo.envs.server_guard import RequestGuard, allowed_hosts, normalize_origin
from toolgrpo.envs.server_http import (
    HEADER_TIMEOUT_S,
    MAX_MESSAGE_BYTES,
    default_max_connections,
    raise_fd_limit,
    uvicorn_options,
)
from toolgrpo.envs.server_session import (
    Session,
    encode_reply,
    error_frame,
    needs_ground_truth_at_reset,
)
from toolgrpo.envs.server_setup import TOKEN_ENV, check_options, parse_options, read_token
from toolgrpo.envs.wire import GROUND_TRUTH_HEADER, is_loopback

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 2  # 2: the openings op
HANDSHAKE_TIMEOUT_S = 30.0
_Session = Session  # the names this module had before its split
_error = error_frame
__all__ = [
    "HANDSHAKE_TIMEOUT_S",
    "HEADER_TIMEOUT_S",
    "MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "TOKEN_ENV",
    "check_options",
    "create_app",
    "needs_ground_truth_at_reset",
    "parse_options",
    "read_token",
    "serve",
]


def _authorized(header: str | None, token: str | None) -> bool:
    """``Bearer <token>``; the scheme name is case-insensitive (RFC 7235), the token is not."""
    if token is None:
        return True
    scheme, _, given = (header or "").strip().partition(" ")
    ok = hmac.compare_digest(given.strip().encode(), token.encode())
    return scheme.lower() == "bearer" and ok


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    """Bounded (a client that reads nothing would hold a close forever); a client that went
    first (e.g. after a frame over the size limit, code 1009) is fine."""
    try:
        await asyncio.wait_for(websocket.close(code=code, reason=reason), 2.0)
    except (WebSocketDisconnect, RuntimeError, asyncio.TimeoutError):
        pass


def create_app(
    env_type: str,
    options: Mapping[str, Any],
    token: str | None = None,
    idle_timeout_s: float = 600.0,
    max_sessions: int = 1024,
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    host: str = "127.0.0.1",
    allow_hosts: Sequence[str] = (),
    allow_origins: Sequence[str] = (),
) -> FastAPI:
    """An app serving ``env_type`` from ``host`` (the address it is bound to: other ``Host``
    headers are refused, as are browsers' ``Origin`` outside ``allow_origins``); raises
    ``EnvConfigError`` now if the type or an option is unknown, ``ValueError`` for limits out of
    range or an origin that is not one."""
    if not idle_timeout_s > 0:
        raise ValueError(f"--idle-timeout must be > 0 seconds, got {idle_timeout_s}")
    if not handshake_timeout_s > 0:
        raise ValueError(f"--handshake-timeout must be > 0 seconds, got {handshake_timeout_s}")
    if max_sessions < 1:
        raise ValueError(f"--max-sessions must be >= 1, got {max_sessions}")
    origins = frozenset(normalize_origin(o) for o in allow_origins)
    factory = get_env_factory(env_type)
    options = dict(options)
    check_options(env_type, options)
    gt_when = b"reset" if needs_ground_truth_at_reset(factory) else b"reward"
    # No /docs, /redoc or /openapi.json: nothing to learn there for anyone without the token.
    app = FastAPI(
        title=f"toolgrpo env: {env_type}", docs_url=None, redoc_url=None, openapi_url=None
    )
    # Before any route: a web page the user has open reaches no endpoint (server_guard.py).
    app.add_middleware(RequestGuard, hosts=allowed_hosts(host, allow_hosts), origins=origins)
    app.state.sessions = 0
    app.state.max_sessions = max_sessions
    app.state.idle_closed = 0
    app.state.handshake_closed = 0
    # Known for env classes; for factory functions it is learnt from the first episode.
    app.state.supports_snapshot = getattr(factory, "supports_snapshot", None)

    def require_token(authorization: str | None = Header(default=None)) -> None:
        if not _authorized(authorization, token):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info", dependencies=[Depends(require_token)])
    async def info() -> dict[str, Any]:
        return {
            "env_type": env_type,
            "supports_snapshot": app.state.supports_snapshot,
            "protocol": PROTOCOL_VERSION,
            "sessions": app.state.sessions,
            "max_sessions": max_sessions,
            "idle_timeout_s": idle_timeout_s,
            "handshake_timeout_s": handshake_timeout_s,
            "ground_truth_at": gt_when.decode(),
        }

    async def run_session(websocket: WebSocket, session: Session) -> None:
        """Frames in, replies out, until the client closes, goes quiet or stops reading."""
        opened = time.monotonic()

        def budget() -> float:
            """Until its episode starts (or it is served openings) a session holds a slot but no
            env: it has handshake_timeout_s in all for that, not idle_timeout_s per frame."""
            if not session.started:
                return max(handshake_timeout_s - (time.monotonic() - opened), 0.0)
            return idle_timeout_s

        while True:
            try:
                frame = await asyncio.wait_for(websocket.receive(), budget())
            except asyncio.TimeoutError:  # a client that went quiet holds no slot forever
                if not session.started:
                    app.state.handshake_closed += 1
                    why = f"no episode started within {handshake_timeout_s:g}s"
                    await _close(websocket, 1008, why)
                else:
                    app.state.idle_closed += 1
                    log.info("closing a session idle for %gs", idle_timeout_s)
                    await _close(websocket, 1001, f"idle for {idle_timeout_s:g}s")
                return
            if frame["type"] == "websocket.disconnect":
                return
            text = frame.get("text")
            if text is None:
                text = (frame.get("bytes") or b"").decode("utf-8", "replace")
            reply = await session.handle(text)
            if session.env is not None:
                app.state.supports_snapshot = bool(session.env.supports_snapshot)
            try:  # a client that reads nothing must not pin its slot and env either
                await asyncio.wait_for(websocket.send_text(encode_reply(reply)), max(budget(), 1))
            except asyncio.TimeoutError:
                app.state.idle_closed += 1
                log.info("closing a session whose client stopped reading its replies")
                return
            if reply["op"] == "closed":
                return

    @app.websocket("/ws")
    async def episode(websocket: WebSocket) -> None:
        if not _authorized(websocket.headers.get("authorization"), token):
            # Closing before accept refuses the handshake (HTTP 403). A 401 denial response would
            # also work, but uvicorn then logs a spurious "returned without completing handshake".
            await websocket.close(code=1008, reason="missing or wrong bearer token")
            return
        if app.state.sessions >= max_sessions:
            msg = f"server at its session limit ({max_sessions}): retry later"
            try:
                await websocket.send_denial_response(PlainTextResponse(msg, status_code=503))
            except RuntimeError:  # an ASGI server without denial responses: a plain refusal
                await websocket.close(code=1013, reason=msg)
            return
        app.state.sessions += 1  # counted before accept: no await between check and count
        try:
            await websocket.accept(headers=[(GROUND_TRUTH_HEADER.encode(), gt_when)])
        except BaseException:
            app.state.sessions -= 1
            raise
        session = Session(env_type, options)
        try:
            await run_session(websocket, session)
        except (WebSocketDisconnect, RuntimeError, OSError):  # client gone mid-reply
            pass
        finally:
            app.state.sessions -= 1
            await session.close()
            if websocket.application_state == WebSocketState.CONNECTED:
                await _close(websocket, 1000, "")

    return app


def serve(
    env_type: str,
    options: Mapping[str, Any],
    host: str = "127.0.0.1",
    port: int = 8900,
    token: str | None = None,
    access_log: bool = False,
    idle_timeout_s: float = 600.0,
    max_sessions: int = 1024,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    max_connections: int | None = None,
    allow_hosts: Sequence[str] = (),
    allow_origins: Sequence[str] = (),
) -> None:
    """Run the server until interrupted; refuses a non-loopback address without a token.
    ``max_connections`` defaults to ``max_sessions`` plus room for health checks."""
    if not 1 <= port <= 65535:
        raise ValueError(f"--port must be in 1..65535, got {port}")
    if not is_loopback(host) and not token:
        raise ValueError(
            f"refusing to serve on {host!r} without a token: anyone who can reach it could run "
            f"the environment's tools. Set {TOKEN_ENV} or pass --token-file, or bind to 127.0.0.1"
        )
    if max_connections is None:
        max_connections = default_max_connections(max_sessions)
    elif max_connections < max_sessions:
        raise ValueError(
            f"--max-connections ({max_connections}) must be at least --max-sessions "
            f"({max_sessions}): every session holds a connection"
        )
    uv_options = uvicorn_options(header_timeout_s, max_connections)
    app = create_app(
        env_type,
        options,
        token,
        idle_timeout_s,
        max_sessions,
        handshake_timeout_s,
        host,
        allow_hosts,
        allow_origins,
    )
    import uvicorn

    raise_fd_limit(max_connections)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="info",
        access_log=access_log,  # one line per episode is noise at training scale
        **uv_options,
    )
