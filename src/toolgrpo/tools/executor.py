"""Run one turn's tool calls concurrently and turn every failure into a result the model reads.

Nothing here raises into a rollout: parse errors, unknown tools, schema violations, exceptions
and timeouts all become ``ToolResult(is_error=True)`` whose text says what to fix. Only
cancellation of the caller, ``KeyboardInterrupt``, ``SystemExit`` and ``IsolationUnavailable``
(no worker process could be started: the environment's failure, not the model's) propagate.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, Protocol

from toolgrpo.tools.isolated import (
    DEFAULT_MEMORY_LIMIT_MB,
    IsolatedCrash,
    IsolatedTimeout,
    IsolationUnavailable,
)
from toolgrpo.tools.schema import Tool
from toolgrpo.tools.types import ToolCall, ToolResult

log = logging.getLogger(__name__)

EXPECTED_FORMAT = '<tool_call>{"name": "<tool name>", "arguments": {<JSON object>}}</tool_call>'
# The call a parse error shows as the format to use: the episode's tool-call format
# (``rollout.tool_parsers``), set around ``Env.step`` by the episode loop (``expecting``), so it
# reaches this executor through any environment without a parameter; hermes's by default.
_EXPECTED: ContextVar[str] = ContextVar("toolgrpo_expected_call", default=EXPECTED_FORMAT)
TRUNCATE_SIDES = ("right", "left", "middle")
_MAX_MESSAGE_CHARS = 500
_WARNED_ABANDONED: set[str] = set()  # thread tools already warned about, once per process
_PASS_THROUGH = (KeyboardInterrupt, SystemExit, asyncio.CancelledError, IsolationUnavailable)


async def run_tool_calls(
    tools: Mapping[str, Tool],
    calls: Sequence[ToolCall],
    timeout_s: float | None = 10.0,
    max_parallel: int | None = None,
    memory_limit_mb: float | None = DEFAULT_MEMORY_LIMIT_MB,
) -> list[ToolResult]:
    """Results in call order. ``timeout_s`` limits each call's run time (not its wait for a
    ``max_parallel`` slot or a worker process); ``None`` or ``<= 0`` means no limit. An isolated
    tool's worker is killed at the limit; any other sync tool that times out keeps running in its
    daemon thread (Python cannot kill a thread), but nothing waits for it any more.
    ``memory_limit_mb`` bounds what an isolated call may add to its worker's memory."""
    slots = asyncio.Semaphore(max_parallel) if max_parallel and max_parallel > 0 else None

    async def run(call: ToolCall) -> ToolResult:
        if slots is None:
            return await run_tool_call(tools, call, timeout_s, memory_limit_mb)
        async with slots:
            return await run_tool_call(tools, call, timeout_s, memory_limit_mb)

    outcomes = await asyncio.gather(*(run(c) for c in calls), return_exceptions=True)
    results = []
    for call, outcome in zip(calls, outcomes, strict=True):
        if isinstance(outcome, IsolationUnavailable):
            raise outcome
        if isinstance(outcome, ToolResult):
            results.append(outcome)
        else:  # only a tool's own CancelledError can get here; the safety net in any case
            results.append(_exception_result(call, outcome))
    return results


async def run_tool_call(
    tools: Mapping[str, Tool],
    call: ToolCall,
    timeout_s: float | None = 10.0,
    memory_limit_mb: float | None = DEFAULT_MEMORY_LIMIT_MB,
) -> ToolResult:
    """One call, checked (parsed, known, valid arguments) before it runs."""
    try:
        if call.parse_error is not None:
            return _error(call, "parse", _parse_message(call))
        tool = tools.get(call.name)
        if tool is None:
            return _error(call, "unknown_tool", _unknown_message(call.name, tools))
        problem = tool.validate(call.arguments)
        if problem is not None:
            text = f"Error: invalid arguments for tool '{call.name}': {problem}"
            return _error(call, "invalid_arguments", text)
        return await _invoke(tool, call, timeout_s, memory_limit_mb)
    except _PASS_THROUGH:
        raise
    except BaseException as exc:  # a broken Mapping or validator; the model still gets an answer
        log.warning("tool call %s (%r) failed outside the tool", call.id, call.name, exc_info=True)
        return _exception_result(call, exc)


async def _invoke(
    tool: Tool, call: ToolCall, timeout_s: float | None, memory_limit_mb: float | None
) -> ToolResult:
    async def guarded() -> ToolResult | BaseException:
        # The tool's own exceptions are returned, not raised, so a TimeoutError raised inside
        # the tool (say, by an HTTP client) is not mistaken for our time limit.
        try:
            return await tool(call.arguments, timeout_s, memory_limit_mb)
        except _PASS_THROUGH:
            raise
        except BaseException as exc:
            return exc

    timed_out = f"Error: tool '{call.name}' timed out after {timeout_s:g}s" if timeout_s else ""
    try:
        if tool.isolated or timeout_s is None or timeout_s <= 0:
            outcome = await guarded()  # an isolated tool's worker keeps (and enforces) the time
        else:
            outcome = await asyncio.wait_for(guarded(), timeout_s)
    except asyncio.TimeoutError:  # the builtin TimeoutError on 3.11+
        if tool.name not in _WARNED_ABANDONED and not _is_coroutine_tool(tool):
            _WARNED_ABANDONED.add(tool.name)
            log.warning(
                "tool %r timed out in a thread, which cannot be stopped and runs on; if some "
                "input keeps it busy, declare it isolated=True (a killable worker process)",
                tool.name,
            )
        return _error(call, "timeout", timed_out)
    if isinstance(outcome, IsolatedTimeout):
        return _error(call, "timeout", f"{timed_out} and was stopped; try a simpler input")
    if isinstance(outcome, IsolatedCrash):
        return _error(call, "exception", f"Error: tool '{call.name}' {outcome}")
    if isinstance(outcome, BaseException):
        log.debug("tool %r raised", call.name, exc_info=outcome)
        return _exception_result(call, outcome)
    return replace(outcome, name=call.name, call_id=call.id)


def _is_coroutine_tool(tool: Tool) -> bool:
    return inspect.iscoroutinefunction(tool.fn)


def _error(call: ToolCall, error_type: str, text: str) -> ToolResult:
    return ToolResult(text, is_error=True, error_type=error_type, name=call.name, call_id=call.id)


def _exception_result(call: ToolCall, exc: BaseException) -> ToolResult:
    if isinstance(exc, asyncio.CancelledError):
        return _error(call, "exception", f"Error: tool '{call.name}' was cancelled")
    return _error(call, "exception", f"Error: {type(exc).__name__}: {_safe_str(exc)}")


def _parse_message(call: ToolCall) -> str:
    raw = call.raw.strip()
    shown = raw if len(raw) <= 200 else raw[:200] + "..."
    return (
        f"Error: could not parse tool call: {call.parse_error}. Got: {shown!r}. "
        f"Expected format: {_EXPECTED.get()}"
    )


@contextmanager
def expecting(example: str) -> Iterator[None]:
    """Parse errors inside the block show ``example`` (a format's one-line call,
    ``ToolFormat.example``) as the format to use; tasks and threads started inside inherit it."""
    token = _EXPECTED.set(example)
    try:
        yield
    finally:
        _EXPECTED.reset(token)


def _unknown_message(name: str, tools: Mapping[str, Tool]) -> str:
    available = ", ".join(tools) if tools else "(none)"
    return f"Error: unknown tool '{name}'. Available tools: {available}"


def _safe_str(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ itself fails
        text = f"<unprintable {type(exc).__name__}>"
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "..."


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], **kwargs: Any) -> str: ...


def truncate_text(tokenizer: TokenizerLike, text: str, max_tokens: int, side: str = "right") -> str:
    """Keep ``max_tokens`` tokens of ``text``: the head (``right``), the tail (``left``) or both
    (``middle``), with a visible ``...(truncated N tokens)`` marker (a few tokens on top of the
    budget). ``max_tokens <= 0`` means no limit."""
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"side must be one of {TRUNCATE_SIDES}, got {side!r}")
    if max_tokens <= 0 or not text:
        return text
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    cut = len(ids) - max_tokens
    if cut <= 0:
        return text
    marker = f"...(truncated {cut} tokens)"

    def decode(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    if side == "right":
        return f"{decode(ids[:max_tokens])}\n{marker}"
    if side == "left":
        return f"{marker}\n{decode(ids[cut:])}"
    head = (max_tokens + 1) // 2
    tail = max_tokens - head
    tail_text = decode(ids[len(ids) - tail :]) if tail else ""
    return f"{decode(ids[:head])}\n{marker}\n{tail_text}"
