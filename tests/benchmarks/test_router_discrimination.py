"""benchmarks/router_discrimination.py: its analysis on hand-made per-task tables (the best
task-blind mix, the type-mean router, outcome and type labels, pooling over seeds, the OTC
policies mixed to the router's cost) and how it runs the shipped config."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from router_discrimination_lib import (  # noqa: E402
    fixed_mix,
    mix_at_cost,
    otc_table,
    outcome_labels,
    per_type_optimum,
    pooled_diff,
    route_share_by_need,
    route_shares,
    seed_summary,
    two_way_se,
    type_labels,
    type_mean_rows,
)

ROUTES = ("ANSWER", "SEARCH", "CALCULATE")


def _row(kind, p_answer, reward_answer, reward_tool, task_id=None):
    """A task with ANSWER and CALCULATE only; a tool call costs 1."""
    return {
        "task_id": task_id or kind,
        "task_type": kind,
        "probs": {"ANSWER": p_answer, "CALCULATE": 1 - p_answer},
        "reward": {"ANSWER": reward_answer, "CALCULATE": reward_tool},
        "cost": {"ANSWER": 0.0, "CALCULATE": 1.0},
    }


def _three(kind, rewards, probs=(1.0, 0.0, 0.0), task_id=None):
    """A task with all three routes; a tool route's call costs 1."""
    return {
        "task_id": task_id or kind,
        "task_type": kind,
        "probs": dict(zip(ROUTES, probs, strict=True)),
        "reward": dict(zip(ROUTES, rewards, strict=True)),
        "cost": dict(zip(ROUTES, (0.0, 1.0, 1.0), strict=True)),
    }


def test_the_blind_mix_at_equal_cost_mixes_the_bracketing_routes():
    rows = [_row("math", 0.0, 0.0, 1.0), _row("chat", 1.0, 1.0, 1.0)]
    mix = fixed_mix(rows, 0.5)  # tools on half the tasks, blind to which
    assert mix["q"] == pytest.approx({"ANSWER": 0.5, "CALCULATE": 0.5})
    assert mix["cost"] == pytest.approx(0.5)
    assert mix["reward"] == pytest.approx(0.75)  # math: 0.5·0 + 0.5·1; chat: 1 either way
    assert mix["per_task"] == pytest.approx([0.5, 1.0])
    assert fixed_mix(rows, 2.0)["q"] == {"ANSWER": 0.0, "CALCULATE": 1.0}  # the nearest route


def test_a_router_that_sends_tools_where_they_pay_beats_the_blind_mix():
    rows = [_row("math", 0.0, 0.0, 1.0, f"m{i}") for i in range(5)]
    rows += [_row("chat", 1.0, 1.0, 1.0, f"c{i}") for i in range(5)]
    got = seed_summary(rows, [True] * 5 + [False] * 5)
    assert (got["reward"], got["cost"]) == pytest.approx((1.0, 0.5))
    assert got["gain_vs_blind"] == pytest.approx(0.25)
    assert got["gain_vs_blind_se"] == pytest.approx(0.25 / 3)  # stdev 0.2635 / √10
    assert got["auroc_need"] == got["auroc_outcome"] == got["auroc_type"] == 1.0
    assert got["route_share"]["math"] == {"ANSWER": 0.0, "CALCULATE": 1.0}
    # a uniform router is the blind mix: no gain
    flat = [_row("math", 0.5, 0.0, 1.0, f"m{i}") for i in range(5)]
    flat += [_row("chat", 0.5, 1.0, 1.0, f"c{i}") for i in range(5)]
    got = seed_summary(flat)
    assert got["gain_vs_blind"] == pytest.approx(0.0, abs=1e-12)
    assert got["auroc_outcome"] == 0.5 and "auroc_need" not in got


def test_the_type_mean_router_takes_what_the_type_says_and_no_more():
    """Within one type, tools pay on half the tasks. A router that puts its tool route there
    gains over the type-mean router at the same cost; one that routes by type only does not."""
    rows = [_row("arith", 0.0, 0.0, 1.0, "need1"), _row("arith", 1.0, 1.0, 1.0, "free1")]
    rows += [_row("arith", 0.0, 0.0, 1.0, "need2"), _row("arith", 1.0, 1.0, 1.0, "free2")]
    typed = type_mean_rows(rows)
    assert all(r["probs"] == {"ANSWER": 0.5, "CALCULATE": 0.5} for r in typed)
    got = seed_summary(rows)
    assert got["type_mean_cost"] == pytest.approx(got["cost"])  # same mix, same spend
    assert got["gain_vs_type_mean"] == pytest.approx(0.25)  # need: +0.5, free: 0
    assert got["auroc_outcome"] == 1.0
    assert got["auroc_type"] is None  # one type: its label cannot rank tasks
    assert got["auroc_outcome_type_mean"] == 0.5  # the type's mean P(tool) ties every task
    by_type = seed_summary(typed)
    assert by_type["gain_vs_type_mean"] == pytest.approx(0.0, abs=1e-12)


def test_outcome_and_type_labels():
    rows = [
        _three("search", (0.0, 0.5, 0.0)),
        _three("search", (0.3, 0.2, 0.1)),  # this one: ANSWER wins, although its type needs SEARCH
        _three("chat", (0.4, 0.4, 0.3)),  # a tie needs no tool
    ]
    assert outcome_labels(rows) == [True, False, False]
    assert type_labels(rows) == [True, True, False]  # search: 0.35 > 0.15


def test_the_type_label_follows_the_datasets_need_flags_when_given():
    """Where a tool route wins on average in every type (so the reward-averaged label puts all
    tasks on one side and the AUROC is undefined), the dataset's need flags still split the
    types; a type whose tasks differ has no type label and stays out of ``auroc_type``."""
    rows = [
        _three("search", (0.0, 0.5, 0.0), (0.2, 0.8, 0.0), "s"),
        _three("chat", (0.3, 0.2, 0.4), (0.9, 0.1, 0.0), "c"),  # a tool route wins here too
        _three("mixed", (0.2, 0.1, 0.5), (0.0, 0.0, 1.0), "m1"),
        _three("mixed", (0.5, 0.1, 0.4), (1.0, 0.0, 0.0), "m2"),
    ]
    assert type_labels(rows) == [True] * 4
    need = [True, False, True, False]
    assert type_labels(rows, need) == [True, False, None, None]
    got = seed_summary(rows, need)
    assert got["auroc_type"] == 1.0  # search's P(tool) 0.8 over chat's 0.1; mixed left out
    assert got["auroc_need"] == 1.0


def test_the_per_type_optimum_spends_on_the_largest_gain_per_call_first():
    rows = [
        _three("lookup", (0.0, 0.54, 0.0)),
        _three("math", (0.32, 0.29, 0.85)),
        _three("chat", (0.38, 0.18, 0.59)),
        _three("lookup", (0.0, 0.54, 0.0)),
    ]
    best = per_type_optimum(rows, 0.6)  # lookup (half the tasks) in full, then 0.1 of math
    assert best["cost"] == pytest.approx(0.6)
    assert best["reward"] == pytest.approx((0.54 * 2 + 0.32 + 0.38) / 4 + 0.1 * 0.53)
    assert best["q"]["math"] == pytest.approx({"ANSWER": 0.6, "SEARCH": 0.0, "CALCULATE": 0.4})
    assert per_type_optimum(rows, 0.0)["reward"] == pytest.approx((0.32 + 0.38) / 4)


def test_route_shares_overall_and_by_need():
    shares = route_shares([_row("a", 0.2, 0, 0), _row("a", 0.4, 0, 0), _row("b", 1.0, 0, 0)])
    assert shares["a"]["ANSWER"] == pytest.approx(0.3)
    assert shares["all"]["ANSWER"] == pytest.approx(1.6 / 3)
    rows = [
        _three("arith", (0, 0, 1), (0.2, 0.0, 0.8)),
        _three("arith", (1, 0, 1), (0.6, 0.0, 0.4)),
        _three("chat", (1, 0, 1), (1.0, 0.0, 0.0)),
    ]
    got = route_share_by_need(rows, [True, False, False])
    assert got["arith"]["no_tool"]["CALCULATE"] == pytest.approx(0.4)
    assert "chat" not in got  # one kind only: the overall split says it


def test_pooling_over_seeds_uses_the_crossed_se():
    one = {"a": 0.1, "b": 0.3, "c": 0.2}
    alone = pooled_diff([one])
    assert alone["gain"] == pytest.approx(0.2) and alone["se"] == pytest.approx(0.1 / math.sqrt(3))
    two = {"a": 0.2, "b": 0.3, "c": 0.0, "d": 9.0}  # "d" is not in every seed: left out
    got = pooled_diff([one, two])
    assert got["tasks"] == 3 and got["gain"] == pytest.approx(1.1 / 6)
    assert got["se"] == pytest.approx(two_way_se([[0.1, 0.2], [0.3, 0.3], [0.2, 0.0]]))
    # tasks x seeds with no interaction and no seed effect: only the task spread counts
    cells = [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    assert two_way_se(cells) == pytest.approx(math.sqrt(2 * 1.0 / 6))


def test_otc_tables_and_their_mix_at_the_routers_cost():
    samples = [
        {"task_id": "1", "task_type": "t", "reward": 1.0, "calls": 1},
        {"task_id": "1", "task_type": "t", "reward": 0.0, "calls": 0},
        {"task_id": "2", "task_type": "t", "reward": 0.5, "calls": 2},
    ]
    table = otc_table(samples, lambda s: float(s["calls"] > 0))
    assert table["t/1"] == {"task_type": "t", "episodes": 2, "reward": 0.5, "cost": 0.5}
    cheap = {"t/1": {"reward": 0.2, "cost": 0.0}, "t/2": {"reward": 0.4, "cost": 0.2}}
    dear = {"t/1": {"reward": 0.8, "cost": 1.0}, "t/2": {"reward": 0.6, "cost": 0.6}}
    got = mix_at_cost({0.5: cheap, 0.1: dear}, 0.3, ["t/1", "t/2"])  # costs 0.1 and 0.8
    w = (0.8 - 0.3) / 0.7  # of the cheap policy
    assert got["bracketed"] and got["penalties"] == [0.1, 0.5]
    assert got["cost"] == pytest.approx(0.3)
    assert got["per_task"]["t/1"] == pytest.approx(w * 0.2 + (1 - w) * 0.8)
    assert got["weight_of_first"] == pytest.approx(1 - w)  # penalty 0.1 is the dear policy
    far = mix_at_cost({0.5: cheap, 0.1: dear}, 0.95, ["t/1", "t/2"])
    assert not far["bracketed"] and far["penalties"] == [0.1] and far["cost"] == pytest.approx(0.8)


def test_router_minus_otc_is_paired_by_task_per_seed_and_pooled():
    import router_discrimination as rd

    rows = [_row("t", 0.0, 0.0, 1.0, "1"), _row("t", 1.0, 0.5, 1.0, "2")]  # cost 0.5, reward .75
    otc = {
        0.1: {"t/1": {"reward": 0.6, "cost": 1.0}, "t/2": {"reward": 0.6, "cost": 1.0}},
        0.9: {"t/1": {"reward": 0.0, "cost": 0.0}, "t/2": {"reward": 0.5, "cost": 0.0}},
    }
    got = rd.otc_entry({0: rows, 1: rows}, {0: otc, 1: otc})
    # at cost 0.5: half of each policy: t/1 0.3, t/2 0.55 -> router − OTC: +0.7, −0.05
    assert got["cost"] == pytest.approx(0.5) and got["bracketed"]
    assert got["reward"] == pytest.approx(0.425)
    assert got["router_minus_otc"] == pytest.approx(0.325)
    assert got["seeds"]["0"]["router_minus_otc"] == pytest.approx(0.325)
    assert math.isfinite(got["router_minus_otc_se"])
    assert rd.otc_entry({0: rows}, {}) == {}


def test_the_runs_use_the_shipped_config_with_no_router_override_but_the_budget():
    import router_discrimination as rd

    from toolgrpo.config.validate import validate_train_config

    validate_train_config(rd.config(rd.train_overrides(1, 0.3)))
    otc = [*rd.train_overrides(1, 0.3), "router.enable=false", "reward.tool_call_cost=0.2"]
    validate_train_config(rd.config(otc))
    cfg = yaml.safe_load(rd.CONFIG.read_text())
    assert set(cfg["router"]) == {"enable", "budget"}  # the library's defaults do the rest
    assert [s.split(":")[0] for s in cfg["data"]["train_files"]] == list(rd.TYPES)
    assert cfg["actor_rollout_ref"]["rollout"]["multi_turn"]["envs"]["direct"]["offer_tools"]
    ov = rd.train_overrides(1, 0.3)
    assert [o for o in ov if o.startswith("router.")] == ["router.budget=0.3"]
    ev = rd.eval_overrides(1, 4)
    assert "data.val_files=[calculator:test,search:test,direct:test,arith_mixed:test]" in ev
    assert "actor_rollout_ref.rollout.val_kwargs.n=4" in ev
    assert "actor_rollout_ref.rollout.val_kwargs.do_sample=true" in ev


def test_kept_evals_and_tables_are_read_instead_of_training_again(tmp_path, monkeypatch):
    import router_discrimination as rd

    def refuse(*a, **k):
        raise AssertionError("trained or evaluated although the result is kept")

    monkeypatch.setattr(rd, "toolgrpo", refuse)
    kept = tmp_path / "kept"
    kept.mkdir()
    rows = [_row("math", 0.0, 0.0, 1.0)]
    offset = {"delta": -0.4}  # the served head's budget offset (router/offset.py)
    routing = {"per_task": rows, "offset": offset}
    record = {"samples": [{"task_id": "1", "messages": ["long"]}], "routing": routing}
    (kept / "eval_router_s0.json").write_text(json.dumps(record))
    table = {"t/1": {"task_type": "t", "episodes": 4, "reward": 0.5, "cost": 0.25}}
    (kept / "table_otc_c0.2_s0.json").write_text(json.dumps(table))
    args = argparse.Namespace(
        work=tmp_path / "work", budget=0.3, episodes=4, extra=[], eval_limit=-1
    )
    args.work.mkdir()
    assert rd.router_seed(0, args, kept) == rows
    assert rd.otc_seed(0, 0.2, args, kept) == table
    # a fresh eval in the work directory is read first, and kept without its episodes' text
    (args.work / "eval_router_s0.json").write_text(
        json.dumps(record | {"routing": {"per_task": rows * 2, "offset": offset}})
    )
    assert rd.router_seed(0, args, kept) == rows * 2
    assert "messages" not in json.loads((kept / "eval_router_s0.json").read_text())["samples"][0]
    # an eval of the head without its offset (before the offset existed) is played again
    for where in (args.work, kept):
        old = record | {"routing": {"per_task": rows}}
        (where / "eval_router_s0.json").write_text(json.dumps(old))
    with pytest.raises(AssertionError, match="trained or evaluated"):
        rd.router_seed(0, args, kept)


def test_each_seed_says_whether_its_held_out_cost_keeps_the_budget():
    import router_discrimination as rd

    near = [_row("math", 0.7, 0.0, 1.0, f"m{i}") for i in range(4)]  # P(tool) 0.3: cost 0.3
    far = [_row("math", 0.9, 0.0, 1.0, f"m{i}") for i in range(4)]  # cost 0.1
    offset = {"delta": -0.4, "spend": 0.3}
    out = rd.summarize({0: near, 1: far}, {}, {}, {0: offset, 1: None}, budget=0.3)
    assert out["seeds"]["0"]["within_budget"] and not out["seeds"]["1"]["within_budget"]
    assert (
        out["seeds"]["0"]["served_offset"] == offset and out["seeds"]["1"]["served_offset"] is None
    )
    assert out["pooled"]["all_within_budget"] is False
    # seed 0's head without its offset: P(ANSWER) 0.7 → odds × e^0.4 (δ = −0.4 taken out)
    bare = out["seeds"]["0"]["without_offset"]
    p_answer = 0.7 * math.exp(0.4) / (0.7 * math.exp(0.4) + 0.3)
    assert bare["cost"] == pytest.approx(1 - p_answer)
    assert "without_offset" not in out["seeds"]["1"]
    assert rd.summarize({0: near}, {}, {}, budget=0.3)["pooled"]["all_within_budget"] is True
