"""A parse error tells the model the call format of its episode (``multi_turn.format``), not
always hermes's: each format has a one-line example, and the episode loop sets it around the
environment's ``step`` (``executor.expecting``)."""

from __future__ import annotations

import asyncio

import pytest

from tests.rollout.test_multi_turn import AddEnvReal, _play
from tests.rollout.test_multi_turn import tok as tok  # noqa: F401 - fixture
from toolgrpo.rollout.multi_turn import EpisodeLimits
from toolgrpo.rollout.tool_parsers import FORMATS, get_format
from toolgrpo.tools import ToolCall, function_tool, run_tool_calls
from toolgrpo.tools.executor import EXPECTED_FORMAT, expecting


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


TOOLS = {"add": function_tool(add)}
BAD = ToolCall(name="", raw="{oops}", parse_error="invalid JSON (x)", id="call_0")
# The message every hermes run has shown since the executor was written: unchanged.
HERMES_MESSAGE = (
    "Error: could not parse tool call: invalid JSON (x). Got: '{oops}'. Expected format: "
    '<tool_call>{"name": "<tool name>", "arguments": {<JSON object>}}</tool_call>'
)


def _message(call: ToolCall = BAD) -> str:
    (r,) = asyncio.run(run_tool_calls(TOOLS, [call]))
    assert r.is_error and r.error_type == "parse"
    return r.text


def test_hermes_message_is_unchanged_by_default_and_when_set():
    assert get_format("hermes").example == EXPECTED_FORMAT
    assert _message() == HERMES_MESSAGE
    with expecting(get_format("hermes").example):
        assert _message() == HERMES_MESSAGE


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_format_shows_its_own_example_which_its_parser_reads(fmt):
    example = get_format(fmt).example
    with expecting(example):
        text = _message()
    assert text.endswith(f"Expected format: {example}")
    assert ("<tool_call>" in text) == (fmt == "hermes")
    filled = example.replace("<tool name>", "add").replace("{<JSON object>}", '{"a": 1, "b": 2}')
    (call,) = get_format(fmt).parse(filled).calls  # the example is a call in that format
    assert (call.name, call.arguments, call.parse_error) == ("add", {"a": 1, "b": 2}, None)
    assert _message() == HERMES_MESSAGE  # the format is the block's only, never left behind


def test_concurrent_blocks_keep_their_own_format():
    async def both():
        async def one(fmt):
            with expecting(get_format(fmt).example):
                await asyncio.sleep(0.01)  # the other block is set meanwhile
                (r,) = await run_tool_calls(TOOLS, [BAD])
            return r.text

        return await asyncio.gather(one("mistral"), one("llama3_json"))

    mistral, llama = asyncio.run(both())
    assert mistral.endswith(get_format("mistral").example)
    assert llama.endswith(get_format("llama3_json").example)


@pytest.mark.parametrize(
    ("fmt", "turn"), [("llama3_json", "<|python_tag|>{oops"), ("mistral", "[TOOL_CALLS] [{oops")]
)
def test_an_episode_in_another_format_is_told_that_format(tok, fmt, turn):  # noqa: F811
    limits = EpisodeLimits(max_response_length=400, tool_format=fmt)
    ep, _ = _play(tok, [turn, "<answer>5</answer>"], AddEnvReal(), limits)
    (result,) = [m for m in ep.messages if m["role"] == "tool"]
    assert ep.tool_error_types == {"parse": 1}
    assert result["content"].endswith(f"Expected format: {get_format(fmt).example}")
    assert "<tool_call>" not in result["content"]
