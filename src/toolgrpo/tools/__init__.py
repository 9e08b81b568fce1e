"""Tools for the model: schemas, the ``<tool_call>`` parser and the executor that never raises."""

from toolgrpo.tools.executor import (
    EXPECTED_FORMAT,
    TRUNCATE_SIDES,
    run_tool_call,
    run_tool_calls,
    truncate_text,
)
from toolgrpo.tools.parser import has_tool_call, parse_tool_calls, strip_tool_calls
from toolgrpo.tools.schema import (
    Tool,
    ToolOutputError,
    dict_tool,
    function_tool,
    to_tool_result,
    tool,
)
from toolgrpo.tools.types import ERROR_TYPES, ToolCall, ToolResult

__all__ = [
    "ERROR_TYPES",
    "EXPECTED_FORMAT",
    "TRUNCATE_SIDES",
    "Tool",
    "ToolCall",
    "ToolOutputError",
    "ToolResult",
    "dict_tool",
    "function_tool",
    "has_tool_call",
    "parse_tool_calls",
    "run_tool_call",
    "run_tool_calls",
    "strip_tool_calls",
    "to_tool_result",
    "tool",
    "truncate_text",
]
