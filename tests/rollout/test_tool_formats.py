"""Tool-call formats a user can extend (a parser registered by name, chosen by the same config
key), ``llama3_json`` answers that are JSON but no call, and Llama's ``<|eom_id|>`` stop."""

from __future__ import annotations

import asyncio
import copy
import re

import pytest

from tests.rollout.test_multi_turn import (
    TASK,
    AddEnv,
    ScriptedGenerator,
    tok,  # noqa: F401 - fixture
)
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.hf import stop_token_ids
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task
from toolgrpo.rollout.rollback import RollbackPolicy
from toolgrpo.rollout.tool_parsers import (
    FORMATS,
    ParsedTurn,
    ToolFormat,
    get_format,
    parse_llama3_json,
    register_tool_format,
)
from toolgrpo.tools.types import ToolCall

KEY = "actor_rollout_ref.rollout.multi_turn.format"


def test_llama3_json_that_is_not_a_call_is_an_answer():
    for text in ('{"answer": 42}', ' {"result": [1, 2]} done', "{42}", "{not json"):
        turn = parse_llama3_json(text)
        assert turn.calls == [] and turn.content == text.strip(), text
    (c,) = parse_llama3_json('{"name": "add", "parameters": {"a": 1, "b": 2}}').calls
    assert (c.name, c.arguments, c.parse_error) == ("add", {"a": 1, "b": 2}, None)
    (bad,) = parse_llama3_json('{"name": "add", "parameters": {"a": 1').calls
    assert bad.parse_error  # a call that is malformed is still the model's to hear about
    (nameless,) = parse_llama3_json('{"parameters": {"a": 1}}').errors
    assert "name" in nameless  # call-shaped, so reported
    later = parse_llama3_json('{"answer": 42}\n{"name": "add", "parameters": {}}')
    assert [c.name for c in later.calls] == ["add"] and later.content == '{"answer": 42}'


def test_a_json_answer_under_llama3_json_ends_the_episode_as_an_answer(tok):  # noqa: F811
    """Before, ``{"answer": 42}`` was read as a broken call: a parse error, and under rollback a
    negative scored -1 for a final answer."""
    gen = ScriptedGenerator(tok, ['{"answer": 42}'])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    limits = EpisodeLimits(max_response_length=400, tool_format="llama3_json")
    env = AddEnv()
    env.supports_snapshot, env.snapshot, env.restore = True, lambda: None, lambda s: None
    ep = asyncio.run(play_task(TASK, env, batcher, tok, limits, "u", 0, 0, RollbackPolicy()))
    batcher.close()
    assert ep.stop_reason == "answer" and ep.tool_calls == 0 and ep.tool_errors == 0
    assert not ep.negatives and ep.rollback.failed == 0
    assert ep.messages[-1] == {"role": "assistant", "content": '{"answer": 42}'}


def _parse_calls_as_lines(text: str) -> ParsedTurn:
    """A user's format: ``CALL name a=1 b=2`` lines; anything else is content."""
    calls, content = [], []
    for line in text.splitlines():
        m = re.fullmatch(r"CALL (\w+)((?: \w+=-?\d+)*)", line.strip())
        if m is None:
            content.append(line)
            continue
        args = dict(kv.split("=") for kv in m.group(2).split())
        raw = line.strip()
        calls.append(ToolCall(name=m.group(1), arguments={k: int(v) for k, v in args.items()},
                              raw=raw, id=f"call_{len(calls)}"))  # fmt: skip
    return ParsedTurn("\n".join(content).strip(), calls)


LINES = ToolFormat(
    "call_lines",
    _parse_calls_as_lines,
    "To call a function, write one line: CALL <name> <arg>=<int> ...",
    example="CALL <tool name> <arg>=<int>",
)


@pytest.fixture
def lines_format():
    saved = copy.copy(FORMATS)
    register_tool_format(LINES)
    yield LINES
    FORMATS.clear()
    FORMATS.update(saved)


def test_a_registered_format_is_chosen_by_the_config_key_and_plays(tok, lines_format):  # noqa: F811
    assert get_format("call_lines") is lines_format
    register_tool_format(LINES)  # the same format again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        register_tool_format(ToolFormat("hermes", _parse_calls_as_lines, ""))
    cfg = load_config(TrainConfig, None, [f"{KEY}=call_lines"])
    validate_train_config(cfg)
    limits = EpisodeLimits(max_response_length=400, tool_format="call_lines")
    gen = ScriptedGenerator(tok, ["CALL add a=2 b=3", "<answer>5</answer>"])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    ep = asyncio.run(play_task(TASK, AddEnv(), batcher, tok, limits, uid="u"))
    batcher.close()
    assert ep.tool_calls == 1 and ep.tool_errors == 0 and ep.reward == 1.0
    assert [m["content"] for m in ep.messages if m["role"] == "tool"] == ["RESULT=5"]
    assert "CALL <name>" in ep.messages[0]["content"]  # its calling instructions were shown


def test_an_unregistered_format_is_refused_naming_how_to_add_one():
    with pytest.raises(ConfigError, match="call_lines"):
        validate_train_config(load_config(TrainConfig, None, [f"{KEY}=call_lines"]))
    with pytest.raises(ValueError, match="register_tool_format"):
        get_format("call_lines")
    with pytest.raises(TypeError):
        register_tool_format("call_lines")  # type: ignore[arg-type]


def test_eom_id_ends_a_turn(tok):  # noqa: F811
    llama = copy.deepcopy(tok)
    llama.add_special_tokens({"additional_special_tokens": ["<|eot_id|>", "<|eom_id|>"]})
    ids = stop_token_ids(llama)
    assert llama.convert_tokens_to_ids("<|eom_id|>") in ids
    assert llama.convert_tokens_to_ids("<|eot_id|>") in ids
    assert tok.eos_token_id in ids
