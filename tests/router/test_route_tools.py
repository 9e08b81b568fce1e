"""Issue 18 item 2: a route's tools are the only tools its episode can run. Under ANSWER no
tool runs: a call written anyway comes back as a ``not_offered`` error and still costs; the
RLLA ANSWER prompt no longer asks for tool calls."""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.rollout.test_multi_turn import CALL, TASK, AddEnv, ScriptedGenerator
from toolgrpo.data.loader import load_tasks
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task
from toolgrpo.router.families import FamilyMap, ToolInfo, message_tools
from toolgrpo.router.prompts import condition_messages
from toolgrpo.router.runtime import RouteCondition
from toolgrpo.router.usage import CostModel, usage_of_episode


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class CountingAddEnv(AddEnv):
    def __init__(self) -> None:
        super().__init__()
        self.ran = 0

    async def step(self, calls):
        self.ran += len(calls)
        return await super().step(calls)


def _play(tok, cond):
    env = CountingAddEnv()
    gen = ScriptedGenerator(tok, [CALL, "<answer>5</answer>"])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    limits = EpisodeLimits(max_response_length=400)
    ep = asyncio.run(play_task(TASK, env, batcher, tok, limits, uid="u", condition=cond))
    return ep, env


def test_answer_route_runs_no_tool_and_the_call_still_costs(tok):
    """On main the ANSWER route only rewrote the prompt: a call written anyway ran in the
    environment and came back with its result."""
    fm = FamilyMap()
    fm.add([ToolInfo("add", "a+b")])
    ep, env = _play(tok, RouteCondition("ANSWER", fm))
    assert env.ran == 0
    tool_msgs = [m for m in ep.messages if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and "RESULT" not in tool_msgs[0]["content"]
    assert tool_msgs[0]["content"].startswith("Error: no tools are available on this route")
    assert ep.tool_calls == 1 and ep.tool_error_types == {"not_offered": 1}
    assert CostModel("any").cost(usage_of_episode(ep, fm)) == 1.0
    # A tool route runs the same call.
    ep, env = _play(tok, RouteCondition("CALCULATE", fm))
    assert env.ran == 1 and ep.tool_errors == 0
    assert any("RESULT=5" in m["content"] for m in ep.messages if m["role"] == "tool")


def test_family_tools_only_refuses_the_other_familys_tools(tok):
    fm = FamilyMap()
    fm.add([ToolInfo("add", "a+b")])
    assert fm.family("add") == "CALCULATE"
    ep, env = _play(tok, RouteCondition("SEARCH", fm, family_tools_only=True))
    assert env.ran == 0 and ep.tool_error_types == {"not_offered": 1}
    ep, env = _play(tok, RouteCondition("SEARCH", fm))  # without the option it is offered
    assert env.ran == 1


def test_rlla_answer_prompt_asks_for_no_tool_call():
    """On main the ANSWER prompt kept RLLA's <tool_call> output format, its "Decide on Tool
    Usage" step and the notes on calling tools, contradicting the route's own note."""
    tasks = load_tasks(["rlla:train"]).tasks[:20]
    fm = FamilyMap()
    for t in tasks:
        fm.add(message_tools(t.messages))
    for t in tasks:
        system = condition_messages(t.messages, "ANSWER", fm)[0]["content"]
        assert "<tool_call>" not in system and "Tool Usage" not in system
        assert (
            "**Output Format**" in system and "<response> AI's final response </response>" in system
        )
        steps = system.split("**Steps for Each Turn**")[1].split("\n\n")[0]
        assert re.findall(r"(?m)^(\d+)\. ", steps) == ["1", "2"]  # renumbered
        assert "**Respond Appropriately:**" in steps
        # the tool routes keep the original instructions
        kept = condition_messages(t.messages, "SEARCH", fm)[0]["content"]
        assert "Decide on Tool Usage" in kept and "<tool_call>" in kept
