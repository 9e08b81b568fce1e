"""``schemas:test`` / ``schemas:train``: seeded, held out by family, and each item's own expected
calls score 1 under the matcher in both prompt styles."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from toolgrpo.data.loader import load_tasks
from toolgrpo.data.schema_tasks import schema_tasks
from toolgrpo.envs.base import Transcript
from toolgrpo.envs.schemas import SchemaCallEnv, answer_score
from toolgrpo.errors import UserError


def hermes(calls):
    return "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)


def rlla(calls):
    lines = "\n".join(json.dumps({"name": c["name"], "parameters": c["arguments"]}) for c in calls)
    return f"<think> ok </think>\n<tool_call>\n{lines}\n</tool_call>"


def test_test_split_has_240_items_per_style_all_call_types_and_is_reproducible():
    tasks = load_tasks("schemas:test").tasks
    assert len(tasks) == 480
    assert Counter(t.task_type for t in tasks) == {"schemas": 240, "schemas_rlla": 240}
    assert Counter(t.meta["call_type"] for t in tasks) == {
        k: 120 for k in ("simple", "multiple", "parallel", "parallel_multiple")
    }
    again = schema_tasks("schemas:test")
    assert [t.ground_truth for t in again] == [t.ground_truth for t in tasks]
    assert [t.ground_truth for t in schema_tasks("schemas:test?seed=1")] != [
        t.ground_truth for t in tasks
    ]


def test_test_functions_never_appear_in_train():
    def stems(spec):
        out = set()
        for t in schema_tasks(spec):
            for f in json.loads(t.ground_truth)["functions"]:
                out.add(f["function"]["name"].split(".")[-1].replace("_", "").lower())
        return out

    assert not stems("schemas:test") & stems("schemas:train?n=400")


@pytest.mark.parametrize("style,render", [("native", hermes), ("rlla", rlla)])
def test_each_items_expected_calls_score_correct_and_a_changed_argument_does_not(style, render):
    for t in schema_tasks(f"schemas:test?style={style}&n=40"):
        calls = json.loads(t.ground_truth)["calls"]
        assert answer_score(render(calls), t.ground_truth).correct, t.task_id
        assert answer_score(render(list(reversed(calls))), t.ground_truth).correct
        wrong = [dict(c, arguments={**c["arguments"], "bogus": 1}) for c in calls]
        assert not answer_score(render(wrong), t.ground_truth).correct


def test_native_tasks_offer_tools_and_rlla_ones_list_them_in_the_system_prompt():
    native, rl = schema_tasks("schemas:test?n=1")
    names = [f["function"]["name"] for f in json.loads(native.ground_truth)["functions"]]
    assert [t["function"]["name"] for t in native.tools] == names
    assert not rl.tools and all(f"Name: {n}" in rl.messages[0]["content"] for n in names)
    assert "**Available Tools**" in rl.messages[0]["content"]


def test_the_env_scores_the_last_answer_with_parts_per_call_type():
    task = schema_tasks("schemas:test?style=native&n=3")[2]  # a parallel item
    env = SchemaCallEnv(task)
    start = asyncio.run(env.reset())
    assert start.tools == list(task.tools)
    calls = json.loads(task.ground_truth)["calls"]

    def reward(text):
        msgs = [*start.messages, {"role": "assistant", "content": text}]
        return asyncio.run(env.reward(Transcript(msgs, text, "answer", 1)))

    good = reward(hermes(calls))
    assert good.score == 1.0 and good.parts["correct/parallel"] == 1.0
    names_only = reward(hermes([{"name": c["name"], "arguments": {}} for c in calls]))
    assert names_only.score == 0.5 and names_only.parts["correct"] == 0.0
    broken = reward("<tool_call> <name>x</name> </tool_call>")
    assert broken.score == 0.0 and broken.parts["format_valid/parallel"] == 0.0


@pytest.mark.parametrize(
    "spec", ["schemas:dev", "schemas:test?style=xml", "schemas:test?n=0", "schemas:test?k=1"]
)
def test_bad_specs_say_what_is_wrong(spec):
    with pytest.raises(UserError, match="bad data source"):
        schema_tasks(spec)
