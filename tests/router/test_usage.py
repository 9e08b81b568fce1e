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


def test_answers_without_a_usable_call_cost_nothing():
    assert not usage_of_text("<think> x </think>\n<response> hi </response>", FM).used_any_tool
    assert not usage_of_text("<tool_call>\nnot json\n</tool_call>", FM).used_any_tool


def test_episodes_count_executed_calls_else_written_ones():
    executed = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": '<tool_call>{"name": "calculate"}</tool_call>'},
        {"role": "tool", "name": "calculate", "content": "2"},
        {"role": "assistant", "content": '<tool_call>{"name": "search"}</tool_call>'},
    ]  # the last call was cut by max_turns: never run, never paid
    assert usage_of_messages(executed, FM).calls == {"CALCULATE": 1}
    written = [{"role": "assistant", "content": RLLA}]  # RLLA runs no tool: what was written
    assert usage_of_messages(written, FM).calls == {"SEARCH": 2, "CALCULATE": 1}


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
