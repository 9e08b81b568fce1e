"""Agent SFT rows carry the episode loop's structured messages (``tool_calls`` on assistant
turns, ``tool_call_id`` on results) and render through ``rollout.render.chat_view``: SmolLM2's
ChatML gets exactly the ids it got from plain messages, a template that renders ``tool_calls``
writes each call once."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from tests.rollout.test_structured_messages import QWEN_LIKE, _with_template
from toolgrpo.data.loader import DataError, embedded_path, load_tasks
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.models.loading import load_tokenizer
from toolgrpo.rollout.hf import stop_token_ids
from toolgrpo.rollout.render import template_renders_tool_calls
from toolgrpo.rollout.tool_parsers import parse_hermes
from toolgrpo.sft.agent import GoldCall, play_gold
from toolgrpo.sft.data import build_examples, tokenize_conversation

ROWS = [json.loads(x) for x in embedded_path("agent_sft.jsonl", "envs").read_text().splitlines()]
# tokenize_conversation's ids and masks for ROWS[::40] before rows carried structure (the
# plain rows and the code of that time, tiny ChatML tokenizer): structure changes no token.
GOLDEN_SHA = "e3fce38bb68a9969a8978fc72163b050b9ddc5c1f5ecdbb74501606b4d72680f"
GOLDEN_TOKENS = 62506


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def _two_hop_search():
    row = next(
        r
        for r in ROWS
        if r["meta"]["task_type"] == "search"
        and r["meta"]["tool_turns"] == 2
        and not r["meta"]["route"]
    )
    task = next(
        t for t in load_tasks(["search:train"]).tasks if t.task_id == row["meta"]["task_id"]
    )
    return task, row


def _replay(task, row):
    turns = [
        [GoldCall(c.name, c.arguments) for c in parse_hermes(m["content"]).calls]
        for m in row["messages"][:-1]
        if m["role"] == "assistant"
    ]
    answer = row["messages"][-1]["content"][len("<answer>") : -len("</answer>")]
    return asyncio.run(play_gold(EnvRouter().make(task), turns, answer))


def test_gold_episodes_record_structured_calls_answered_by_id():
    task = load_tasks(["calculator:train"]).tasks[0]
    call = GoldCall("calculate", {"expression": "2 * (644 + 413) * 45"})
    ep = asyncio.run(play_gold(EnvRouter().make(task), [[call]], "95130"))
    turn, result, final = ep.messages[-3:]
    assert turn["content"].startswith("<tool_call>")  # the text as the model writes it
    assert turn["tool_calls"] == [
        {
            "type": "function",
            "function": {"name": "calculate", "arguments": json.dumps(call.arguments)},
            "id": "call00000",
        }
    ]
    assert result == {
        "role": "tool",
        "name": "calculate",
        "content": "95130",
        "tool_call_id": "call00000",
    }
    assert "tool_calls" not in final  # the answer calls nothing


def test_ids_count_through_the_episode_and_the_shipped_rows_are_these_episodes():
    task, row = _two_hop_search()
    ep = _replay(task, row)
    calls = [c["id"] for m in ep.messages for c in m.get("tool_calls", [])]
    answered = [m["tool_call_id"] for m in ep.messages if m["role"] == "tool"]
    assert len(calls) >= 2 and calls == answered == [f"call{i:05d}" for i in range(len(calls))]
    assert ep.messages == row["messages"]


def test_chatml_ids_are_those_of_the_plain_rows(tok):
    """SmolLM2's template ignores ``tool_calls`` and ``tool_call_id``: every example's ids and
    mask are what the rows gave before they carried structure (pinned), and what the same rows
    without it give now."""
    assert not template_renders_tool_calls(tok)
    end_ids = set(stop_token_ids(tok))
    h, n = hashlib.sha256(), 0
    for row in ROWS[::40]:
        ids, mask = tokenize_conversation(tok, row["messages"], end_ids, row["tools"])
        h.update(json.dumps([ids, mask]).encode())
        n += len(ids)
        plain = [
            {k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")}
            for m in row["messages"]
        ]
        assert tokenize_conversation(tok, plain, end_ids, row["tools"]) == (ids, mask)
    assert (n, h.hexdigest()) == (GOLDEN_TOKENS, GOLDEN_SHA)


def test_a_template_that_renders_tool_calls_writes_each_call_once(tok):
    qwen = _with_template(tok, QWEN_LIKE)
    end_ids = set(stop_token_ids(qwen))
    _, row = _two_hop_search()
    ids, mask = tokenize_conversation(qwen, row["messages"], end_ids, row["tools"])
    trained = qwen.decode([i for i, m in zip(ids, mask, strict=True) if m])
    turns = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    want = [c for text in turns for c in parse_hermes(text).calls]
    got = parse_hermes(trained).calls  # the calls the loss trains on, from the template
    assert trained.count("<tool_call>") == len(want) >= 2
    assert [(c.name, c.arguments) for c in got] == [(c.name, c.arguments) for c in want]


def test_build_examples_checks_the_format(tok):
    end_ids = set(stop_token_ids(tok))
    with pytest.raises(DataError, match="unknown tool-call format"):
        build_examples(tok, ["agent:sft"], "ground_truth", 4096, end_ids, 1, "xml")
    with pytest.raises(DataError, match="hermes blocks"):
        build_examples(tok, ["agent:sft"], "ground_truth", 4096, end_ids, 1, "mistral")
