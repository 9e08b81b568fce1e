"""Route-conditioned prompts on real RLLA rows and on the calculator and search env prompts."""

from __future__ import annotations

import asyncio
import copy
import re

import pytest

from toolgrpo.data.loader import load_tasks
from toolgrpo.envs.base import EnvStart
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.router.families import FamilyMap, find_tools_block, message_tools, spec_tools
from toolgrpo.router.prompts import ANSWER_NOTE, condition_messages, condition_start
from toolgrpo.router.routes import UnknownRoute


@pytest.fixture(scope="module")
def rlla_tasks():
    return load_tasks(["rlla:train"]).tasks[:40]


def _families(tasks):
    fm = FamilyMap()
    for t in tasks:
        fm.add(message_tools(t.messages))
    return fm


def _env_start(task_type: str) -> EnvStart:
    task = load_tasks([f"{task_type}:train"], max_samples=1).tasks[0]
    return asyncio.run(EnvRouter().make(task).reset())


def test_answer_removes_the_rlla_tools_block_and_keeps_the_rest(rlla_tasks):
    fm = _families(rlla_tasks)
    for task in rlla_tasks:
        original = copy.deepcopy(task.messages)
        msgs = condition_messages(task.messages, "ANSWER", fm)
        system = msgs[0]["content"]
        assert "**Available Tools**" not in system and not re.search(r"(?m)^\d+\. Name:", system)
        assert "**Route: answer directly**" in system and "<response>" in system
        for section in ("**Steps for Each Turn**", "**Output Format**", "**Important Notes**"):
            assert section in system
        assert msgs[1:] == list(task.messages[1:])  # the user turn is untouched
        assert task.messages == original  # pure


def test_search_and_calculate_keep_the_tools_and_name_the_families(rlla_tasks):
    fm = _families(rlla_tasks)
    for task in rlla_tasks:
        tools = message_tools(task.messages)
        for route, family in (("SEARCH", "SEARCH"), ("CALCULATE", "CALCULATE")):
            system = condition_messages(task.messages, route, fm)[0]["content"]
            assert message_tools([{"role": "system", "content": system}]) == tools
            assert f"**Route: {route.lower()}**" in system
            for t in tools:
                if fm.family(t.name) == family:
                    assert t.name in system.split(f"**Route: {route.lower()}**")[1]


def test_family_tools_only_drops_the_other_family_and_renumbers(rlla_tasks):
    fm = _families(rlla_tasks)
    mixed = [
        t
        for t in rlla_tasks
        if {fm.family(x.name) for x in message_tools(t.messages)} >= {"SEARCH", "CALCULATE"}
    ]
    assert mixed, "the sample should hold a row offering both families"
    for task in mixed:
        system = condition_messages(task.messages, "SEARCH", fm, family_tools_only=True)[0]
        block = find_tools_block(system["content"])
        kept = [t.name for t in block.tools]
        assert kept and all(fm.family(n) != "CALCULATE" for n in kept)
        numbers = re.findall(r"(?m)^(\d+)\. Name:", system["content"])
        assert numbers == [str(i) for i in range(1, len(kept) + 1)]


def test_environment_prompts_per_route():
    fm = FamilyMap()
    calc, search = _env_start("calculator"), _env_start("search")
    fm.add(spec_tools(calc.tools) + spec_tools(search.tools))

    answer = condition_start(calc, "ANSWER", fm)
    assert answer.tools == []
    system = answer.messages[0]["content"]
    assert "tool" not in system.replace(ANSWER_NOTE, "").lower()
    assert "<answer>NUMBER</answer>" in system and system.endswith(ANSWER_NOTE)

    routed = condition_start(calc, "CALCULATE", fm)
    assert [s["function"]["name"] for s in routed.tools] == ["calculate", "solve"]
    assert "(calculate, solve)" in routed.messages[0]["content"]

    s = condition_start(search, "SEARCH", fm, family_tools_only=True)
    assert [x["function"]["name"] for x in s.tools] == ["search", "open_document"]
    gone = condition_start(search, "CALCULATE", fm, family_tools_only=True)
    assert gone.tools == [] and "<tool_call>" not in gone.messages[0]["content"]
    assert calc.tools and calc.messages[0]["content"].startswith("You are a careful")  # pure


def test_a_prompt_without_system_message_gets_one():
    msgs = condition_messages([{"role": "user", "content": "hi"}], "ANSWER", FamilyMap())
    assert msgs[0] == {"role": "system", "content": ANSWER_NOTE}
    assert msgs[1] == {"role": "user", "content": "hi"}


def test_unknown_route_is_refused():
    with pytest.raises(UnknownRoute, match="unknown route 'BROWSE'"):
        condition_messages([{"role": "user", "content": "hi"}], "BROWSE", FamilyMap())
