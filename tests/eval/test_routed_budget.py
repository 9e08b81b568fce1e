"""Routed evaluation keeps the budget by default (eval/routed.py with a stub head and stub
episodes): the headline ``router`` is the sampled policy when the budget binds, the argmax is
reported under its own name, the threshold policy calibrated on the tasks spends at most B, and
P(tool)'s AUROC against the need-a-tool label is in the report."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from toolgrpo.data.task import Task
from toolgrpo.eval import routed
from toolgrpo.eval.routed import RoutedSetup, play_routed, report_lines, routed_metrics
from toolgrpo.rollout.episode import Episode
from toolgrpo.router.calibrate import Threshold
from toolgrpo.router.families import FamilyMap
from toolgrpo.router.usage import CostModel

ROUTES = ["ANSWER", "SEARCH", "CALCULATE"]
# (task type, head probabilities): P(tool) 0.60 0.56 0.54 | 0.58 0.53 0.52 | 0.02 × 4. The
# argmax plays a tool on six tasks of ten (cost 0.6); the sampled policy spends 0.341.
HEAD = [
    ("calculator", [0.40, 0.02, 0.58]),
    ("calculator", [0.44, 0.02, 0.54]),
    ("calculator", [0.46, 0.02, 0.52]),
    ("search", [0.42, 0.56, 0.02]),
    ("search", [0.47, 0.51, 0.02]),
    ("search", [0.48, 0.50, 0.02]),
    *[("direct", [0.98, 0.01, 0.01])] * 4,
]
SOLVES = {"calculator": "CALCULATE", "search": "SEARCH"}  # direct: every route solves it
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+1"}}\n</tool_call>'


def _tasks():
    return [
        Task(f"{t}-{i}", ({"role": "user", "content": "q"},), "", t, t)
        for i, (t, _) in enumerate(HEAD)
    ]


def _stub(monkeypatch, played):
    """The head's probabilities without a model; episodes that call a tool under tool routes
    and succeed under the task type's own route (a direct task under any)."""
    probs = {f"{t}-{i}": p for i, (t, p) in enumerate(HEAD)}

    def greedy(policy, tasks, max_len):
        ps = [probs[t.task_id] for t in tasks]
        return [ROUTES[max(range(3), key=p.__getitem__)] for p in ps], ps

    monkeypatch.setattr(routed, "greedy_routes", greedy)
    monkeypatch.setattr(routed, "route_lengths", lambda *a: [None] * len(a[1]))

    def play(tasks, conds):
        n = len(conds) // len(tasks)
        out = []
        for j, route in enumerate(conds):
            t = tasks[j // n]
            played.append((t.task_id, route))
            tool = route != "ANSWER"
            won = t.task_type == "direct" or SOLVES[t.task_type] == route
            msgs = [{"role": "assistant", "content": CALL if tool else "4"}]
            out.append(
                Episode(
                    t.task_id,
                    t.task_type,
                    "u",
                    [1],
                    messages=msgs,
                    reward=float(won),
                    tool_calls=int(tool),
                )
            )
        return out

    return play


def _setup(budget=0.3, baselines=True, threshold=None):
    policy = SimpleNamespace(routes=ROUTES, lm=SimpleNamespace(tokenizer=None))
    return RoutedSetup(
        policy, lambda r: r, FamilyMap(), CostModel(), budget, baselines, threshold=threshold
    )


def test_headline_is_the_sampled_policy_and_the_threshold_keeps_the_budget(monkeypatch):
    played: list = []
    run = play_routed(_setup(), _tasks(), 2, 4096, _stub(monkeypatch, played))
    rep = run.report
    sel = rep["selections"]
    assert rep["headline"] == "router_sampled" and sel["router"] == sel["router_sampled"]
    assert list(sel)[:4] == ["router", "router_sampled", "router_argmax", "router_threshold"]
    assert sel["router"]["all"]["cost_mean"] == pytest.approx(0.341)
    assert sel["router_argmax"]["all"]["cost_mean"] == pytest.approx(0.6)  # over B: the bug
    # τ = 0.56: the three tasks the head most wants a tool for, 0.3 spent of B = 0.3
    assert run.calibrated.tau == pytest.approx(0.56) and run.calibrated.feasible
    thr = sel["router_threshold"]
    assert thr["all"]["cost_mean"] == pytest.approx(0.3) and thr["all"]["cost_minus_budget"] <= 1e-9
    assert thr["calculator"]["route_frac"] == pytest.approx({"ANSWER": 1 / 3, "CALCULATE": 2 / 3})
    # 7 successes (c0, c1, s0 with a tool; the four direct tasks without) for 3 calls
    assert thr["all"]["correct_per_call"] == pytest.approx(7 / 3)
    assert rep["threshold"]["source"].startswith("calibrated on these tasks")
    # need-a-tool per task (every route played): calculator and search tasks; P(tool) ranks
    # them all above the direct tasks
    need = rep["tool_need"]
    assert need["label"] == "task" and need["by_type"]["all"]["auroc"] == 1.0
    assert need["by_type"]["all"]["need_tool"] == pytest.approx(0.6)
    assert need["by_type"]["direct"]["auroc"] is None  # one class
    m = routed_metrics(rep, "val")
    assert m["val/all/cost/mean"] == pytest.approx(0.341)
    assert m["val/all/cost_minus_budget"] == pytest.approx(0.041)
    assert m["val/argmax/all/cost_mean"] == pytest.approx(0.6)
    assert m["val/argmax/all/cost_minus_budget"] == pytest.approx(0.3)
    assert m["val/threshold/all/cost_mean"] == pytest.approx(0.3)
    assert m["val/sampled/all/cost_mean"] == pytest.approx(0.341)
    assert m["val/threshold/tau"] == pytest.approx(0.56) and m["val/router/headline_sampled"] == 1
    assert m["val/all/tool_auroc"] == 1.0 and "val/direct/tool_auroc" not in m
    assert m["val/route_share/direct/ANSWER"] == pytest.approx(0.98)
    assert m["val/argmax/route_share/calculator/CALCULATE"] == 1.0
    assert m["val/threshold/route_share/search/SEARCH"] == pytest.approx(1 / 3)
    assert "val/baseline/best_in_hindsight/all/reward_mean" in m
    # The played episodes (the episode summary, samples, dumps) are the headline's: one draw
    assert len(run.episodes) == 20 and set(run.routes) <= set(ROUTES)
    assert len(played) == 3 * 10 * 2  # every route played for the baselines
    json.dumps(rep)  # the report goes into the eval JSON as is
    assert any(
        line.startswith("  threshold: tool iff P(tool) >= 0.560") for line in report_lines(rep)
    )


def test_without_a_binding_budget_the_headline_is_the_argmax(monkeypatch):
    run = play_routed(_setup(budget=1.0), _tasks(), 1, 4096, _stub(monkeypatch, []))
    sel = run.report["selections"]
    assert run.report["headline"] == "router_argmax" and sel["router"] == sel["router_argmax"]
    assert run.routes == [ROUTES[max(range(3), key=p.__getitem__)] for _, p in HEAD]
    assert routed_metrics(run.report)["val/router/headline_sampled"] == 0.0


def test_a_checkpoints_threshold_is_applied_as_is(monkeypatch):
    saved = Threshold(0.59, 0.3, 1.0, 0.1, 0.1, 50, True, step=3)
    run = play_routed(_setup(threshold=saved), _tasks(), 1, 4096, _stub(monkeypatch, []))
    thr = run.report["selections"]["router_threshold"]
    assert thr["all"]["cost_mean"] == pytest.approx(0.1)  # only P(tool) 0.60 clears 0.59
    assert run.report["threshold"]["source"] == "checkpoint"
    assert run.report["threshold"]["tau"] == 0.59 and run.calibrated.tau == pytest.approx(0.56)


def test_without_baselines_answer_and_the_tool_route_are_played(monkeypatch):
    """Each task under ANSWER and its top tool route (what a threshold chooses between), plus
    its seeded draw when that is a third route; the sampled policy is that draw."""
    played: list = []
    setup = _setup(baselines=False)
    run = play_routed(setup, _tasks(), 1, 4096, _stub(monkeypatch, played))
    per_task: dict = {}
    for tid, r in played:
        per_task.setdefault(tid, set()).add(r)
    assert per_task["calculator-0"] >= {"ANSWER", "CALCULATE"}
    assert per_task["search-3"] >= {"ANSWER", "SEARCH"}
    assert 20 <= len(played) < 30
    sel = run.report["selections"]
    assert set(sel) == {"router", "router_sampled", "router_argmax", "router_threshold"}
    assert sel["router"] == sel["router_sampled"]
    assert run.calibrated.tau == pytest.approx(0.56)  # the same τ as with every route played
    assert sel["router_threshold"]["all"]["cost_mean"] == pytest.approx(0.3)
    assert sel["router_sampled"]["all"]["episodes"] == 10
    assert run.report["tool_need"]["label"] == "type"
    # the draw is seeded: the same head and seed play the same routes
    again = play_routed(setup, _tasks(), 1, 4096, _stub(monkeypatch, []))
    assert again.routes == run.routes
