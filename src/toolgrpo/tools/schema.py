"""A tool: a name, a JSON schema for its arguments, and an async call returning a ``ToolResult``.

Plain Python functions become tools through ``function_tool`` (schema from type hints and a
Google-style docstring, the way ``apply_chat_template(tools=[fn])`` derives it) or ``dict_tool``
(a hand-written OpenAI spec). Errors are not caught here: ``executor.run_tool_calls`` does that.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

import jsonschema

from toolgrpo.tools.types import ToolResult

ToolFn = Callable[..., Any]  # called with the arguments as keywords; sync or async
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class ToolOutputError(TypeError):
    """A tool returned something that is neither text, JSON-serialisable, nor a ``ToolResult``."""


@dataclass(frozen=True, eq=False)
class Tool:
    """A callable tool. ``fn`` gets the call's arguments as keyword arguments; sync functions run in
    a worker thread so a slow one does not stall the other episodes on the event loop."""

    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of type "object"
    fn: ToolFn = field(repr=False)
    _validator: Any = field(init=False, repr=False, compare=False)
    _signature: inspect.Signature | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a tool needs a non-empty string name, got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(
                f"tool {self.name!r}: fn must be callable, got {type(self.fn).__name__}"
            )
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type") != "object":
            raise ValueError(
                f"tool {self.name!r}: parameters must be a JSON schema with type 'object', "
                f"got {self.parameters!r}"
            )
        cls = jsonschema.validators.validator_for(dict(self.parameters))
        try:
            cls.check_schema(dict(self.parameters))
        except jsonschema.SchemaError as exc:
            raise ValueError(
                f"tool {self.name!r}: invalid parameters schema: {exc.message}"
            ) from exc
        object.__setattr__(self, "_validator", cls(dict(self.parameters)))
        try:
            signature: inspect.Signature | None = inspect.signature(self.fn)
        except (TypeError, ValueError):  # some builtins have no signature
            signature = None
        object.__setattr__(self, "_signature", signature)

    def spec(self) -> dict[str, Any]:
        """The OpenAI function spec that ``tokenizer.apply_chat_template(tools=[...])`` accepts."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def validate(self, arguments: Mapping[str, Any]) -> str | None:
        """``None`` if ``arguments`` fit the schema and ``fn``'s signature, else a short message
        naming the bad field (so a stray argument is ``invalid_arguments``, not a TypeError)."""
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(dict(arguments)))
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path)
            message = error.message if len(error.message) <= 200 else error.message[:200] + "..."
            return f"argument '{where}': {message}" if where else message
        if self._signature is not None:
            try:
                self._signature.bind(**arguments)
            except TypeError as exc:
                return str(exc)
        return None

    async def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        if _is_async(self.fn):
            value = await self.fn(**arguments)
        else:
            value = await asyncio.to_thread(self.fn, **arguments)
            if inspect.isawaitable(value):  # a sync wrapper that hands back a coroutine
                value = await value
        return to_tool_result(value, self.name)


def to_tool_result(value: Any, name: str = "") -> ToolResult:
    """Text as is, a ``ToolResult`` as is, anything else as JSON (non-ASCII kept readable)."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult(text=value, name=name)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ToolOutputError(
            f"tool {name!r} returned a {type(value).__name__}, which is not JSON-serialisable"
        ) from exc
    return ToolResult(text=text, name=name)


def function_tool(fn: ToolFn, name: str | None = None) -> Tool:
    """A tool from a type-hinted function whose Google-style docstring documents every argument."""
    from transformers.utils import get_json_schema

    try:
        spec = get_json_schema(fn)
    except Exception as exc:  # transformers raises its own exception types for each gap
        label = getattr(fn, "__qualname__", None) or repr(fn)
        raise ValueError(
            f"cannot derive a tool schema from {label}: {exc} (a tool function needs type hints "
            "and a Google-style docstring with an 'Args:' entry per argument)"
        ) from exc
    function = spec["function"]
    return Tool(
        name=name or function["name"],
        description=function.get("description", ""),
        parameters=function.get("parameters") or dict(_EMPTY_PARAMETERS),
        fn=fn,
    )


@overload
def tool(fn: ToolFn, *, name: str | None = None) -> Tool: ...
@overload
def tool(fn: None = None, *, name: str | None = None) -> Callable[[ToolFn], Tool]: ...
def tool(fn: ToolFn | None = None, *, name: str | None = None) -> Tool | Callable[[ToolFn], Tool]:
    """Decorator form of ``function_tool``: ``@tool`` or ``@tool(name="search")``."""
    if fn is None:
        return lambda f: function_tool(f, name=name)
    return function_tool(fn, name=name)


def dict_tool(spec: Mapping[str, Any], fn: ToolFn) -> Tool:
    """A tool from a raw spec, OpenAI-style ``{"type": "function", "function": {...}}`` or flat
    ``{name, description, parameters}``. A spec without ``parameters`` takes no arguments."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"a tool spec must be a dict, got {type(spec).__name__}")
    function = spec.get("function") if "function" in spec else spec
    if not isinstance(function, Mapping):
        raise ValueError(f"the spec's 'function' must be a dict, got {function!r}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool spec needs a non-empty string 'name', got {name!r}")
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise ValueError(f"tool {name!r}: 'description' must be a string")
    parameters = function.get("parameters")
    return Tool(
        name=name,
        description=description,
        parameters=dict(_EMPTY_PARAMETERS) if parameters is None else parameters,
        fn=fn,
    )


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )
