"""Hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` parsing.

Errors are per call, not per turn: a malformed block becomes a ``ToolCall`` with ``parse_error``
set while the valid calls around it still run, so the model is told exactly which call was wrong.
Also accepted: ``"parameters"`` for ``"arguments"`` (RLLA), arguments as a JSON string, a final
unclosed block, and several JSON objects in one block, one per line (RLLA) or as a JSON list.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from toolgrpo.tools.types import ToolCall

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
# A closed block, or a final unclosed one running to the end of the text.
_BLOCK_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_MAX_ERROR_CHARS = 120


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every call in ``text`` in order, ids ``call_0``, ``call_1``, ...; never raises."""
    if not isinstance(text, str):
        return []
    calls: list[ToolCall] = []
    for match in _BLOCK_RE.finditer(text):
        closed = match.group(1) is not None
        raw = match.group(1) if closed else match.group(2)
        try:
            found = _parse_block(raw)
        except Exception as exc:  # a safety net: parsing a model's output must never crash
            found = [ToolCall(name="", raw=raw, parse_error=f"unparsable block ({exc!r})")]
        if not closed:
            found = [_note_unclosed(c) for c in found]
        calls.extend(found)
    return [_with_id(c, i) for i, c in enumerate(calls)]


def strip_tool_calls(text: str) -> str:
    """The text outside ``<tool_call>`` blocks (an unclosed final block included), stripped."""
    return _BLOCK_RE.sub("", text).strip()


def has_tool_call(text: str) -> bool:
    return OPEN_TAG in text


def _parse_block(raw: str) -> list[ToolCall]:
    content = raw.strip()
    if not content:
        return [ToolCall(name="", raw=raw, parse_error="empty <tool_call> block")]
    try:
        value = json.loads(content)
    except (ValueError, RecursionError) as exc:
        by_line = _parse_lines(content)
        if by_line is not None:
            return by_line
        return [ToolCall(name="", raw=raw, parse_error=f"invalid JSON ({_json_error(exc)})")]
    if isinstance(value, list):
        if not value:
            return [ToolCall(name="", raw=raw, parse_error="empty list of calls")]
        return [_to_call(item, json.dumps(item, ensure_ascii=False)) for item in value]
    return [_to_call(value, raw)]


def _parse_lines(content: str) -> list[ToolCall] | None:
    """One JSON object per line (RLLA); ``None`` unless at least one line is such an object, so
    a broken pretty-printed object stays one error rather than one error per line."""
    lines = [line for line in content.splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    parsed: list[tuple[str, Any, str | None]] = []
    for line in lines:
        try:
            parsed.append((line, json.loads(line), None))
        except (ValueError, RecursionError) as exc:
            parsed.append((line, None, f"invalid JSON ({_json_error(exc)})"))
    if not any(isinstance(value, dict) for _, value, _ in parsed):
        return None
    return [
        ToolCall(name="", raw=line, parse_error=err) if err else _to_call(value, line)
        for line, value, err in parsed
    ]


def _to_call(value: Any, raw: str) -> ToolCall:
    if not isinstance(value, dict):
        error = f"expected a JSON object, got {_json_type(value)}"
        return ToolCall(name="", raw=raw, parse_error=error)
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCall(name="", raw=raw, parse_error="missing or empty string field 'name'")
    key = "arguments" if "arguments" in value else "parameters"
    args = value.get(key, {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as exc:
            error = f"'{key}' is a string but not valid JSON ({_json_error(exc)})"
            return ToolCall(name=name, raw=raw, parse_error=error)
    if not isinstance(args, dict):
        error = f"'{key}' must be a JSON object, got {_json_type(args)}"
        return ToolCall(name=name, raw=raw, parse_error=error)
    return ToolCall(name=name, arguments=args, raw=raw)


def _note_unclosed(call: ToolCall) -> ToolCall:
    """Say a parse error may come from generation stopping mid-block (no closing tag)."""
    if call.parse_error is None:
        return call
    return replace(call, parse_error=f"{call.parse_error}; the block has no closing {CLOSE_TAG}")


def _with_id(call: ToolCall, index: int) -> ToolCall:
    return replace(call, id=f"call_{index}")


def _json_error(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)[:_MAX_ERROR_CHARS]


def _json_type(value: Any) -> str:
    """JSON's name for a decoded value's type, which is what the model wrote."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)
