"""What every environment backed by a tool server (MCP, OpenEnv) answers before it sends a call:
the server is gone, the call did not parse, or the server has no such tool."""

from __future__ import annotations

from collections.abc import Set

from toolgrpo.tools.types import ToolCall, ToolResult


def refuse_before_sending(
    call: ToolCall, tools: Set[str], fatal_error: str | None, connected: bool, what: str
) -> ToolResult | None:
    """An error result for a call that cannot reach the server, else None. ``what`` names the
    server in the message ("tool server", "environment")."""

    def error(kind: str, text: str) -> ToolResult:
        return ToolResult(text, True, kind, call.name, call.id)

    if fatal_error is not None or not connected:
        return error("transport", f"Error: the {what} is unavailable ({fatal_error})")
    if call.parse_error is not None:
        return error("parse", f"Error: could not parse the tool call: {call.parse_error}")
    if call.name not in tools:
        known = ", ".join(sorted(tools)) or "none"
        return error("unknown_tool", f"Error: unknown tool '{call.name}' (tools: {known})")
    return None
