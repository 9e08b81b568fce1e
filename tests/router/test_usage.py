"""Tool usage of trajectories and the three cost modes."""

from __future__ import annotations

import pytest

from toolgrpo.router.families import FamilyMap, ToolInfo
from toolgrpo.router.usage import CostModel, ToolUsage, usage_of_messages, usage_of_text

FM = FamilyMap()
FM.add([ToolInfo("search", "look up"), ToolInfo("calculate", "arithmetic"), ToolInfo("Ping", "")])

RLLA = (
    "<|im_start|>assistant\n<think> x </think>\n<tool_call>\n"
    '{"name": "search", "parameters": {"q": "a"}}\n'
    '{"name": "calculate", "parameters": {"e": "1+1"}}\n'
    '{"name": "search", "parameters": {"q": "b"}}\n</tool_call><|im_end|>'
)


def test_single_turn_answer_counts_calls_per_family():
    u = usage_of_text(RLLA, FM)
    assert u.calls == {"SEARCH": 2, "CALCULATE": 1}
    assert u.used_any_tool and u.used_search and u.used_calculate and u.num_calls == 3


def test_an_answer_without_a_block_costs_nothing():
    assert not usage_of_text("<think> x </think>\n<response> hi </response>", FM).used_any_tool


def test_a_malformed_block_is_a_tool_use():
    """Issue 18 item 3 (main read calls with the rollout parser and skipped unparsable ones, so
    a malformed block cost nothing): any <tool_call> block counts."""
    u = usage_of_text("<think> x </think>\n<tool_call>\nnot json\n</tool_call>", FM)
    assert u.used_any_tool and u.unparsed == 1 and u.calls == {}
    assert CostModel("any").cost(u) == 1.0
    # priced as the dearest family, so writing a call badly never saves cost
    assert CostModel("family", c_search=0.5, c_calc=2.0, c_other=1.0).cost(u) == 2.0
    assert CostModel("calls", c_search=0.5, c_calc=2.0).cost(u) == 2.0


def test_the_count_follows_the_rlla_rewards_reading():
    """Issue 18 item 3: the RLLA reward reads the first block one JSON object per line; a JSON
    list in the block is one unreadable call to it (main's rollout parser counted two), and a
    second block, which the reward never reads, is one more."""
    block = '<tool_call>\n[{"name": "search"}, {"name": "calculate"}]\n</tool_call>'
    u = usage_of_text(f"<think> x </think>\n{block}", FM)
    assert u.num_calls == 1 and u.unparsed == 1
    two = RLLA.replace(
        "</tool_call>", '</tool_call>\n<tool_call>\n{"name": "search"}\n</tool_call>'
    )
    u = usage_of_text(two, FM)
    assert u.calls == {"SEARCH": 2, "CALCULATE": 1} and u.unparsed == 1


def test_episodes_count_every_block_their_turns_wrote():
    """Issue 18 item 3: executed, failed, refused or cut off by the turn limit, a block is a use
    (main counted executed calls only, so a call cut by max_turns or a nameless one was free)."""
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": '<tool_call>{"name": "calculate"}</tool_call>'},
        {"role": "tool", "name": "calculate", "content": "2"},
        {"role": "assistant", "content": "<tool_call>{oops</tool_call>"},
        {"role": "tool", "name": "", "content": "Error: invalid JSON"},
        {"role": "assistant", "content": '<tool_call>{"name": "search"}</tool_call>'},
    ]  # the last call was cut by max_turns: never run, still written
    u = usage_of_messages(messages, FM)
    assert u.calls == {"CALCULATE": 1, "SEARCH": 1} and u.unparsed == 1
    written = [{"role": "assistant", "content": RLLA}]  # an RLLA episode: the reward's reading
    assert usage_of_messages(written, FM, rlla_task=True).calls == {"SEARCH": 2, "CALCULATE": 1}


@pytest.mark.parametrize(
    "mode, expected",
    [("any", 1.0), ("family", 0.5 + 2.0), ("calls", 2 * 0.5 + 1 * 2.0)],
)
def test_cost_modes(mode, expected):
    usage = ToolUsage({"SEARCH": 2, "CALCULATE": 1})
    assert CostModel(mode, c_search=0.5, c_calc=2.0).cost(usage) == pytest.approx(expected)
    assert CostModel(mode).cost(ToolUsage()) == 0.0


def test_calls_mode_is_capped_at_max_calls():
    usage = ToolUsage({"SEARCH": 6, "OTHER": 2})  # 8 calls, cap 4: half of each
    cost = CostModel("calls", c_search=1.0, c_other=3.0, max_calls=4).cost(usage)
    assert cost == pytest.approx((6 * 1.0 + 2 * 3.0) * 0.5)
