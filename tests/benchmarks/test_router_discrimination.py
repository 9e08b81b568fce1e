"""benchmarks/router_discrimination.py's analysis: the best task-blind route mix at the router's
cost, the paired gain over it, route shares and the AUROC, on hand-made per-task tables."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from router_discrimination import (  # noqa: E402
    discrimination,
    fixed_mix,
    per_type_optimum,
    previous,
    route_share_by_need,
    route_shares,
)


def _row(kind, p_answer, reward_answer, reward_tool):
    """A task with ANSWER and CALCULATE only; a tool call costs 1."""
    return {
        "task_id": kind,
        "task_type": kind,
        "probs": {"ANSWER": p_answer, "CALCULATE": 1 - p_answer},
        "reward": {"ANSWER": reward_answer, "CALCULATE": reward_tool},
        "cost": {"ANSWER": 0.0, "CALCULATE": 1.0},
    }


def test_the_blind_mix_at_equal_cost_mixes_the_bracketing_routes():
    rows = [_row("math", 0.0, 0.0, 1.0), _row("chat", 1.0, 1.0, 1.0)]
    mix = fixed_mix(rows, 0.5)  # tools on half the tasks, blind to which
    assert mix["q"] == pytest.approx({"ANSWER": 0.5, "CALCULATE": 0.5})
    assert mix["cost"] == pytest.approx(0.5)
    # math: 0.5·0 + 0.5·1; chat: 1 either way
    assert mix["reward"] == pytest.approx(0.75)
    assert mix["per_task"] == pytest.approx([0.5, 1.0])
    # outside every route's cost: the nearest route alone
    assert fixed_mix(rows, 2.0)["q"] == {"ANSWER": 0.0, "CALCULATE": 1.0}


def test_a_router_that_sends_tools_where_they_pay_beats_the_blind_mix():
    rows = [_row("math", 0.0, 0.0, 1.0), _row("chat", 1.0, 1.0, 1.0)] * 5
    got = discrimination(rows, [True, False] * 5)
    assert got["router"] == pytest.approx({"reward": 1.0, "cost": 0.5})
    assert got["fixed_mix"]["gain"] == pytest.approx(0.25)
    assert got["fixed_mix"]["se"] == pytest.approx(0.25 / 3)  # stdev 0.2635 / √10
    assert got["auroc"] == 1.0
    assert got["route_share"]["math"] == {"ANSWER": 0.0, "CALCULATE": 1.0}
    # a uniform router is the blind mix: no gain
    flat = [_row("math", 0.5, 0.0, 1.0), _row("chat", 0.5, 1.0, 1.0)] * 5
    got = discrimination(flat, [True, False] * 5)
    assert got["fixed_mix"]["gain"] == pytest.approx(0.0, abs=1e-12)
    assert got["auroc"] == 0.5


def test_route_shares_average_the_probabilities_per_type_and_overall():
    shares = route_shares([_row("a", 0.2, 0, 0), _row("a", 0.4, 0, 0), _row("b", 1.0, 0, 0)])
    assert shares["a"]["ANSWER"] == pytest.approx(0.3)
    assert shares["all"]["ANSWER"] == pytest.approx(1.6 / 3)


def _three(kind, rewards, probs=(1.0, 0.0, 0.0)):
    """A task with all three routes; a tool route's call costs 1."""
    routes = ("ANSWER", "SEARCH", "CALCULATE")
    return {
        "task_id": kind,
        "task_type": kind,
        "probs": dict(zip(routes, probs, strict=True)),
        "reward": dict(zip(routes, rewards, strict=True)),
        "cost": dict(zip(routes, (0.0, 1.0, 1.0), strict=True)),
    }


def test_the_per_type_optimum_spends_on_the_largest_gain_per_call_first():
    # gains per call: lookup +0.54, math +0.53, chat +0.21 (its SEARCH is dominated)
    rows = [
        _three("lookup", (0.0, 0.54, 0.0)),
        _three("math", (0.32, 0.29, 0.85)),
        _three("chat", (0.38, 0.18, 0.59)),
        _three("lookup", (0.0, 0.54, 0.0)),
    ]
    best = per_type_optimum(rows, 0.6)  # lookup (half the tasks) in full, then 0.1 of math
    assert best["cost"] == pytest.approx(0.6)
    assert best["reward"] == pytest.approx((0.54 * 2 + 0.32 + 0.38) / 4 + 0.1 * 0.53)
    assert best["q"]["lookup"]["SEARCH"] == pytest.approx(1.0)
    assert best["q"]["math"] == pytest.approx({"ANSWER": 0.6, "SEARCH": 0.0, "CALCULATE": 0.4})
    assert best["q"]["chat"]["ANSWER"] == 1.0
    # more budget than every gain can use: the tools that pay, and no more
    rich = per_type_optimum(rows, 1.0)
    assert rich["cost"] == pytest.approx(1.0)
    assert rich["reward"] == pytest.approx((0.54 * 2 + 0.85 + 0.59) / 4)
    # no budget: everyone answers
    assert per_type_optimum(rows, 0.0)["reward"] == pytest.approx((0.32 + 0.38) / 4)


def test_route_shares_split_by_need_over_all_and_within_a_mixed_type():
    rows = [
        _three("arith", (0, 0, 1), (0.2, 0.0, 0.8)),
        _three("arith", (1, 0, 1), (0.6, 0.0, 0.4)),
        _three("chat", (1, 0, 1), (1.0, 0.0, 0.0)),
    ]
    got = route_share_by_need(rows, [True, False, False])
    assert got["all"]["needs_tool"]["ANSWER"] == pytest.approx(0.2)
    assert got["all"]["no_tool"]["ANSWER"] == pytest.approx(0.8)
    assert got["arith"]["no_tool"]["CALCULATE"] == pytest.approx(0.4)
    assert "chat" not in got  # one kind only: the overall split says it


def test_one_run_keeps_the_other_runs_result_of_the_same_work_directory(tmp_path):
    work = tmp_path / "work"
    (tmp_path / "router_discrimination.json").write_text(
        json.dumps({"work": str(Path("..") / "x"), "B=0.3": {"tasks": 1}, "held_out": {}})
    )
    args = argparse.Namespace(results=tmp_path, work=work, probe_only=False)
    assert previous(args) == {}  # another work directory: nothing carried over
    rel = os.path.relpath(work.resolve(), REPO)
    (tmp_path / "router_discrimination.json").write_text(
        json.dumps({"work": rel, "B=0.3": {"tasks": 1}, "held_out": {"calculator": 34}})
    )
    assert previous(args) == {"B=0.3": {"tasks": 1}}


def test_a_kept_eval_is_read_instead_of_training_again(tmp_path, monkeypatch):
    import router_budget
    import router_discrimination as rd

    def refuse(*a, **k):
        raise AssertionError("trained or evaluated although the eval is kept")

    monkeypatch.setattr(router_budget, "run_one", refuse)
    monkeypatch.setattr(rd.subprocess, "run", refuse)
    results = tmp_path / "results"
    rows = [_row("math", 0.0, 0.0, 1.0)]
    record = {"samples": [{"task_id": "1", "messages": ["long"]}], "routing": {"per_task": rows}}
    kept = results / "router_discrimination_kept" / "work" / "eval_B=0.3.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(record))
    args = argparse.Namespace(steps=60, seed=0, extra=[], results=results)
    got = rd.train_and_eval("B=0.3", 0.3, args, tmp_path / "work")
    assert got == {"checkpoint": None, "rows": rows}
    # a fresh eval in the work directory is read first, and kept without its episodes' text
    work_eval = tmp_path / "work" / "eval_B=0.3.json"
    work_eval.parent.mkdir()
    work_eval.write_text(json.dumps({**record, "routing": {"per_task": rows * 2}}))
    assert rd.train_and_eval("B=0.3", 0.3, args, tmp_path / "work")["rows"] == rows * 2
    assert "messages" not in json.loads(kept.read_text())["samples"][0]
