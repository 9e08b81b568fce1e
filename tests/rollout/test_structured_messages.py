"""Episodes record OpenAI-style ``tool_calls`` on assistant turns and ``tool_call_id`` on tool
messages, in every tool-call format, while the tokens stay exactly what the policy generated;
the messages render back through chat templates that do, and that do not, know ``tool_calls``."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from tests.rollout.test_multi_turn import (
    CALL,
    LIMITS,
    AddEnvReal,
    _play,
    _spans,
    tok,  # noqa: F401 - fixture
)
from toolgrpo.eval.episodes import sample_transcripts
from toolgrpo.rollout.multi_turn import EpisodeLimits
from toolgrpo.rollout.render import (
    as_generated,
    chat_view,
    decode,
    render_text,
    template_renders_tool_calls,
)
from toolgrpo.rollout.tool_parsers import parse_hermes
from toolgrpo.trainer.rollout_dump import episode_records

TWO_CALLS = CALL + "\n" + CALL.replace('"a": 2', '"a": 4')
HERMES_TURNS = [TWO_CALLS, "<tool_call>{bad</tool_call>", "<answer>5</answer>"]
# The ids of the episode above as the loop produced them before messages carried structured
# calls (tiny tokenizer, hermes): structure is recorded beside the tokens, never in them.
GOLDEN_LEN = 640
GOLDEN_SHA = "26866aa2d5b6b63ca0d2ae3b7adcd41493e2d5cf4595e35ae4df8cc2ef0ef847"


def _by_role(ep, role):
    return [m for m in ep.messages if m["role"] == role]


def _sampled_exactly(ep, gen):
    ones = [s for s in _spans(ep.response_mask) if s[0] == 1]
    return [ep.response_ids[a:b] for _, a, b in ones] == gen.sampled


def test_hermes_episode_carries_structured_calls_and_the_same_tokens(tok):  # noqa: F811
    ep, gen = _play(tok, HERMES_TURNS, AddEnvReal())
    ids = ep.prompt_ids + ep.response_ids
    assert len(ids) == GOLDEN_LEN and hashlib.sha256(str(ids).encode()).hexdigest() == GOLDEN_SHA
    assert _sampled_exactly(ep, gen) and ep.prefix_mismatches == 0
    first, second, answer = _by_role(ep, "assistant")
    assert first["content"] == TWO_CALLS  # the text as the model wrote it
    assert first["tool_calls"] == [
        {"type": "function", "function": {"name": "add", "arguments": args}, "id": i}
        for args, i in (('{"a": 2, "b": 3}', "call00000"), ('{"a": 4, "b": 3}', "call00001"))
    ]
    # The malformed call is kept as written, so the error the model is shown answers a call.
    (bad,) = second["tool_calls"]
    assert bad["function"] == {"name": "", "arguments": "{bad"} and bad["id"] == "call00002"
    assert "tool_calls" not in answer  # a turn without calls has none (OpenAI's shape)
    tools = _by_role(ep, "tool")
    assert [(m["tool_call_id"], m["name"]) for m in tools] == [
        ("call00000", "add"),
        ("call00001", "add"),
        ("call00002", ""),
    ]
    assert [m["content"] for m in tools[:2]] == ["5", "7"]
    assert tools[2]["content"].startswith("Error: could not parse tool call")
    # The stream is the rendering of the conversation as generated: no structure in the tokens.
    full = decode(tok, ids)
    assert full == render_text(tok, as_generated(ep.messages), None, False).rstrip("\n")


LLAMA_CALL = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
MISTRAL_CALL = (
    '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}, '
    '{"name": "add", "arguments": {"a": 4, "b": 3}}]'
)


@pytest.mark.parametrize(
    ("fmt", "turns", "n_calls", "instruction"),
    [
        ("llama3_json", [LLAMA_CALL, "<answer>5</answer>"], 1, '"parameters"'),
        ("llama3_json", ["<|python_tag|>{oops", "<answer>5</answer>"], 1, '"parameters"'),
        ("mistral", [MISTRAL_CALL, "<answer>5</answer>"], 2, "[TOOL_CALLS]"),
        ("mistral", ["[TOOL_CALLS] [{oops", "<answer>5</answer>"], 1, "[TOOL_CALLS]"),
    ],
)
def test_other_formats_play_episodes(tok, fmt, turns, n_calls, instruction):  # noqa: F811
    limits = EpisodeLimits(max_response_length=400, tool_format=fmt)
    ep, gen = _play(tok, turns, AddEnvReal(), limits)
    assert ep.stop_reason == "answer" and ep.num_turns == 2 and ep.reward == 1.0
    assert _sampled_exactly(ep, gen) and ep.prefix_mismatches == 0
    system = ep.messages[0]["content"]
    assert instruction in system and "<tool_call>" not in system
    calls = _by_role(ep, "assistant")[0]["tool_calls"]
    results = _by_role(ep, "tool")
    assert len(calls) == len(results) == ep.tool_calls == n_calls
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in calls]
    if "oops" in turns[0]:  # malformed: an error result for the model, never a crash
        assert ep.tool_error_types == {"parse": 1} and "could not parse" in results[0]["content"]
    else:
        assert [json.loads(c["function"]["arguments"]) for c in calls][0] == {"a": 2, "b": 3}
        assert results[0]["content"] == "5"


def test_hermes_text_in_another_format_is_no_call(tok):  # noqa: F811
    limits = EpisodeLimits(max_response_length=400, tool_format="mistral")
    ep, _ = _play(tok, [CALL, "<answer>5</answer>"], AddEnvReal(), limits)
    assert ep.tool_calls == 0 and ep.num_turns == 1 and "tool_calls" not in ep.messages[-1]


def test_dumps_and_eval_transcripts_carry_the_structure(tok):  # noqa: F811
    ep, _ = _play(tok, HERMES_TURNS, AddEnvReal())
    (row,) = episode_records(ep, tok)
    (transcript,) = sample_transcripts([ep], [], 1)
    for messages in (row["messages"], transcript["messages"]):
        back = json.loads(json.dumps(messages))
        assert back[2]["tool_calls"][1]["id"] == "call00001"
        assert back[4]["tool_call_id"] == "call00001"


# --- rendering the messages elsewhere ---------------------------------------------------------

# A Qwen2.5-style template: renders assistant ``tool_calls`` as hermes blocks itself.
QWEN_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m['role'] == 'assistant' and m.get('tool_calls') %}{% for c in m['tool_calls'] %}"
    '\n<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A Mistral-style template: refuses a tool result whose call id is not 9 alphanumerics.
MISTRAL_LIKE = (
    "{% for m in messages %}{% if m['role'] == 'tool' %}"
    "{% if m.get('tool_call_id') is none or m['tool_call_id'] | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{% endif %}[TOOL_RESULTS]{{ m['content'] }}[/TOOL_RESULTS]"
    "{% elif m['role'] == 'assistant' and m.get('tool_calls') %}{{ m['content'] }}[TOOL_CALLS]"
    "{{ m['tool_calls'] | map(attribute='function') | list | tojson }}</s>"
    "{% else %}[{{ m['role'] }}]{{ m['content'] }}{% endif %}{% endfor %}"
)


def _with_template(tok, template):  # noqa: F811
    other = copy.deepcopy(tok)
    other.chat_template = template
    return other


def test_a_template_that_ignores_tool_calls_gets_the_text_as_written(tok):  # noqa: F811
    """The tiny ChatML template is SmolLM2's: it renders ``content`` only, so ``chat_view`` keeps
    each turn as the model wrote it (calls included) and the rendering is the episode's text."""
    assert not template_renders_tool_calls(tok)
    ep, _ = _play(tok, HERMES_TURNS, AddEnvReal())
    view = chat_view(tok, ep.messages)
    assert view[2]["content"] == TWO_CALLS and "tool_calls" not in view[2]
    full = decode(tok, ep.prompt_ids + ep.response_ids)
    assert render_text(tok, view, None, False).rstrip("\n") == full


def test_a_template_that_renders_tool_calls_gets_them_structured(tok):  # noqa: F811
    qwen = _with_template(tok, QWEN_LIKE)
    assert template_renders_tool_calls(qwen)
    ep, _ = _play(tok, ["Adding. " + TWO_CALLS, "<answer>5</answer>"], AddEnvReal(), LIMITS)
    view = chat_view(qwen, ep.messages)
    assert view[2]["content"] == "Adding." and view[2]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": {"a": 2, "b": 3},  # an object, as Hugging Face templates expect
    }
    assert ep.messages[2]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    text = render_text(qwen, view, None, False)
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = parse_hermes(turn)  # the template's rendering reads back as the same calls
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("add", {"a": 2, "b": 3}),
        ("add", {"a": 4, "b": 3}),
    ]
    assert parsed.content == "Adding." and turn.count("<tool_call>") == 2


def test_a_template_checking_call_ids_accepts_the_episode(tok):  # noqa: F811
    mistral = _with_template(tok, MISTRAL_LIKE)
    limits = EpisodeLimits(max_response_length=400, tool_format="mistral")
    ep, _ = _play(tok, [MISTRAL_CALL, "<answer>5</answer>"], AddEnvReal(), limits)
    text = render_text(mistral, chat_view(mistral, ep.messages, "mistral"), None, False)
    assert text.count("[TOOL_RESULTS]") == 2 and '"arguments": {"a": 4, "b": 3}' in text
    without_ids = [{k: v for k, v in m.items() if k != "tool_call_id"} for m in ep.messages]
    with pytest.raises(Exception, match="length 9"):  # what messages without ids met before
        render_text(mistral, chat_view(mistral, without_ids, "mistral"), None, False)
