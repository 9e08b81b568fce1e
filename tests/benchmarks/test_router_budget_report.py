"""benchmarks/router_budget_report.py: where a run settled, why it did not, the held-out routed
policy beside the fixed routes, and the table, on per-step rows shaped like a run's log."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from router_budget_report import (  # noqa: E402
    TOLERANCE,
    diagnose,
    held_out,
    plot,
    summarize,
    table,
)


def _rows(costs, lambdas, answer=0.2, answer_cost=0.0, val=None):
    rows = []
    for i, (c, lam) in enumerate(zip(costs, lambdas, strict=True)):
        rows.append(
            {
                "step": i + 1,
                "router/cost/mean": c,
                "router/lambda": lam,
                "router/task_reward/mean": 0.3,
                "router/route_frac/ANSWER": answer,
                "router/route_frac/SEARCH": (1 - answer) / 2,
                "router/route_frac/CALCULATE": (1 - answer) / 2,
                "router/cost/ANSWER": answer_cost,
                "router/calculator/cost/mean": c,
                "router/calculator/task_reward/mean": 0.4,
            }
        )
    if val:
        rows[-1].update(val)
    return rows


def test_summarize_means_the_last_quarter_and_checks_the_tolerance():
    costs = [0.9] * 6 + [0.32, 0.28]  # the last quarter of 8 steps is the last 2
    s = summarize(_rows(costs, [0.1] * 8), budget=0.3, mode="reward", seconds=80.0)
    assert s["cost_last_quarter"] == pytest.approx(0.30)
    assert s["settled"] is True
    assert s["seconds_per_step"] == pytest.approx(10.0)
    assert s["by_task_type"].keys() == {"calculator"}  # types the run never logged are left out
    assert s["cost_last_quarter_se"] == pytest.approx(0.02)  # sample stdev 0.0283 over √2 steps
    off = summarize(_rows([0.3] * 6 + [0.3 + 2 * TOLERANCE] * 2, [0.1] * 8), 0.3, "reward", 1.0)
    assert off["settled"] is False


def test_diagnose_says_why_the_cost_did_not_settle():
    settled = summarize(_rows([0.3] * 8, [0.2] * 8), 0.3, "reward", 1.0)
    assert diagnose(settled, [], free_rate=0.58) is None

    loose = summarize(_rows([0.5] * 8, [0.0] * 8), 0.6, "reward", 1.0)
    assert "does not bind" in diagnose(loose, [], free_rate=0.58)
    level = {"mean": -0.01, "se": 0.01, "steps": 2}  # the same cost as unconstrained, paired
    assert "does not bind" in diagnose(loose, [], free_rate=0.58, gap=level)
    below = {"mean": -0.08, "se": 0.01, "steps": 2}  # λ held it clearly below the free policy
    assert "lagrangian=advantage" in diagnose(loose, [], free_rate=0.58, gap=below)
    loose_adv = summarize(_rows([0.5] * 8, [0.0] * 8), 0.6, "advantage", 1.0)
    why = diagnose(loose_adv, [], free_rate=0.58, gap=below)
    assert "undershoot" in why and "update_every" in why and "lagrangian=advantage" not in why

    rows = _rows([0.6] * 8, [0.5] * 8, answer_cost=0.4)
    floor = summarize(rows, 0.1, "reward", 1.0)
    assert "cost floor" in diagnose(floor, rows, free_rate=0.58)

    rows = _rows([0.6, 0.5, 0.3, 0.1, 0.0, 0.05, 0.07, 0.08], [0.2, 0.5, 0.7, 0.4, 0.1, 0, 0, 0])
    over = summarize(rows, 0.3, "reward", 1.0)
    assert diagnose(over, rows, free_rate=0.58).startswith("overshoot: λ rose to 0.70")

    rows = _rows(
        [0.5, 0.4, 0.1, 0.05, 0.0, 0.02, 0.0, 0.01], [0, 0.9, 0.8, 0.5, 0.3, 0.2, 0.1, 0.08]
    )
    rows = [{**r, "router/route_frac/ANSWER": 0.95} for r in rows]
    bleeding = summarize(rows, 0.1, "reward", 1.0)  # λ still > 0, the router stuck on ANSWER
    assert "while λ bled off (still 0.09)" in diagnose(bleeding, rows, free_rate=0.58)

    rows = _rows([0.6] * 8, [0.1 * i for i in range(8)])
    slow = summarize(rows, 0.3, "reward", 1.0)
    assert "not converged in 8 steps" in diagnose(slow, rows, free_rate=0.58)
    assert "still moving" in diagnose(slow, rows, free_rate=0.58)


def _val():
    out = {}
    for t, acc in (("all", 0.4), ("search", 0.5)):
        out[f"val/{t}/reward_mean"] = acc
        out[f"val/{t}/accuracy"] = acc
        out[f"val/{t}/cost/mean"] = 0.3
        out[f"val/{t}/route/SEARCH"] = 1.0
        out[f"val/baseline/always_answer/{t}/accuracy"] = 0.1
        out[f"val/baseline/always_answer/{t}/reward_mean"] = 0.1
        out[f"val/sampled/{t}/accuracy"] = 0.35
    return out


def test_held_out_reads_the_last_validation_and_the_baselines():
    rows = _rows([0.3] * 4, [0.1] * 4, val=_val())
    ho = held_out(rows)
    assert set(ho) == {"search", "all"}
    assert ho["all"]["router"]["accuracy"] == 0.4
    assert ho["all"]["router"]["route_frac"]["SEARCH"] == 1.0
    assert ho["all"]["router"]["route_frac"]["ANSWER"] == 0.0
    assert ho["search"]["always_answer"]["accuracy"] == 0.1
    assert ho["search"]["always_family"]["accuracy"] is None  # not logged: no number made up
    assert ho["all"]["router_sampled"]["accuracy"] == 0.35  # the sampled policy's own prefix
    assert held_out(_rows([0.3], [0.1])) == {}


def test_table_reports_accuracy_with_its_standard_error(capsys, tmp_path):
    rows = _rows([0.3] * 4, [0.1] * 4, val=_val())
    runs = {"B=0.3 reward": {"rows": rows, "summary": summarize(rows, 0.3, "reward", 4.0)}}
    runs["B=0.3 reward"]["summary"]["vs_unconstrained_paired"] = {"mean": -0.25, "se": 0.02}
    table(runs, markdown=True, n_val=100)
    out = capsys.readouterr().out
    se = math.sqrt(0.4 * 0.6 / 100)
    line = next(ln for ln in out.splitlines() if ln.startswith("| B=0.3 reward"))
    assert f"0.400 ± {se:.3f}" in line and "| yes |" in line and "0.100 ± 0.030" in line
    assert "| -0.250 ± 0.020 |" in line
    plot(runs, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    json.dumps(runs)  # what router_budget.json records is plain JSON


def test_report_plan_is_every_run_on_record(tmp_path):
    from router_budget import on_record

    for name in ("B=0.3_advantage", "B=0.1_reward", "B=0.3_reward", "unconstrained"):
        (tmp_path / f"{name}.json").write_text("{}")
    (tmp_path / "plain_ascent").mkdir()
    (tmp_path / "plain_ascent" / "B=0.6_reward.json").write_text("{}")  # kept aside: not a run
    assert on_record(tmp_path, no_unconstrained=False) == [
        ("unconstrained", 1.0, "reward"),
        ("B=0.1 reward", 0.1, "reward"),
        ("B=0.3 reward", 0.3, "reward"),
        ("B=0.3 advantage", 0.3, "advantage"),
    ]
    assert on_record(tmp_path, no_unconstrained=True)[0] == ("B=0.1 reward", 0.1, "reward")


def test_logged_rows_read_a_resumed_runs_log_once_per_step(tmp_path):
    """A run resumed from its step-5 checkpoint: the trainer truncated its log to step 5 and
    appended steps 6-7; the rows cover every step once and the seconds add the step times."""
    from router_budget import logged_rows

    log = tmp_path / "metrics.jsonl"
    recs = [
        {"step": s, "timing/step_s": 10.0 * s, "router/lambda": 0.1 * s, "actor/entropy": 0.3}
        for s in range(1, 8)
    ]
    recs[-1]["val/router/cost/mean"] = None  # a NaN the tracker wrote as null
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows, seconds = logged_rows(log)
    assert [r["step"] for r in rows] == list(range(1, 8))
    assert seconds == pytest.approx(280.0)
    assert rows[2] == {"step": 3, "router/lambda": pytest.approx(0.3)}
    assert "val/router/cost/mean" not in rows[-1]


def test_paired_gap_cancels_the_task_mix_swing_shared_by_both_runs():
    """Both runs see the same tasks at each step: a swing they share drops out of the gap, so a
    constant 0.1 below the unconstrained run shows as -0.1 with no spread."""
    from router_budget_report import paired_gap

    swing = [0.3, 0.8, 0.4, 0.9, 0.35, 0.85, 0.5, 0.7]
    free = _rows(swing, [0.0] * 8)
    run = _rows([c - 0.1 for c in swing], [0.2] * 8)
    gap = paired_gap(run, free)
    assert gap["steps"] == 2 and gap["mean"] == pytest.approx(-0.1)
    assert gap["se"] == pytest.approx(0, abs=1e-12)
    assert summarize(run, 0.5, "reward", 8.0)["cost_last_quarter_se"] > 0.09  # unpaired: the swing
    assert paired_gap(run, free[:6]) is None  # no unconstrained step to pair with
