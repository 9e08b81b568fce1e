from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from toolgrpo.tools import ToolCall, has_tool_call, parse_tool_calls, strip_tool_calls


def block(obj: object) -> str:
    return f"<tool_call>{json.dumps(obj, ensure_ascii=False)}</tool_call>"


def ok(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in calls if c.parse_error is None]


def test_single_call_with_surrounding_text() -> None:
    text = 'I will search.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
    (c,) = parse_tool_calls(text)
    assert (c.name, c.arguments, c.parse_error, c.id) == ("search", {"q": "x"}, None, "call_0")
    assert c.raw == '\n{"name": "search", "arguments": {"q": "x"}}\n'


def test_several_blocks_get_ids_in_order() -> None:
    text = block({"name": "a", "arguments": {}}) + " and " + block({"name": "b", "arguments": {}})
    assert [(c.name, c.id) for c in parse_tool_calls(text)] == [("a", "call_0"), ("b", "call_1")]


def test_parameters_alias_string_arguments_and_missing_arguments() -> None:
    text = (
        block({"name": "a", "parameters": {"x": 1}})
        + block({"name": "b", "arguments": '{"y": [1, 2]}'})
        + block({"name": "c"})
        + block({"name": "d", "arguments": ""})
    )
    assert ok(parse_tool_calls(text)) == [
        ("a", {"x": 1}),
        ("b", {"y": [1, 2]}),
        ("c", {}),
        ("d", {}),
    ]


def test_bad_blocks_are_per_call_errors() -> None:
    text = (
        block({"name": "good", "arguments": {"x": 1}})
        + "<tool_call>{not json}</tool_call>"
        + block({"name": "s", "arguments": "{broken"})
        + block({"name": "n", "arguments": [1, 2]})
        + block({"arguments": {}})
        + block(["just", "strings"])
        + block(42)
        + "<tool_call>  </tool_call>"
        + block({"name": "also_good", "arguments": {}})
    )
    calls = parse_tool_calls(text)
    assert [c.id for c in calls] == [f"call_{i}" for i in range(len(calls))]
    assert ok(calls) == [("good", {"x": 1}), ("also_good", {})]
    errors = {c.raw.strip(): c for c in calls if c.parse_error}
    assert "invalid JSON" in errors["{not json}"].parse_error
    assert errors['{"name": "s", "arguments": "{broken"}'].name == "s"
    assert (
        "string but not valid JSON" in errors['{"name": "s", "arguments": "{broken"}'].parse_error
    )
    assert (
        "must be a JSON object, got array"
        in errors['{"name": "n", "arguments": [1, 2]}'].parse_error
    )
    assert "name" in errors['{"arguments": {}}'].parse_error
    assert "got number" in errors["42"].parse_error
    assert "empty" in errors[""].parse_error
    assert len(calls) == 10  # the list block yields one error per element


def test_unclosed_final_block() -> None:
    valid = 'Calling <tool_call>{"name": "f", "arguments": {"a": 1}}'
    assert ok(parse_tool_calls(valid)) == [("f", {"a": 1})]
    (cut,) = parse_tool_calls('<tool_call>{"name": "f", "argu')
    assert cut.parse_error and "no closing </tool_call>" in cut.parse_error


def test_rlla_block_with_one_call_per_line() -> None:
    text = (
        "<think> two calls </think>\n<tool_call>\n"
        '{"name": "f", "parameters": {"a": 1}}\n'
        '{"name": "g", "parameters": {"b": "x"}}\n'
        "</tool_call>"
    )
    calls = parse_tool_calls(text)
    assert ok(calls) == [("f", {"a": 1}), ("g", {"b": "x"})]
    assert [c.raw for c in calls] == [
        '{"name": "f", "parameters": {"a": 1}}',
        '{"name": "g", "parameters": {"b": "x"}}',
    ]


def test_one_bad_line_among_good_lines() -> None:
    text = (
        '<tool_call>\n{"name": "f", "arguments": {}}\n{"name": oops}\n{"name": "g"}\n</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert ok(calls) == [("f", {}), ("g", {})]
    assert calls[1].parse_error and calls[1].raw == '{"name": oops}'


def test_pretty_printed_json_is_one_call_or_one_error() -> None:
    pretty = json.dumps({"name": "f", "arguments": {"a": [1, 2]}}, indent=2)
    assert ok(parse_tool_calls(f"<tool_call>\n{pretty}\n</tool_call>")) == [("f", {"a": [1, 2]})]
    broken = pretty[:-1]  # drop the closing brace
    (c,) = parse_tool_calls(f"<tool_call>\n{broken}\n</tool_call>")
    assert c.parse_error and "invalid JSON" in c.parse_error


def test_json_list_of_calls() -> None:
    text = block([{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}])
    assert ok(parse_tool_calls(text)) == [("a", {}), ("b", {"x": 1})]


def test_no_calls_and_helpers() -> None:
    assert parse_tool_calls("just an answer </tool_call>") == []
    assert not has_tool_call("just an answer")
    text = 'Let me check. <tool_call>{"name": "f"}</tool_call> Done. <tool_call>{"na'
    assert has_tool_call(text)
    assert strip_tool_calls(text) == "Let me check.  Done."


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    (c,) = parse_tool_calls("<tool_call>" + "[" * 100_000)
    assert c.parse_error


# ---- properties ------------------------------------------------------------------------------

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789.-", min_size=1, max_size=20)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
ARGS = st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=4)
CALLS = st.lists(st.tuples(NAMES, ARGS), max_size=4)
# Free text around blocks; it must not itself open a block.
PROSE = st.text(max_size=40).filter(lambda s: "<tool_call>" not in s)


def _has_tag(value: object) -> bool:
    # A literal "</tool_call>" inside a JSON string ends the block early: a limit of the format.
    return "tool_call>" in json.dumps(value, ensure_ascii=False)


@settings(max_examples=150, deadline=None)
@given(CALLS, st.lists(PROSE, min_size=5, max_size=5), st.booleans())
def test_rendered_calls_parse_back(calls, prose, indent) -> None:
    assume(not _has_tag(calls))
    text = prose[0]
    for i, (name, args) in enumerate(calls):
        body = json.dumps(
            {"name": name, "arguments": args}, ensure_ascii=False, indent=indent or None
        )
        text += f"<tool_call>\n{body}\n</tool_call>{prose[(i % 4) + 1]}"
    parsed = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed] == [(n, a) for n, a in calls]
    assert all(c.parse_error is None for c in parsed)
    assert [c.id for c in parsed] == [f"call_{i}" for i in range(len(calls))]


FRAGMENTS = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        "[",
        "]",
        '"name"',
        '"arguments"',
        '"parameters"',
        ":",
        ",",
        '"',
        "\\",
        "\n",
        "null",
        "1e999",
        '"f"',
        " ",
        "\ud800",
        "\x00",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(), st.lists(FRAGMENTS | st.text(max_size=5)).map("".join)))
def test_any_text_never_raises(text) -> None:
    calls = parse_tool_calls(text)
    for c in calls:
        assert isinstance(c, ToolCall)
        assert isinstance(c.arguments, dict)
        assert c.parse_error is not None or c.name  # a parsed call always has a name
    strip_tool_calls(text)
    assert has_tool_call(text) == bool(calls)


@settings(max_examples=150, deadline=None)
@given(CALLS, st.integers(0, 4), st.sampled_from(["{", '{"name": }', "[1,", "oops", '{"x": 1}']))
def test_a_malformed_block_keeps_the_valid_ones(calls, where, junk) -> None:
    assume(not _has_tag(calls))
    blocks = [block({"name": n, "arguments": a}) for n, a in calls]
    blocks.insert(min(where, len(blocks)), f"<tool_call>{junk}</tool_call>")
    parsed = parse_tool_calls(" text ".join(blocks))
    assert ok(parsed) == [(n, a) for n, a in calls]
    assert sum(c.parse_error is not None for c in parsed) == 1
