"""router/calibrate.py on hand-made numbers: the threshold on P(tool) that keeps the budget, the
route it picks, the inference mode ``auto`` resolves to, and τ's round trip through router.pt."""

from __future__ import annotations

import math

import pytest

from toolgrpo.router.calibrate import (
    Threshold,
    budget_binds,
    calibrate_threshold,
    resolve_infer_mode,
    threshold_route,
    tool_probability,
    top_tool_route,
)

ROUTES = ["ANSWER", "SEARCH", "CALCULATE"]
P_TOOL = [0.9, 0.8, 0.8, 0.3, 0.1]  # the two 0.8s go together


@pytest.mark.parametrize(
    ("budget", "tau", "spend", "share"),
    [
        (0.4, 0.9, 0.2, 0.2),  # τ = 0.8 would send 3 of 5 to a tool: 0.6 > 0.4
        (0.6, 0.8, 0.6, 0.6),  # exactly B meets it
        (0.79, 0.8, 0.6, 0.6),
        (0.8, 0.3, 0.8, 0.8),
        (1.0, 0.1, 1.0, 1.0),  # the budget does not bind: every task to a tool
        (0.1, math.inf, 0.0, 0.0),  # not even the top task fits: never a tool
    ],
)
def test_the_smallest_threshold_within_budget(budget, tau, spend, share):
    got = calibrate_threshold(P_TOOL, [1.0] * 5, budget)
    assert got.tau == tau and got.feasible and got.tasks == 5
    assert got.spend == pytest.approx(spend) and got.tool_share == pytest.approx(share)


def test_costs_per_task_and_under_answer():
    # Task costs differ: the top task costs 2 (calls mode), so it alone spends 0.4 of B = 0.5.
    got = calibrate_threshold([0.9, 0.7, 0.5], [2.0, 0.5, 1.0], budget=1.0)
    assert got.tau == 0.7 and got.spend == pytest.approx(2.5 / 3)
    # ANSWER rollouts that still call tools cost too. Spend is then not monotone in τ: the
    # second task costs less under its tool route, so τ = 0.2 fits B where τ = 0.9 does not.
    got = calibrate_threshold([0.9, 0.2], [1.0, 0.0], 0.5, answer_cost=[0.0, 1.0])
    assert got.tau == 0.2 and got.spend == pytest.approx(0.5) and got.tool_share == 1.0
    got = calibrate_threshold([0.9, 0.2], [1.0, 1.0], 0.75, answer_cost=[0.5, 0.5])
    assert got.tau == 0.9 and got.spend == pytest.approx(0.75)
    over = calibrate_threshold([0.9, 0.2], [1.0, 1.0], 0.3, answer_cost=[0.5, 0.5])
    assert over.tau == math.inf and not over.feasible and over.spend == pytest.approx(0.5)


def test_calibration_checks_its_input():
    with pytest.raises(ValueError):
        calibrate_threshold([], [], 0.3)
    with pytest.raises(ValueError):
        calibrate_threshold([0.5], [1.0, 1.0], 0.3)


def test_threshold_route_takes_the_top_tool_route():
    probs = [0.3, 0.25, 0.45]  # P(tool) = 0.7
    assert tool_probability(probs, ROUTES) == pytest.approx(0.7)
    assert top_tool_route(probs, ROUTES) == "CALCULATE"
    assert threshold_route(probs, ROUTES, 0.7) == "CALCULATE"
    assert threshold_route(probs, ROUTES, 0.71) == "ANSWER"
    assert threshold_route(probs, ROUTES, math.inf) == "ANSWER"
    # ANSWER most probable, yet P(tool) = 0.6 clears τ = 0.5: a tool, unlike the argmax
    assert threshold_route([0.4, 0.35, 0.25], ROUTES, 0.5) == "SEARCH"
    assert top_tool_route([0.2, 0.4, 0.4], ROUTES) == "SEARCH"  # ties: routes order
    assert tool_probability([0.5, 0.5], ["SEARCH", "CALCULATE"]) == 1.0
    with pytest.raises(ValueError):
        top_tool_route([1.0], ["ANSWER"])


def test_auto_mode_is_threshold_when_the_budget_binds():
    assert budget_binds(0.3, 1.0) and not budget_binds(1.0, 1.0) and not budget_binds(None, 1)
    assert resolve_infer_mode("auto", 0.3, 1.0) == "threshold"
    assert resolve_infer_mode("auto", 1.0, 1.0) == "argmax"
    assert resolve_infer_mode("auto", 2.5, 3.0) == "threshold"  # family mode: max cost 3
    for mode in ("threshold", "argmax", "sample"):
        assert resolve_infer_mode(mode, 1.0, 1.0) == mode


def test_threshold_round_trip_and_older_files():
    t = calibrate_threshold(P_TOOL, [1.0] * 5, 0.4, step=7)
    assert Threshold.from_state(t.to_state()) == t
    never = calibrate_threshold(P_TOOL, [1.0] * 5, 0.1)
    assert never.to_state()["tau"] is None  # JSON- and weights-only-safe
    assert Threshold.from_state(never.to_state()) == never
    assert Threshold.from_state(None) is None  # a router.pt from before calibration
    assert Threshold.from_state({"tau": 0.5}) is None  # unreadable: treated as missing
