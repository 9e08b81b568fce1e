"""Deterministic routing that keeps the budget: a tool route iff P(tool) >= τ.

The head's argmax is not what the budget constrains (training samples routes, so only the
sampled policy's mean cost is held near B): a head at 30 % ANSWER and 35 % on each tool route
plays a tool on every prompt under argmax, one at 40 % / 30 % / 30 % none. A threshold on
P(tool) = 1 − P(ANSWER) ranks prompts by how much the head wants a tool and spends the budget on
the top of that ranking. τ is fit on validation tasks
whose cost under ANSWER and under a tool route was measured (``calibrate_threshold``), stored with
the head (``router.pt``'s ``threshold`` entry) and read back by ``toolgrpo infer`` and eval.
The tool route taken is the head's most probable non-ANSWER route.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from toolgrpo.router.routes import ANSWER

THRESHOLD_KEY = "threshold"  # router.pt's entry (absent in checkpoints from before it)
_EPS = 1e-9  # spend within float noise of B meets it


@dataclass(frozen=True)
class Threshold:
    """A calibrated τ and what it did on the tasks it was fit on."""

    tau: float  # a tool route iff P(tool) >= tau; inf = never (ANSWER everywhere)
    budget: float  # B it was fit for
    max_cost: float  # the cost model's top: the budget binds iff budget < max_cost
    spend: float  # mean cost per task on the calibration tasks at tau
    tool_share: float  # share of the calibration tasks sent to a tool route
    tasks: int
    feasible: bool  # False: even ANSWER everywhere spent more than the budget
    step: int = -1  # the training step whose head was calibrated (-1: unknown)

    def to_state(self) -> dict[str, Any]:
        """Plain floats for ``router.pt`` (weights-only loading) and JSON (inf → None)."""
        d = asdict(self)
        d["tau"] = self.tau if math.isfinite(self.tau) else None
        return d

    @classmethod
    def from_state(cls, d: Any) -> Threshold | None:
        """None for a missing or unreadable entry (an older ``router.pt``)."""
        if not isinstance(d, Mapping):
            return None
        try:
            tau = math.inf if d.get("tau") is None else float(d["tau"])
            return cls(
                tau,
                float(d["budget"]),
                float(d["max_cost"]),
                float(d["spend"]),
                float(d["tool_share"]),
                int(d["tasks"]),
                bool(d["feasible"]),
                int(d.get("step", -1)),
            )
        except (KeyError, TypeError, ValueError):
            return None


def budget_binds(budget: float | None, max_cost: float) -> bool:
    """Whether the budget constrains anything: B below the largest cost an episode can have."""
    return budget is not None and budget < max_cost - _EPS


def resolve_infer_mode(mode: str, budget: float | None, max_cost: float) -> str:
    """``auto`` → ``threshold`` when the budget binds, else ``argmax``; other modes as given."""
    if mode == "auto":
        return "threshold" if budget_binds(budget, max_cost) else "argmax"
    return mode


def tool_probability(probs: Sequence[float], routes: Sequence[str]) -> float:
    """P(tool route) = 1 − P(ANSWER) (1 when ANSWER is not a route)."""
    return 1.0 - float(probs[list(routes).index(ANSWER)]) if ANSWER in routes else 1.0


def top_tool_route(probs: Sequence[float], routes: Sequence[str]) -> str:
    """The most probable non-ANSWER route (ties: ``routes`` order)."""
    tools = [(p, -i, r) for i, (r, p) in enumerate(zip(routes, probs, strict=True)) if r != ANSWER]
    if not tools:
        raise ValueError(f"no tool route among {list(routes)}")
    return max(tools)[2]


def threshold_route(probs: Sequence[float], routes: Sequence[str], tau: float) -> str:
    """The top tool route when P(tool) >= tau, else ANSWER."""
    if tool_probability(probs, routes) >= tau:
        return top_tool_route(probs, routes)
    return ANSWER


def calibrate_threshold(
    p_tool: Sequence[float],
    tool_cost: Sequence[float],
    budget: float,
    answer_cost: Sequence[float] | None = None,
    max_cost: float = 1.0,
    step: int = -1,
) -> Threshold:
    """The smallest τ (the most tool routing) whose mean spend on these tasks is <= ``budget``,
    routing task i to a tool iff ``p_tool[i] >= τ``. ``tool_cost[i]`` / ``answer_cost[i]``
    (default 0) are task i's expected cost under its tool route / under ANSWER. τ is one of the
    ``p_tool`` values, so tasks with equal P(tool) go together; when even ANSWER everywhere is
    over budget, τ = inf (never a tool) and ``feasible`` is False."""
    n = len(p_tool)
    if n == 0 or len(tool_cost) != n or (answer_cost is not None and len(answer_cost) != n):
        raise ValueError(f"calibrate_threshold: {n} probabilities, {len(tool_cost)} tool costs")
    ans = [0.0] * n if answer_cost is None else [float(c) for c in answer_cost]
    order = sorted(range(n), key=lambda i: -p_tool[i])
    spend = sum(ans)
    best = (math.inf, spend, 0) if spend / n <= budget + _EPS else None
    i = 0
    while i < n:
        tau = float(p_tool[order[i]])
        while i < n and p_tool[order[i]] == tau:
            spend += float(tool_cost[order[i]]) - ans[order[i]]
            i += 1
        if spend / n <= budget + _EPS:
            best = (tau, spend, i)  # descending τ: the last feasible one is the smallest
    feasible = best is not None
    tau, spend, k = best if best is not None else (math.inf, sum(ans), 0)
    return Threshold(tau, float(budget), float(max_cost), spend / n, k / n, n, feasible, step)
