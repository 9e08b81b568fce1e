"""A tool: a name, a JSON schema for its arguments, and an async call returning a ``ToolResult``.

Plain Python functions become tools through ``function_tool`` (schema from type hints and a
Google-style docstring, the way ``apply_chat_template(tools=[fn])`` derives it) or ``dict_tool``
(a hand-written OpenAI spec). Errors are not caught here: ``executor.run_tool_calls`` does that.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

import jsonschema

from toolgrpo.tools.isolated import DEFAULT_MEMORY_LIMIT_MB, check_isolatable
from toolgrpo.tools.shared_pool import modules_of, shared_pool
from toolgrpo.tools.types import ToolResult

ToolFn = Callable[..., Any]  # called with the arguments as keywords; sync or async
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class ToolOutputError(TypeError):
    """A tool returned something that is neither text, JSON-serialisable, nor a ``ToolResult``."""


@dataclass(frozen=True, eq=False)
class Tool:
    """A callable tool. ``fn`` gets the call's arguments as keyword arguments. A sync function
    runs in a thread of its own, or, if ``isolated``, in a worker process that is killed at the
    deadline: declare a tool isolated when some input can keep it busy (or hold the GIL) for long,
    since a thread can only be abandoned, never stopped (``toolgrpo.tools.isolated``)."""

    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of type "object"
    fn: ToolFn = field(repr=False)
    isolated: bool = False  # run in a killable worker process (a sync, importable function)
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
        if self.isolated:
            if _is_async(self.fn):
                raise ValueError(f"tool {self.name!r}: an async function cannot be isolated")
            check_isolatable(self.fn, self.name)
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

    async def __call__(
        self,
        arguments: Mapping[str, Any],
        timeout_s: float | None = None,
        memory_limit_mb: float | None = DEFAULT_MEMORY_LIMIT_MB,
    ) -> ToolResult:
        """``timeout_s`` and ``memory_limit_mb`` bind an isolated tool only (its worker enforces
        them); the executor bounds the others by waiting no longer."""
        if self.isolated:
            pool = shared_pool(modules_of(self.fn))
            value = await pool.call(self.fn, arguments, timeout_s, memory_limit_mb)
        elif _is_async(self.fn):
            value = await self.fn(**arguments)
        else:
            value = await in_thread(self.fn, arguments, self.name)
            if inspect.isawaitable(value):  # a sync wrapper that hands back a coroutine
                value = await value
        return to_tool_result(value, self.name)


async def in_thread(fn: ToolFn, arguments: Mapping[str, Any], name: str = "") -> Any:
    """``fn(**arguments)`` in a new daemon thread. Not ``asyncio.to_thread``: the loop's default
    executor has a few threads that slow calls can fill, and ``asyncio.run`` joins them at exit,
    so one abandoned call would hold up the whole step."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def target() -> None:
        try:
            ok, value = True, context.run(fn, **arguments)
        except BaseException as exc:
            ok, value = False, exc
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    threading.Thread(target=target, name=f"toolgrpo-tool-{name}"[:60], daemon=True).start()
    return await fut


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


def function_tool(fn: ToolFn, name: str | None = None, isolated: bool = False) -> Tool:
    """A tool from a type-hinted function whose Google-style docstring documents every argument.
    ``isolated``: run it in a killable worker process (see ``Tool``)."""
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
        isolated=isolated,
    )


@overload
def tool(fn: ToolFn, *, name: str | None = None, isolated: bool = False) -> Tool: ...
@overload
def tool(
    fn: None = None, *, name: str | None = None, isolated: bool = False
) -> Callable[[ToolFn], Tool]: ...
def tool(
    fn: ToolFn | None = None, *, name: str | None = None, isolated: bool = False
) -> Tool | Callable[[ToolFn], Tool]:
    """Decorator form of ``function_tool``: ``@tool`` or ``@tool(name="search", isolated=True)``
    (a worker looks the function up by module and name and unwraps the ``Tool`` it finds)."""
    if fn is None:
        return lambda f: function_tool(f, name=name, isolated=isolated)
    return function_tool(fn, name=name, isolated=isolated)


def dict_tool(spec: Mapping[str, Any], fn: ToolFn, isolated: bool = False) -> Tool:
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
        isolated=isolated,
    )


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )
