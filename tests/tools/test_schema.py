from __future__ import annotations

import asyncio
import json
import threading

import pytest

from toolgrpo.tools import Tool, ToolOutputError, ToolResult, dict_tool, function_tool, tool


def get_weather(city: str, days: int = 3) -> dict:
    """Get the weather forecast for a city.

    Args:
        city: The city name.
        days: How many days ahead.
    """
    return {"city": city, "days": days}


async def async_echo(text: str) -> str:
    """Echo text back.

    Args:
        text: What to echo.
    """
    return text


OPENAI_SPEC = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


def call(t: Tool, **arguments) -> ToolResult:
    return asyncio.run(t(arguments))


def test_function_tool_derives_schema_from_docstring() -> None:
    t = function_tool(get_weather)
    assert t.name == "get_weather"
    assert t.description == "Get the weather forecast for a city."
    assert t.spec() == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city name."},
                    "days": {"type": "integer", "description": "How many days ahead."},
                },
                "required": ["city"],
            },
        },
    }
    assert json.loads(call(t, city="Oslo").text) == {"city": "Oslo", "days": 3}


def test_function_tool_name_override_and_decorator_forms() -> None:
    assert function_tool(get_weather, name="weather").name == "weather"

    @tool
    def ping() -> str:
        """Check the service is up."""
        return "pong"

    @tool(name="shout")
    def loud(text: str) -> str:
        """Upper-case text.

        Args:
            text: Input.
        """
        return text.upper()

    assert isinstance(ping, Tool) and ping.name == "ping"
    assert ping.parameters["type"] == "object"
    assert call(ping).text == "pong"
    assert loud.name == "shout" and call(loud, text="hi").text == "HI"


def test_function_tool_without_docstring_or_hints_is_a_clear_value_error() -> None:
    def undocumented(x: int) -> int:
        return x

    def missing_arg_doc(x: int, y: int) -> int:
        """Add.

        Args:
            x: first.
        """
        return x + y

    with pytest.raises(ValueError, match="undocumented"):
        function_tool(undocumented)
    with pytest.raises(ValueError, match="missing_arg_doc"):
        function_tool(missing_arg_doc)


def test_dict_tool_accepts_openai_and_flat_specs() -> None:
    nested = dict_tool(OPENAI_SPEC, lambda a, b: a + b)
    flat = dict_tool(OPENAI_SPEC["function"], lambda a, b: a + b)
    assert nested.spec() == flat.spec() == OPENAI_SPEC
    assert call(nested, a=2, b=3.5).text == "5.5"


def test_dict_tool_without_parameters_takes_no_arguments() -> None:
    t = dict_tool({"name": "now", "description": "The time."}, lambda: "noon")
    assert t.parameters == {"type": "object", "properties": {}}
    assert call(t).text == "noon"


@pytest.mark.parametrize(
    "spec",
    [
        {"description": "no name", "parameters": {"type": "object"}},
        {"type": "function", "function": {"name": "", "parameters": {"type": "object"}}},
        {"name": "f", "parameters": {"type": "array"}},
        {"name": "f", "parameters": "not a schema"},
        {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "bogus"}}}},
        {"type": "function", "function": "f"},
    ],
)
def test_dict_tool_rejects_bad_specs(spec) -> None:
    with pytest.raises(ValueError):
        dict_tool(spec, lambda **kw: "")


def test_sync_tools_run_in_a_worker_thread_async_ones_on_the_loop() -> None:
    seen: dict[str, int] = {}

    def sync_fn() -> str:
        seen["sync"] = threading.get_ident()
        return "ok"

    async def async_fn() -> str:
        seen["async"] = threading.get_ident()
        return "ok"

    class AsyncCallable:
        async def __call__(self, text: str) -> str:
            return text * 2

    call(dict_tool({"name": "s"}, sync_fn))
    call(dict_tool({"name": "a"}, async_fn))
    assert seen["async"] == threading.get_ident()
    assert seen["sync"] != threading.get_ident()
    assert call(function_tool(async_echo), text="hé").text == "hé"
    assert call(dict_tool({"name": "c"}, AsyncCallable()), text="ab").text == "abab"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain text", "plain text"),
        ({"temp": "20°C", "ok": True}, '{"temp": "20°C", "ok": true}'),
        ([1, 2.5, None], "[1, 2.5, null]"),
        (7, "7"),
        (None, "null"),
    ],
)
def test_return_values_become_text(value, text) -> None:
    assert call(dict_tool({"name": "f"}, lambda: value)).text == text


def test_a_returned_tool_result_is_kept() -> None:
    own = ToolResult("no such file", is_error=True, error_type="exception")
    assert call(dict_tool({"name": "f"}, lambda: own)) is own


def test_non_serialisable_return_value_raises_tool_output_error() -> None:
    t = dict_tool({"name": "f"}, lambda: {1, 2})
    with pytest.raises(ToolOutputError, match="set"):
        call(t)


def test_validate_names_the_bad_field() -> None:
    t = function_tool(get_weather)
    assert t.validate({"city": "Oslo"}) is None
    assert "city" in t.validate({"days": 2})
    message = t.validate({"city": "Oslo", "days": "two"})
    assert "days" in message and "integer" in message


def test_validate_checks_the_signature_too() -> None:
    loose = dict_tool({"name": "f", "parameters": {"type": "object"}}, lambda a: a)
    assert loose.validate({"a": 1}) is None
    assert "unexpected keyword argument 'b'" in loose.validate({"a": 1, "b": 2})
    assert "missing a required argument: 'a'" in loose.validate({})
    kwargs = dict_tool({"name": "g"}, lambda **kw: kw)
    assert kwargs.validate({"any-key": 1}) is None
