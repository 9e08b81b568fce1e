"""Which tools a trajectory used, per family, and what that cost.

Calls are read the way the trajectory's reward reads them. RLLA answers (single-turn, or the
one turn of an RLLA episode): the reward's ``extract_answer`` and its ``parse_tool_calls`` over
the first ``<tool_call>`` block, one call per JSON line; a block the reward cannot parse, and
each block after the first (which the reward never reads), is one unreadable call. Environment
episodes: every block of every assistant turn as the episode loop parsed it to run it
(``tools.parser``), whether it ran, failed, was refused by its route, or was cut off by the
turn limit. So any ``<tool_call>`` block is a tool use: writing it malformed saves nothing. An
unreadable call is priced as the dearest family.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgrpo.config.router import COST_MODES, RouterCostConfig
from toolgrpo.rewards import rlla
from toolgrpo.rewards.rlla import TOOL_OPEN, extract_answer
from toolgrpo.router.families import FamilyMap
from toolgrpo.router.routes import CALCULATE, FAMILIES, SEARCH
from toolgrpo.tools.parser import parse_tool_calls


@dataclass(frozen=True)
class ToolUsage:
    calls: dict[str, int] = field(default_factory=dict)  # family -> number of calls
    unparsed: int = 0  # calls written but unreadable (no tool name): family unknown

    @property
    def num_calls(self) -> int:
        return sum(self.calls.values()) + self.unparsed

    @property
    def used_any_tool(self) -> bool:
        return self.num_calls > 0

    @property
    def used_search(self) -> bool:
        return self.calls.get(SEARCH, 0) > 0

    @property
    def used_calculate(self) -> bool:
        return self.calls.get(CALCULATE, 0) > 0


def usage_of_names(names: Sequence[str], families: FamilyMap, unparsed: int = 0) -> ToolUsage:
    """Calls by name; an empty name is an unreadable call."""
    calls: dict[str, int] = {}
    for n in names:
        if n:
            fam = families.family(n)
            calls[fam] = calls.get(fam, 0) + 1
        else:
            unparsed += 1
    return ToolUsage(calls, unparsed)


def rlla_call_names(answer: str) -> tuple[list[str], int]:
    """The tool names of an RLLA answer as the RLLA reward reads them, and the number of
    unreadable calls: the first block parsed by the reward (all of it unreadable when the reward
    cannot parse it), and one per further block."""
    blocks = answer.count(TOOL_OPEN)
    if blocks == 0:
        return [], 0
    try:
        calls = rlla.parse_tool_calls(answer)
    except ValueError:
        return [], blocks
    return [str(c.get("name") or "") for c in calls], blocks - 1


def usage_of_text(solution: str, families: FamilyMap) -> ToolUsage:
    """Calls written in an RLLA answer (a decoded prompt + response, or a bare response)."""
    names, unparsed = rlla_call_names(extract_answer(solution))
    return usage_of_names(names, families, unparsed)


def usage_of_messages(
    messages: Sequence[Mapping[str, Any]], families: FamilyMap, rlla_task: bool = False
) -> ToolUsage:
    """Calls an episode's assistant turns wrote: read as the RLLA reward reads them
    (``rlla_task``), else as the episode loop parsed them to run them."""
    turns = [str(m.get("content") or "") for m in messages if m.get("role") == "assistant"]
    if rlla_task:
        found = [rlla_call_names(t) for t in turns]
        return usage_of_names(
            [n for names, _ in found for n in names], families, sum(k for _, k in found)
        )
    return usage_of_names([c.name for t in turns for c in parse_tool_calls(t)], families)


def usage_of_episode(episode: Any, families: FamilyMap) -> ToolUsage:
    """``usage_of_messages`` for an ``Episode`` (RLLA episodes read as the RLLA reward reads)."""
    return usage_of_messages(episode.messages, families, episode.task_type == "rlla")


def usage_of_rollout(item: Any, families: FamilyMap, tokenizer: Any) -> ToolUsage:
    """The calls of one rollout as a step holds it: an episode, or a single-turn
    ``(completion, uid, task)`` whose tokens are decoded and read as the RLLA reward reads."""
    if isinstance(item, tuple):
        text = tokenizer.decode(item[0].token_ids, skip_special_tokens=False)
        return usage_of_text(text, families)
    return usage_of_episode(item, families)


@dataclass(frozen=True)
class CostModel:
    """``any``: 1 if any tool was called; ``family``: the weights of the families used;
    ``calls``: the weight of every call, scaled down to ``max_calls`` calls when there are more
    (so the cost is bounded: ``config.router.max_cost`` is the budget's upper end)."""

    mode: str = "any"
    c_search: float = 1.0
    c_calc: float = 1.0
    c_other: float = 1.0
    max_calls: int = 4

    @classmethod
    def from_config(cls, c: RouterCostConfig) -> CostModel:
        return cls(c.mode, c.c_search, c.c_calc, c.c_other, c.max_calls)

    def weight(self, family: str) -> float:
        return {SEARCH: self.c_search, CALCULATE: self.c_calc}.get(family, self.c_other)

    def dearest(self) -> str:
        """The family an unreadable call is priced as: writing a call badly never saves cost."""
        return max(FAMILIES, key=self.weight)

    def cost(self, usage: ToolUsage) -> float:
        if self.mode == "any":
            return float(usage.used_any_tool)
        calls = dict(usage.calls)
        if usage.unparsed:
            calls[self.dearest()] = calls.get(self.dearest(), 0) + usage.unparsed
        if self.mode == "family":
            return float(sum(self.weight(f) for f, n in calls.items() if n > 0))
        if self.mode == "calls":
            total = sum(n * self.weight(f) for f, n in calls.items())
            return float(total * min(1.0, self.max_calls / max(usage.num_calls, 1)))
        raise ValueError(f"unknown cost mode {self.mode!r}; known: {', '.join(COST_MODES)}")
