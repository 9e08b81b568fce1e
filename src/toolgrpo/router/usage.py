"""Which tools a trajectory used, per family, and what that cost.

Single-turn RLLA answers are parsed the way the rollout parses calls (``tools.parser``, which
reads RLLA's one-JSON-per-line blocks) after the reward's ``extract_answer``; multi-turn episodes
count the calls their environment executed (one ``tool`` message each). Only calls with a name
count: a block that does not parse reaches no tool and costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgrpo.config.router import COST_MODES, RouterCostConfig
from toolgrpo.rewards.rlla import extract_answer
from toolgrpo.router.families import FamilyMap
from toolgrpo.router.routes import CALCULATE, SEARCH
from toolgrpo.tools.parser import parse_tool_calls


@dataclass(frozen=True)
class ToolUsage:
    calls: dict[str, int] = field(default_factory=dict)  # family -> number of calls

    @property
    def num_calls(self) -> int:
        return sum(self.calls.values())

    @property
    def used_any_tool(self) -> bool:
        return self.num_calls > 0

    @property
    def used_search(self) -> bool:
        return self.calls.get(SEARCH, 0) > 0

    @property
    def used_calculate(self) -> bool:
        return self.calls.get(CALCULATE, 0) > 0


def usage_of_names(names: Sequence[str], families: FamilyMap) -> ToolUsage:
    calls: dict[str, int] = {}
    for n in names:
        if n:
            fam = families.family(n)
            calls[fam] = calls.get(fam, 0) + 1
    return ToolUsage(calls)


def usage_of_text(solution: str, families: FamilyMap) -> ToolUsage:
    """Calls written in a single-turn answer (a decoded prompt + response, or a bare response)."""
    answer = extract_answer(solution)
    return usage_of_names([c.name for c in parse_tool_calls(answer) if not c.parse_error], families)


def usage_of_messages(messages: Sequence[Mapping[str, Any]], families: FamilyMap) -> ToolUsage:
    """Calls an episode made: its executed calls (``tool`` messages) if any, else the calls its
    assistant turns wrote (single-turn environments such as RLLA run none)."""
    executed = [str(m.get("name") or "") for m in messages if m.get("role") == "tool"]
    if any(executed):
        return usage_of_names(executed, families)
    written = [
        c.name
        for m in messages
        if m.get("role") == "assistant"
        for c in parse_tool_calls(str(m.get("content") or ""))
        if not c.parse_error
    ]
    return usage_of_names(written, families)


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

    def cost(self, usage: ToolUsage) -> float:
        if self.mode == "any":
            return float(usage.used_any_tool)
        if self.mode == "family":
            return float(sum(self.weight(f) for f, n in usage.calls.items() if n > 0))
        if self.mode == "calls":
            total = sum(n * self.weight(f) for f, n in usage.calls.items())
            return float(total * min(1.0, self.max_calls / max(usage.num_calls, 1)))
        raise ValueError(f"unknown cost mode {self.mode!r}; known: {', '.join(COST_MODES)}")
