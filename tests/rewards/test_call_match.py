"""The call matcher: a known call scores 1, a wrong argument 0, parallel calls in any order 1."""

from __future__ import annotations

from toolgrpo.rewards.call_match import score_calls, value_matches

SPEC = {
    "type": "function",
    "function": {
        "name": "fx.convert",
        "description": "Currency conversion.",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "to": {"type": "string"},
                "days": {"type": "integer", "default": 1},
                "mode": {"type": "string", "enum": ["spot", "fwd"], "default": "spot"},
                "tags": {"type": "array", "items": {"type": "string"}, "default": []},
                "addr": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
                },
            },
            "required": ["amount", "to"],
        },
    },
}
WANT = {"name": "fx.convert", "arguments": {"amount": 12.5, "to": "EUR"}}


def call(**args):
    return {"name": "fx.convert", "arguments": args}


def test_the_expected_call_scores_correct():
    s = score_calls([call(amount=12.5, to="EUR")], [WANT], [SPEC])
    assert (s.format_valid, s.names_ok, s.correct) == (True, True, True)


def test_a_wrong_argument_value_is_not_correct():
    s = score_calls([call(amount=12.0, to="EUR")], [WANT], [SPEC])
    assert (s.format_valid, s.names_ok, s.correct) == (True, True, False)


def test_a_missing_stated_argument_or_one_outside_the_schema_is_not_correct():
    assert not score_calls([call(amount=12.5)], [WANT], [SPEC]).correct
    assert not score_calls([call(amount=12.5, to="EUR", rate=1)], [WANT], [SPEC]).correct


def test_optional_arguments_may_be_left_out_or_given_their_default_but_nothing_else():
    assert score_calls([call(amount=12.5, to="EUR", days=1, mode="SPOT")], [WANT], [SPEC]).correct
    assert not score_calls([call(amount=12.5, to="EUR", days=2)], [WANT], [SPEC]).correct


def test_a_wrong_name_fails_names_and_a_missing_answer_fails_format():
    s = score_calls(
        [{"name": "convert", "arguments": {"amount": 12.5, "to": "EUR"}}], [WANT], [SPEC]
    )
    assert (s.format_valid, s.names_ok, s.correct) == (True, False, False)
    assert not score_calls(None, [WANT], [SPEC]).format_valid
    assert not score_calls([], [WANT], [SPEC]).format_valid


def test_parallel_calls_match_in_any_order_and_must_all_be_there():
    want = [WANT, {"name": "fx.convert", "arguments": {"amount": 3, "to": "JPY"}}]
    got = [call(amount=3, to="jpy"), call(amount=12.5, to="EUR.")]
    assert score_calls(got, want, [SPEC]).correct
    assert not score_calls(got[:1], want, [SPEC]).correct
    assert not score_calls([got[0], got[0]], want, [SPEC]).correct


def test_values_compare_by_schema_type():
    assert value_matches(3.0, 3, {"type": "integer"})
    assert not value_matches("3", 3, {"type": "integer"})
    assert not value_matches(True, 1, {"type": "integer"})
    assert not value_matches("true", True, {"type": "boolean"})
    assert value_matches(" 'Lyon' ", "lyon", {"type": "string"})
    arr = {"type": "array", "items": {"type": "string"}}
    assert value_matches(["b", "A"], ["a", "b"], arr)
    assert not value_matches(["a"], ["a", "b"], arr)
    obj = SPEC["function"]["parameters"]["properties"]["addr"]
    assert value_matches({"city": "Oslo", "n": 4}, {"city": "oslo", "n": 4}, obj)
    assert not value_matches({"city": "Oslo"}, {"city": "Oslo", "n": 4}, obj)
