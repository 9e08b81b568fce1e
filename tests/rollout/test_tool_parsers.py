"""Tool-call parsers per model family on hand-written turns: valid calls, several calls, text
around them, malformed JSON and a missing name (errors, never exceptions), and cut turns."""

from __future__ import annotations

import json

import pytest

from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TOOL_CALL_FORMATS, TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.rollout.multi_turn import EpisodeLimits
from toolgrpo.rollout.render import tools_block
from toolgrpo.rollout.tool_parsers import (
    BUILT_IN,
    FORMATS,
    get_format,
    openai_tool_calls,
    parse_hermes,
    parse_llama3_json,
    parse_mistral,
)
from toolgrpo.tools.types import ToolCall


def ok(turn):
    return [(c.name, c.arguments, c.id) for c in turn.calls if c.parse_error is None]


# --- hermes (today's format, through tools.parser) -------------------------------------------


def test_hermes_calls_and_content():
    text = 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> ok'
    turn = parse_hermes(text)
    assert ok(turn) == [("add", {"a": 1}, "call_0")] and turn.errors == []
    assert turn.content == "Let me add.  ok"
    two = parse_hermes('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}</tool_call>')
    assert [c.name for c in two.calls] == ["a", "b"]


def test_hermes_errors():
    bad = parse_hermes("<tool_call>{not json</tool_call>")
    assert len(bad.calls) == 1 and bad.errors[0].startswith("invalid JSON")
    (err,) = parse_hermes('<tool_call>{"arguments": {}}</tool_call>').errors
    assert "name" in err


# --- llama3_json ------------------------------------------------------------------------------


def test_llama3_whole_message_call():
    turn = parse_llama3_json('{"name": "add", "parameters": {"a": 2, "b": 3}}')
    assert ok(turn) == [("add", {"a": 2, "b": 3}, "call_0")]
    assert turn.content == "" and turn.errors == []


def test_llama3_python_tag_several_calls_and_text_around():
    text = (
        "I will use two tools.\n<|python_tag|>"
        '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "neg", "arguments": {"x": 3}}'
        "\nthen I answer"
    )
    turn = parse_llama3_json(text)
    assert ok(turn) == [("add", {"a": 1, "b": 2}, "call_0"), ("neg", {"x": 3}, "call_1")]
    assert turn.content == "I will use two tools.\nthen I answer"


def test_llama3_call_on_its_own_line_after_text():
    turn = parse_llama3_json(
        'Sure:\n{"name": "f", "parameters": {}}\n{"name": "g", "parameters": {}}'
    )
    assert [c.name for c in turn.calls] == ["f", "g"] and turn.content == "Sure:"


def test_llama3_plain_text_is_no_call():
    for text in ("The answer is 5.", "<answer>{5}</answer>", 'he said {"name": "x"} inline'):
        turn = parse_llama3_json(text)
        assert turn.calls == [] and turn.content == text.strip()


def test_llama3_errors():
    (bad,) = parse_llama3_json('<|python_tag|>{"name": "add", "parameters": {"a": 1}').calls
    assert bad.parse_error and bad.parse_error.startswith("invalid JSON") and bad.name == ""
    (missing,) = parse_llama3_json('{"parameters": {"a": 1}}').errors
    assert "name" in missing
    (code,) = parse_llama3_json("<|python_tag|>print(1)").errors
    assert "<|python_tag|>" in code
    (args,) = parse_llama3_json('{"name": "f", "parameters": [1]}').errors
    assert "object" in args


def test_llama3_a_bad_call_after_good_ones_keeps_them():
    turn = parse_llama3_json('<|python_tag|>{"name": "f", "parameters": {}}; {"name": ')
    assert [c.name for c in turn.calls] == ["f", ""] and len(turn.errors) == 1


# --- mistral ----------------------------------------------------------------------------------


def test_mistral_list_of_calls_and_text_around():
    text = (
        'Checking. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, '
        '{"name": "neg", "arguments": {"x": 2}}] done'
    )
    turn = parse_mistral(text)
    assert ok(turn) == [("add", {"a": 1}, "call_0"), ("neg", {"x": 2}, "call_1")]
    assert turn.content == "Checking.\ndone" and turn.errors == []


def test_mistral_single_object_and_name_args_form():
    assert ok(parse_mistral('[TOOL_CALLS] {"name": "f", "arguments": {"q": 1}}')) == [
        ("f", {"q": 1}, "call_0")
    ]
    turn = parse_mistral('[TOOL_CALLS]f[ARGS]{"q": 1}[TOOL_CALLS]g[ARGS]{}')
    assert ok(turn) == [("f", {"q": 1}, "call_0"), ("g", {}, "call_1")]


def test_mistral_no_tag_is_no_call():
    turn = parse_mistral('The answer is [5] and {"name": "x"}.')
    assert turn.calls == [] and turn.content == 'The answer is [5] and {"name": "x"}.'


def test_mistral_errors():
    turn = parse_mistral('[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "argu')
    assert [c.name for c in turn.calls] == ["a", ""]
    assert turn.errors[0].startswith("invalid JSON")
    (missing,) = parse_mistral('[TOOL_CALLS] [{"arguments": {"x": 1}}]').errors
    assert "name" in missing
    (empty,) = parse_mistral("[TOOL_CALLS] []").errors
    assert "empty" in empty
    (prose,) = parse_mistral("[TOOL_CALLS] I would like to call add").errors
    assert "JSON list" in prose


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_parsers_never_raise(fmt):
    parse = get_format(fmt).parse
    junk = [
        "",
        "[TOOL_CALLS]",
        "<|python_tag|>",
        "<tool_call>",
        "{",
        "[" * 5000,
        "<|python_tag|>" + "[" * 100_000,
        "[TOOL_CALLS] " + "[" * 100_000,
        '{"name": 1}',
        "}{][",
    ]
    for text in junk:
        turn = parse(text)
        assert all(isinstance(c, ToolCall) for c in turn.calls)
        assert [c.id for c in turn.calls] == [f"call_{i}" for i in range(len(turn.calls))]


# --- cut turns, structured calls, instructions, config ----------------------------------------


def test_a_cut_turn_runs_only_the_calls_it_finished():
    hermes = get_format("hermes")
    text = '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}'
    assert [c.name for c in hermes.turn_calls(text, cut=True)] == ["a"]
    assert [c.name for c in hermes.turn_calls(text, cut=False)] == ["a", "b"]
    llama = get_format("llama3_json")
    text = '{"name": "a", "parameters": {}}; {"name": "b", "param'
    assert [c.name for c in llama.turn_calls(text, cut=True)] == ["a"]
    assert len(llama.turn_calls(text, cut=False)) == 2  # not cut: the broken call is reported
    mistral = get_format("mistral")
    text = '[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "argu'
    assert [c.name for c in mistral.turn_calls(text, cut=True)] == ["a"]


def test_openai_tool_calls():
    calls = parse_hermes(
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{bad</tool_call>'
    ).calls
    good, bad = openai_tool_calls(calls, first=3)
    assert good == {
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 1}'},
        "id": "call00003",
    }
    assert json.loads(good["function"]["arguments"]) == {"a": 1}
    # A malformed call keeps what the model wrote, so its error message has a call to answer.
    assert bad["function"] == {"name": "", "arguments": "{bad"} and bad["id"] == "call00004"
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in (good, bad))  # Mistral's rule


def test_instructions_follow_the_format():
    spec = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    blocks = {f: tools_block(spec, f) for f in FORMATS}
    assert "<tool_call>" in blocks["hermes"] and blocks["hermes"] == tools_block(spec)
    assert '"parameters"' in blocks["llama3_json"] and "<tool_call>" not in blocks["llama3_json"]
    assert "[TOOL_CALLS]" in blocks["mistral"]
    assert all('"name": "add"' in b for b in blocks.values())  # the same specs for every format


def test_the_config_key_names_every_format():
    assert set(TOOL_CALL_FORMATS) == set(BUILT_IN)  # users' formats join FORMATS
    mt = TrainConfig().actor_rollout_ref.rollout.multi_turn
    assert mt.format == "hermes" and EpisodeLimits().tool_format == "hermes"
    key = "actor_rollout_ref.rollout.multi_turn.format"
    c = load_config(TrainConfig, None, [f"{key}=llama3_json"])
    validate_train_config(c)
    assert c.actor_rollout_ref.rollout.multi_turn.format == "llama3_json"
    with pytest.raises(ConfigError, match="format"):
        validate_train_config(load_config(TrainConfig, None, [f"{key}=mistrall"]))
    with pytest.raises(ValueError, match="mistral"):
        EpisodeLimits(tool_format="mistrall")


def test_the_config_key_reaches_the_episode_runner_and_infer():
    """``multi_turn.format`` is what the trainer, eval and infer play episodes with."""
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.trainer.episodes import episode_limits

    for fmt in ("hermes", "llama3_json", "mistral"):
        cfg = load_config(TrainConfig, None, [f"actor_rollout_ref.rollout.multi_turn.format={fmt}"])
        assert episode_limits(cfg).tool_format == fmt
