"""What counts as a failed tool result for rollback (``rollout.tool_failures`` through
``RollbackPolicy.failures``): flagged errors of the listed types, tracebacks, JSON error fields;
never a success that merely mentions "Error". Checked against every shipped environment."""

from __future__ import annotations

import asyncio

import pytest

from tests.rollout.test_rollback import TASK
from toolgrpo.envs.base import Env
from toolgrpo.rollout.rollback import RollbackPolicy
from toolgrpo.tools.types import ToolCall, ToolResult


def test_failure_patterns_and_types():
    p = RollbackPolicy()

    def fails(r: ToolResult) -> bool:
        return bool(p.failures([r]))

    assert fails(ToolResult("Error: bad", True, "invalid_arguments"))
    assert fails(ToolResult("Could not parse", True, "parse"))
    assert not fails(ToolResult("Error: tool 'x' timed out after 1s", True, "timeout"))
    assert not fails(ToolResult("lost", True, "transport"))
    tb = 'Traceback (most recent call last):\n  File "x.py"\nImportError: no module named y'
    assert fails(ToolResult(tb))  # a code tool that printed a traceback and "succeeded"
    assert fails(ToolResult("ModuleNotFoundError: no module named y"))
    assert fails(ToolResult('{"error": "cd: nope: No such file or directory"}'))
    assert fails(ToolResult("[{'error': 'User not authenticated.'}]"))  # BFCL's str() of a list
    assert fails(ToolResult('{"error": 404}')) and fails(ToolResult('{"error": {"code": 1}}'))
    assert not fails(ToolResult("RESULT=5")) and not fails(ToolResult('{"result": "ok"}'))
    custom = RollbackPolicy(patterns=(), error_types=frozenset({"timeout"}), json_error_keys=())
    assert custom.failures([ToolResult("slow", True, "timeout"), ToolResult("Error: x")]) == [
        ToolResult("slow", True, "timeout")
    ]


def test_default_patterns_do_not_catch_successes():
    """Pins issue #14 item 4: the old defaults rolled these successes back (an unset error
    field, a line or title starting with "Error", "Error:" inside ordinary text)."""
    p = RollbackPolicy()
    for text in (
        '{"error": null, "value": 42}',
        '{"error": "", "rows": []}',
        '{"error": false}',
        "[1] doc_id: ecc | Error correction codes\nError correction codes add redundancy.",
        "[2] doc_id: band | Syntax Error\nTheir album Syntax Error: Live sold well.",
        '{"last_lines": "No errors found. Error: Something went wrong. Final line."}',
        "x = 3; the ValueError: clause is documented",
        "Error during execution: boom",  # BFCL's wording: flagged (is_error) by the env itself
        "Traceback (most recent call last) is how Python starts a traceback",  # prose, no frame
    ):
        assert not p.failures([ToolResult(text)]), text
    for text in (
        'Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: 1',
        'ok\nTraceback (most recent call last):\n  File "<stdin>", line 2, in <module>',
        "ZeroDivisionError: division by zero",
        "json.decoder.JSONDecodeError: Expecting value",
        '{"error": "cd: x: No such directory"}',
        "  {'error': 'Order with ID 9 not found.', 'orders': [1]}",
    ):
        assert p.failures([ToolResult(text)]), text


def test_json_error_keys_come_from_the_config():
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig

    key = "actor_rollout_ref.rollout.multi_turn."
    base = [f"{key}enable=true", f"{key}enable_tool_rollback=true"]
    for extra, keys in (
        ([], ("error",)),
        ([f"{key}rollback_error_json_keys=[err, fault]"], ("err", "fault")),
        ([f"{key}rollback_error_json_keys=[]"], ()),
    ):
        mt = load_config(TrainConfig, None, base + extra).actor_rollout_ref.rollout.multi_turn
        p = RollbackPolicy.from_config(mt)
        assert p.json_error_keys == keys
        assert bool(p.failures([ToolResult('{"fault": "x", "error": "y"}')])) == bool(keys)


def _run(env: Env, *calls: ToolCall) -> list[ToolResult]:
    asyncio.run(env.reset())
    return asyncio.run(env.step(list(calls)))


def test_shipped_environments_successes_pass_and_failures_are_caught(tmp_path):
    """Real outputs of every shipped environment that runs tools, against the defaults.
    (RLLA runs no tool: it is single-turn and never rolled back.)"""
    import json

    from toolgrpo.envs.calculator import make_calculator_env
    from toolgrpo.envs.rlla import RllaEnv
    from toolgrpo.envs.search import make_search_env

    p = RollbackPolicy()
    calc = make_calculator_env(TASK, {})
    ok = _run(
        calc,
        ToolCall("calculate", {"expression": "4817 * 293 - 1205"}),
        ToolCall("calculate", {"expression": "sqrt(2) * 3"}),
        ToolCall("solve", {"equation": "x^2 + 3x - 40 = 0"}),
        ToolCall("solve", {"equation": "x^2 = -1"}),
        ToolCall("solve", {"equation": "x = x"}),
    )
    assert [r.is_error for r in ok] == [False] * 5 and not p.failures(ok), ok
    bad = _run(
        calc,
        ToolCall("calculate", {"expression": "1/0"}),
        ToolCall("solve", {"equation": "import os"}),
        ToolCall("calculate", {}),
        ToolCall("nope", {}),
        ToolCall("", parse_error="not JSON"),
    )
    assert p.failures(bad) == bad, bad

    corpus = tmp_path / "c.jsonl"
    docs = [
        ("ecc", "Error correction codes", "Error correction codes add redundant bits."),
        ("band", "Syntax Error", "Syntax Error: Live is an album. TypeError: a song."),
    ]
    corpus.write_text("\n".join(json.dumps({"id": i, "title": t, "text": x}) for i, t, x in docs))
    for options in ({}, {"corpus": str(corpus)}):
        env = make_search_env(TASK, options)
        queries = ("mayor of Varneth", "Error correction codes", "Syntax Error album", "zzzqqq")
        ok = _run(env, *(ToolCall("search", {"query": q}) for q in queries))
        ok += _run(env, ToolCall("open_document", {"doc_id": "ecc" if options else "x"}))
        ok = [r for r in ok if not r.is_error]  # the shipped corpus has no doc "x"
        assert len(ok) >= 4 and not p.failures(ok), ok
    assert "Error correction" in ok[1].text  # the title that the old defaults rolled back
    bad = _run(env, ToolCall("search", {"query": " "}), ToolCall("open_document", {"doc_id": "q"}))
    assert p.failures(bad) == bad, bad
    assert RllaEnv.single_turn


def test_bfcl_successes_pass_and_failures_are_caught():
    """Every ground-truth call of BFCL's base category (all its simulators) is a success the
    defaults leave alone (the old ones rolled back grep hits containing "Error:"); the
    simulators' own error replies and the environment's flagged errors are caught."""
    pytest.importorskip("bfcl_eval")
    from tests.envs.test_bfcl import as_calls
    from toolgrpo.envs._bfcl_data import entry_to_task, load_entries
    from toolgrpo.envs.bfcl import BfclEnv

    p = RollbackPolicy()
    entries, classes, successes = load_entries("base"), set(), 0
    for entry in entries:
        env = BfclEnv(entry_to_task(entry, "test"))
        asyncio.run(env.reset())
        classes |= set(entry.involved_classes)
        for turn in entry.ground_truth:
            if turn:
                results = asyncio.run(env.step(as_calls(env, turn)))
                assert not any(r.is_error for r in results)
                assert not p.failures(results), (entry.id, results)
                successes += len(results)
            asyncio.run(env.next_user_turn([]))
    assert successes > 1000 and len(classes) >= 8

    def first(cls: str) -> BfclEnv:
        entry = next(e for e in entries if cls in e.involved_classes)
        env = BfclEnv(entry_to_task(entry, "test"))
        asyncio.run(env.reset())
        return env

    failures = {
        "GorillaFileSystem": [ToolCall("cd", {"folder": "no_such_folder"})],
        "TradingBot": [ToolCall("cancel_order", {"order_id": 987654})],
        "MathAPI": [ToolCall("divide", {"a": 1, "b": 0})],
        "VehicleControlAPI": [ToolCall("setHeadlights", {"mode": "disco"})],
    }
    for cls, calls in failures.items():
        env = first(cls)
        flagged = [ToolCall("no_such_tool", {}), ToolCall(calls[0].name, {"bogus": 1})]
        results = asyncio.run(env.step(calls + flagged))
        assert not results[0].is_error and results[0].text.lstrip().startswith("{"), results[0]
        assert p.failures(results) == results, (cls, results)
