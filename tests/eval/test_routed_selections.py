"""eval/routed.py's selections on hand-built episodes: the router's sampled policy is each route's
result weighted by the head's probability of that route, and the argmax can sit on the other
side of the budget from it."""

from __future__ import annotations

import pytest

from toolgrpo.eval.routed import expected_summary, selection_summary
from toolgrpo.rollout.episode import Episode


def _eps(task_type: str, rewards: list[float], calls: list[int]) -> list[Episode]:
    return [
        Episode(f"t-{task_type}", task_type, "u", [1], reward=r, tool_calls=c)
        for r, c in zip(rewards, calls, strict=True)
    ]


def _played():
    """Two calculator tasks and one direct task, each played twice under each route."""
    by_route = {
        "ANSWER": {0: _eps("calculator", [0, 0], [0, 0]), 1: _eps("calculator", [0, 0], [0, 0])},
        "CALCULATE": {
            0: _eps("calculator", [1, 1], [1, 1]),
            1: _eps("calculator", [1, 0], [1, 0]),
        },
    }
    by_route["ANSWER"][2] = _eps("direct", [1, 1], [0, 0])
    by_route["CALCULATE"][2] = _eps("direct", [1, 0], [0, 0])
    costs = {
        id(e): float(e.tool_calls > 0) for g in by_route.values() for es in g.values() for e in es
    }
    return by_route, costs


class _T:
    def __init__(self, task_type):
        self.task_type = task_type


def test_sampled_policy_weights_each_route_by_its_probability():
    by_route, costs = _played()
    tasks = [_T("calculator"), _T("calculator"), _T("direct")]
    weights = [{"ANSWER": 0.4, "CALCULATE": 0.6}] * 3
    got = expected_summary(tasks, weights, by_route, costs, budget=0.3)
    # calculator: task 0 → 0.6·1, task 1 → 0.6·0.5; cost: 0.6·1 and 0.6·0.5
    assert got["calculator"]["reward_mean"] == pytest.approx((0.6 + 0.3) / 2)
    assert got["calculator"]["cost_mean"] == pytest.approx((0.6 + 0.3) / 2)
    assert got["calculator"]["accuracy"] == pytest.approx((0.6 + 0.3) / 2)
    assert got["direct"]["reward_mean"] == pytest.approx(0.4 * 1 + 0.6 * 0.5)
    assert got["direct"]["cost_mean"] == 0.0
    assert got["all"]["cost_mean"] == pytest.approx((0.6 + 0.3 + 0.0) / 3)
    assert got["all"]["cost_minus_budget"] == pytest.approx(0.3 - 0.3)
    assert got["all"]["route_frac"] == pytest.approx({"ANSWER": 0.4, "CALCULATE": 0.6})
    assert got["all"]["episodes"] == 12 and got["direct"]["episodes"] == 4

    # The argmax of that same head plays CALCULATE everywhere: cost 0.5, over the budget that
    # the sampled policy meets exactly.
    argmax = selection_summary(tasks, ["CALCULATE"] * 3, by_route, costs, 0.3)
    assert argmax["all"]["cost_mean"] == pytest.approx(0.5)


def test_a_one_hot_head_is_its_argmax():
    by_route, costs = _played()
    tasks = [_T("calculator"), _T("calculator"), _T("direct")]
    pick = ["CALCULATE", "CALCULATE", "ANSWER"]
    weights = [{r: float(r == p) for r in by_route} for p in pick]
    got = expected_summary(tasks, weights, by_route, costs, budget=None)
    want = selection_summary(tasks, pick, by_route, costs, None)
    for t in ("calculator", "direct", "all"):
        for k in ("reward_mean", "accuracy", "cost_mean", "tool_call_rate"):
            assert got[t][k] == pytest.approx(want[t][k]), (t, k)
    assert got["all"]["cost_minus_budget"] is None
