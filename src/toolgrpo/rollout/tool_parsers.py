"""Tool-call formats, one per model family: how a turn's text becomes calls, and how the system
prompt asks for them (for templates that cannot render ``tools=`` themselves).

Chosen by ``actor_rollout_ref.rollout.multi_turn.format`` (verl's key): ``hermes`` (SmolLM2,
Qwen, Hermes: ``<tool_call>{json}</tool_call>``), ``llama3_json`` (Llama 3.x: a JSON object
``{"name", "parameters"}``, optionally after ``<|python_tag|>``, several joined by ``;``),
``mistral`` (``[TOOL_CALLS] [{"name", "arguments"}, ...]``), or a format a user's module
registered (``register_tool_format``; the module is named by ``--import``/``trainer.imports``,
so every process that plays episodes has it). Each parser is a pure function of the text; a call
it cannot read is a ``ToolCall`` with ``parse_error`` set, which the environment answers with an
error message, so a malformed call never raises out of a rollout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from toolgrpo.tools.executor import EXPECTED_FORMAT
from toolgrpo.tools.parser import CLOSE_TAG, parse_tool_calls, strip_tool_calls
from toolgrpo.tools.parser import _json_error as json_error
from toolgrpo.tools.parser import _to_call as call_of_json  # one JSON → ToolCall rule for all
from toolgrpo.tools.types import ToolCall

PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS_TAG = "[TOOL_CALLS]"
_DECODER = json.JSONDecoder()
_LLAMA_START = re.compile(r'(?m)^[ \t]*\{\s*"name"\s*:')
_CALL_KEYS = frozenset({"name", "parameters", "arguments"})
_MISTRAL_NAME_ARGS = re.compile(r"\s*([A-Za-z_][\w.\-]*)\[ARGS\]")  # newer Mistral tokenizers


@dataclass(frozen=True)
class ParsedTurn:
    """A turn's text outside its calls, and its calls in order (ids ``call_0``, ...); a call
    that could not be read carries ``parse_error`` (``errors`` lists them)."""

    content: str
    calls: list[ToolCall]

    @property
    def errors(self) -> list[str]:
        return [c.parse_error for c in self.calls if c.parse_error is not None]


@dataclass(frozen=True)
class ToolFormat:
    name: str
    parse: Callable[[str], ParsedTurn]
    how_to_call: str  # the calling instructions after the ``<tools>`` listing
    # A turn cut at its token cap: the text up to its last complete call. None: every call the
    # parser reads runs except a trailing unreadable one (where the cap fell).
    closed_prefix: Callable[[str], str] | None = None
    # One call in this format, on one line: what a parse error tells the model to write
    # (``tools.executor.expecting``); hermes's is the executor's long-standing text.
    example: str = EXPECTED_FORMAT
    # The role the family's templates give a tool result (Llama 3.1: ``ipython``); a template
    # that cannot render it gets ``tool``, or the results in a user turn (``rollout.render``).
    result_role: str = "tool"

    def turn_calls(self, text: str, cut: bool) -> list[ToolCall]:
        """The calls a turn makes; a cut turn runs the calls it completed before the cap."""
        if not cut:
            return self.parse(text).calls
        if self.closed_prefix is not None:
            return self.parse(self.closed_prefix(text)).calls
        calls = self.parse(text).calls
        return calls[:-1] if calls and calls[-1].parse_error is not None else calls


def parse_hermes(text: str) -> ParsedTurn:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (``tools.parser``)."""
    if not isinstance(text, str):
        return ParsedTurn("", [])
    return ParsedTurn(strip_tool_calls(text), parse_tool_calls(text))


def parse_llama3_json(text: str) -> ParsedTurn:
    """Llama 3.x JSON calls: after ``<|python_tag|>`` if the turn has one, else from a message
    that starts with a call-shaped object or a line that starts with ``{"name":``. Calls are
    separated by ``;`` or whitespace; text after them is content. A message that is JSON but
    no call (``{"answer": 42}``) is an answer, as vLLM's parser reads it."""
    if not isinstance(text, str):
        return ParsedTurn("", [])
    tag = text.find(PYTHON_TAG)
    if tag >= 0:
        start, skip = tag, len(PYTHON_TAG)
    elif text.lstrip().startswith("{") and _opens_with_call(text):
        start, skip = len(text) - len(text.lstrip()), 0
    else:
        m = _LLAMA_START.search(text)
        if m is None:
            return ParsedTurn(text.strip(), [])
        start, skip = m.start(), 0
    calls, end = _json_calls(text, start + skip, separators=";")
    if not calls:  # the tag promised a call, but no JSON follows it
        rest = text[start + skip :].strip()
        error = f"expected a JSON object after {PYTHON_TAG}"
        calls, end = [ToolCall(name="", raw=rest, parse_error=error)], len(text)
    return _turn(_join(text[:start], text[end:]), calls)


def _opens_with_call(text: str) -> bool:
    """The message's leading JSON is call-shaped (it has a ``name``, ``parameters`` or
    ``arguments`` field, so a call missing its name is still reported to the model), or is a
    malformed one that opens with ``{"name":``; any other JSON, or text that merely starts with
    ``{``, is an answer."""
    if _LLAMA_START.match(text):
        return True
    decoded = _decode_at(text, len(text) - len(text.lstrip()))
    return not isinstance(decoded, ToolCall) and _is_call_object(decoded[0])


def _is_call_object(value: Any) -> bool:
    return isinstance(value, dict) and not _CALL_KEYS.isdisjoint(value)


def parse_mistral(text: str) -> ParsedTurn:
    """``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (a single object is accepted,
    as is the newer ``[TOOL_CALLS]name[ARGS]{...}``); text outside the calls is content."""
    if not isinstance(text, str):
        return ParsedTurn("", [])
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    while (tag := text.find(TOOL_CALLS_TAG, pos)) >= 0:
        content.append(text[pos:tag])
        at = tag + len(TOOL_CALLS_TAG)
        named = _MISTRAL_NAME_ARGS.match(text, at)
        if named is not None:
            found, pos = _named_call(text, named.group(1), named.end())
            calls.extend(found)
            continue
        at = _skip_space(text, at)
        if text.startswith("[", at):
            found, pos = _json_list(text, at + 1)
        elif text.startswith("{", at):
            found, pos = _json_calls(text, at, separators="")
        else:
            rest = text[at:].strip()
            error = "expected a JSON list of calls after " + TOOL_CALLS_TAG
            found, pos = [ToolCall(name="", raw=rest, parse_error=error)], len(text)
        calls.extend(found)
    content.append(text[pos:])
    return _turn(_join(*content), calls)


_HOW_TO_CALL_HERMES = (
    "To call a function, write one JSON object per call inside <tool_call></tool_call> tags:\n"
    '<tool_call>\n{"name": "<function name>", "arguments": {<arguments as JSON>}}\n'
    "</tool_call>\n"
    "Each result comes back in a message from the tool; then continue, or give your answer."
)
_HOW_TO_CALL_LLAMA3 = (
    "To call a function, reply with only a JSON object for the call, in the form\n"
    '{"name": "<function name>", "parameters": {<arguments as JSON>}}\n'
    "(several calls: one object per line, or separated by ;). "
    "Each result comes back in a message from the tool; then continue, or give your answer."
)
_HOW_TO_CALL_MISTRAL = (
    "To call functions, write [TOOL_CALLS] followed by a JSON list with one object per call:\n"
    '[TOOL_CALLS] [{"name": "<function name>", "arguments": {<arguments as JSON>}}]\n'
    "Each result comes back in a message from the tool; then continue, or give your answer."
)


def _hermes_closed(text: str) -> str:
    """An unclosed last block is where the cap fell, not a malformed call."""
    end = text.rfind(CLOSE_TAG)
    return text[: end + len(CLOSE_TAG)] if end >= 0 else ""


_EXAMPLE_LLAMA3 = '{"name": "<tool name>", "parameters": {<JSON object>}}'
_EXAMPLE_MISTRAL = '[TOOL_CALLS] [{"name": "<tool name>", "arguments": {<JSON object>}}]'

BUILT_IN: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", parse_hermes, _HOW_TO_CALL_HERMES, _hermes_closed),
    "llama3_json": ToolFormat(
        "llama3_json",
        parse_llama3_json,
        _HOW_TO_CALL_LLAMA3,
        example=_EXAMPLE_LLAMA3,
        result_role="ipython",
    ),
    "mistral": ToolFormat("mistral", parse_mistral, _HOW_TO_CALL_MISTRAL, example=_EXAMPLE_MISTRAL),
}
FORMATS: dict[str, ToolFormat] = dict(BUILT_IN)  # the registry: built-ins, then users' formats


def register_tool_format(fmt: ToolFormat) -> ToolFormat:
    """Make ``fmt`` the format named ``fmt.name`` (``multi_turn.format=<name>``). Its ``parse``
    must be a pure function of the turn's text returning a ``ParsedTurn`` and never raise (a
    call it cannot read carries ``parse_error``). Registering the same format again is a no-op;
    another format under a taken name is refused, so a built-in cannot be replaced by accident.
    Returns ``fmt``."""
    if not isinstance(fmt, ToolFormat):
        raise TypeError(f"register_tool_format takes a ToolFormat, got {type(fmt).__name__}")
    if not fmt.name or not callable(fmt.parse):
        raise ValueError("a tool-call format needs a name and a callable parse(text)")
    taken = FORMATS.get(fmt.name)
    if taken is not None and taken != fmt:
        raise ValueError(f"tool-call format {fmt.name!r} is already registered")
    FORMATS[fmt.name] = fmt
    return fmt


def get_format(name: str) -> ToolFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {name!r}; one of {sorted(FORMATS)} (a module named by "
            "--import or trainer.imports may register more with register_tool_format)"
        ) from None


def call_id(index: int) -> str:
    """An episode-wide id for a structured call: 9 alphanumerics, which Mistral's templates
    require and every other template accepts (``call00000``, ``call00001``, ...)."""
    return f"call{index:05d}"


def openai_tool_calls(calls: Sequence[ToolCall], first: int) -> list[dict[str, Any]]:
    """Calls as OpenAI chat messages carry them: ``arguments`` a JSON string (the raw text for
    a call that could not be read, as the model wrote it), ids from ``first`` on."""
    return [
        {
            "type": "function",
            "function": {
                "name": c.name,
                "arguments": c.raw.strip()
                if c.parse_error is not None
                else json.dumps(c.arguments, ensure_ascii=False),
            },
            "id": call_id(first + i),
        }
        for i, c in enumerate(calls)
    ]


def _turn(content: str, calls: list[ToolCall]) -> ParsedTurn:
    return ParsedTurn(content, [replace(c, id=f"call_{i}") for i, c in enumerate(calls)])


def _join(*parts: str) -> str:
    return "\n".join(p.strip() for p in parts if p.strip())


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _decode_at(text: str, pos: int) -> tuple[Any, int] | ToolCall:
    """The JSON value at ``pos`` and the offset after it, or an error call holding the rest."""
    try:  # decoded on its own, so an error's line and column are the call's own
        value, end = _DECODER.raw_decode(text[pos:])
        return value, pos + end
    except (ValueError, RecursionError) as exc:
        rest = text[pos:].strip()
        return ToolCall(name="", raw=rest, parse_error=f"invalid JSON ({json_error(exc)})")


def _json_calls(text: str, pos: int, separators: str) -> tuple[list[ToolCall], int]:
    """Consecutive JSON objects (or lists of them) from ``pos``, optionally separated by one
    of ``separators``; returns the calls and where the text after them starts."""
    calls: list[ToolCall] = []
    while True:
        at = _skip_space(text, pos)
        if calls and at < len(text) and text[at] in separators:
            at = _skip_space(text, at + 1)
        if at >= len(text) or text[at] not in "{[":
            return calls, pos
        decoded = _decode_at(text, at)
        if isinstance(decoded, ToolCall):
            return [*calls, decoded], len(text)
        value, end = decoded
        raw = text[at:end]
        if isinstance(value, list) and value:
            calls.extend(call_of_json(v, json.dumps(v, ensure_ascii=False)) for v in value)
        else:
            calls.append(call_of_json(value, raw))
        pos = end


def _json_list(text: str, pos: int) -> tuple[list[ToolCall], int]:
    """The items of a JSON list opened before ``pos``, read one at a time so the calls before
    a broken (or cut) item still count; returns the calls and the offset after the list."""
    calls: list[ToolCall] = []
    while True:
        at = _skip_space(text, pos)
        if text.startswith("]", at):
            if not calls:
                calls.append(ToolCall(name="", raw="[]", parse_error="empty list of calls"))
            return calls, at + 1
        if at >= len(text):  # the list never closed: keep what was read
            return calls, at
        decoded = _decode_at(text, at)
        if isinstance(decoded, ToolCall):
            return [*calls, decoded], len(text)
        value, end = decoded
        calls.append(call_of_json(value, text[at:end]))
        pos = _skip_space(text, end)
        if text.startswith(",", pos):
            pos += 1


def _named_call(text: str, name: str, pos: int) -> tuple[list[ToolCall], int]:
    decoded = _decode_at(text, pos)
    if isinstance(decoded, ToolCall):
        return [replace(decoded, name=name)], len(text)
    value, end = decoded
    return [call_of_json({"name": name, "arguments": value}, text[pos:end])], end
