"""benchmarks/negatives.py: the arms' commands, and the summary (accuracy, tool errors per call,
their SEs and paired differences against no rollback) on hand-made eval files shaped like
``toolgrpo eval``'s JSON."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from statistics import fmean, stdev

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import negatives as bench  # noqa: E402

TYPES = ("calculator", "search")
N = 20


def _eval(work: Path, arm: str, seed: int, solved: set[int], errors: dict[int, int]) -> None:
    """Task i: solved or not, ``errors[i]`` failed calls out of 2 calls (1 call for odd i)."""
    samples = [
        {
            "task_id": f"t{i}",
            "task_type": TYPES[i % 2],
            "reward": 1.0 if i in solved else 0.0,
            "tool_calls": 1 if i % 2 else 2,
            "tool_errors": {"exception": errors[i]} if errors.get(i) else {},
        }
        for i in range(N)
    ]
    path = bench.eval_path(work, arm, seed)
    path.write_text(json.dumps({"num_episodes": N, "samples": samples}))


def test_arms_and_their_commands(tmp_path):
    assert list(bench.ARMS) == ["no_rollback", "rollback_negatives", "negatives_r0", "fission"]
    run = bench.run_dir(tmp_path, "fission", 1)
    args = bench.train_args("fission", 1, run, 16, ["actor_rollout_ref.actor.optim.lr=5e-5"])
    assert args[:2] == ["train", str(bench.CONFIG)]
    mt = "actor_rollout_ref.rollout.multi_turn."
    assert f"{mt}rollback_mode=fission" in args and f"{mt}enable_tool_rollback=true" in args
    assert f"{mt}fission_group_size=4" in args and f"{mt}max_fission_forks_per_step=8" in args
    assert "data.train_files=[calculator:train,search:train]" in args
    assert "trainer.seed=1" in args and f"trainer.output_dir={run}" in args
    assert args[-1] == "actor_rollout_ref.actor.optim.lr=5e-5"  # the user's overrides win
    assert bench.ARMS["negatives_r0"] == [
        f"{mt}enable_tool_rollback=true",
        f"{mt}negative_reward=0",
    ]
    assert bench.ARMS["rollback_negatives"] == [f"{mt}enable_tool_rollback=true"]  # defaults
    ev = bench.eval_args(run / "checkpoints" / "global_step_16", tmp_path / "e.json")
    assert ev[-1] == "data.val_files=[calculator:test,search:test]" and "--checkpoint" in ev
    assert bench.final_checkpoint(run, 16) is None


def test_summary_pairs_by_task_within_seeds_and_pools_them(tmp_path):
    base_errors = {0: 2, 1: 1, 2: 1, 3: 1}
    _eval(tmp_path, "no_rollback", 0, {0, 1, 2, 3}, base_errors)
    _eval(tmp_path, "no_rollback", 1, {0, 1, 2, 3, 4}, base_errors)
    _eval(tmp_path, "fission", 0, {0, 1, 2, 3, 5, 6}, {0: 1})  # +2 tasks, fewer errors
    _eval(tmp_path, "fission", 1, {1, 2, 3, 4}, {})  # one lost
    out = bench.summarize(tmp_path, list(bench.ARMS), [0, 1, 2])  # seed 2: not evaluated yet
    assert set(out["arms"]) == {"no_rollback", "fission"} and out["baseline"] == "no_rollback"
    base, fis = out["arms"]["no_rollback"], out["arms"]["fission"]
    assert base["seeds"] == [0, 1] and "vs_no_rollback" not in base
    assert base["accuracy"] == pytest.approx(4.5 / N)
    # 30 calls per eval (10 tasks x 2 + 10 x 1): errors per call, pooled over the two seeds
    assert base["tool_error_rate"] == pytest.approx(5 / 30)
    assert fis["tool_error_rate"] == pytest.approx(0.5 / 30)
    assert base["by_type"]["calculator"]["tool_error_rate"] == pytest.approx(3 / 20)
    assert base["by_type"]["search"]["tool_error_rate"] == pytest.approx(2 / 10)
    # accuracy SE: over tasks of the per-task means, plus between the two seeds' means
    per_task = [(float(i in {0, 1, 2, 3}) + float(i in {0, 1, 2, 3, 4})) / 2 for i in range(N)]
    se = math.hypot(stdev(per_task) / math.sqrt(N), stdev([4 / N, 5 / N]) / math.sqrt(2))
    assert base["accuracy_se"] == pytest.approx(se)
    vs = fis["vs_no_rollback"]["accuracy"]
    assert vs["diff"] == pytest.approx((2 - 1) / 2 / N)  # +2 on seed 0, -1 on seed 1
    s0, s1 = vs["per_seed"]
    assert (s0["seed"], s0["diff"], s0["up"], s0["down"]) == (0, 2 / N, 2, 0)
    assert (s1["seed"], s1["diff"], s1["up"], s1["down"]) == (1, -1 / N, 0, 1)
    assert vs["se_between_seeds"] == pytest.approx(stdev([2 / N, -1 / N]) / math.sqrt(2))
    assert fis["vs_no_rollback"]["tool_error_rate"]["diff"] == pytest.approx((0.5 - 5) / 30)
    assert fis["vs_no_rollback"]["tool_error_rate"]["se"] > 0
    # up/down count tasks with more/fewer failed calls, not the linearised values (all of
    # which move with the ratio): 4 tasks lost errors on each seed, the other 16 had none
    moved = [(r["up"], r["down"]) for r in fis["vs_no_rollback"]["tool_error_rate"]["per_seed"]]
    assert moved == [(0, 4), (0, 4)]
    assert fis["vs_no_rollback"]["episodes_with_tool_error"]["diff"] == pytest.approx(
        fmean([1 / N - 4 / N, 0 - 4 / N])
    )
    assert "fission" in bench.table(out) and "no_rollback" in bench.table(out)


def test_the_ratio_se_is_the_delta_method_one():
    outcomes = {
        f"t{i}": bench.Outcome("calculator", 1.0, e, c)
        for i, (e, c) in enumerate([(0, 1), (1, 1), (2, 3), (0, 2), (1, 4)])
    }
    vals = bench.measure(outcomes, "tool_error_rate")
    r = 4 / 11
    assert fmean(vals.values()) == pytest.approx(r)
    cbar = 11 / 5
    resid = [(e - r * c) / cbar for e, c in [(0, 1), (1, 1), (2, 3), (0, 2), (1, 4)]]
    assert bench.pooled({0: vals})["se"] == pytest.approx(stdev(resid) / math.sqrt(5))


def test_training_summary_reads_the_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "reward/mean": 9.0},
        {
            "step": 1,
            "reward/mean": 0.5,
            "reward/first_try_mean": 0.4,
            "rollback/repaired_frac": 0.25,
        },
        {
            "step": 2,
            "reward/mean": 0.7,
            "reward/first_try_mean": 0.6,
            "rollback/repaired_frac": 0.5,
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    t = bench.training_summary(path)
    assert t["reward/mean"] == pytest.approx(0.6) and t["steps"] == 2.0
    assert t["reward/first_try_mean"] == pytest.approx(0.5)
    assert t["rollback/repaired_frac"] == pytest.approx(0.375)
    assert "reward/repaired_mean" not in t and bench.training_summary(tmp_path / "none") == {}


def test_first_try_curve_falls_back_to_the_mean_without_rollback(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "reward/mean": 9.0}, {"step": 1, "reward/mean": 0.5},
            {"step": 2, "reward/mean": 0.7, "reward/first_try_mean": 0.6}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.first_try_curve(path) == {1: 0.5, 2: 0.6}
    assert bench.first_try_curve(None) == {} and bench.first_try_curve(tmp_path / "no") == {}


def test_every_arm_is_a_valid_config():
    """Each arm's overrides load and validate (the fission keys exist, negative_reward 0 is
    allowed by the calculator's and search's reward range)."""
    from toolgrpo.config.loader import load_config
    from toolgrpo.config.schema import TrainConfig
    from toolgrpo.config.validate import validate_train_config

    for arm, over in bench.ARMS.items():
        cfg = load_config(TrainConfig, bench.CONFIG, over)
        validate_train_config(cfg)
        mt = cfg.actor_rollout_ref.rollout.multi_turn
        assert mt.enable_tool_rollback == (arm != "no_rollback"), arm
    assert bench.SEEDS == (0, 1, 2)


def test_runs_of_an_arm_made_with_other_overrides_are_refused(tmp_path):
    """A directory from the first version holds the relabelling ``fission``: refused, naming the
    files; the arms whose overrides did not change are reused."""
    old = tmp_path / "old"
    old.mkdir()
    for arm in ("no_rollback", "fission"):
        _eval(old, arm, 0, {0}, {})
    with pytest.raises(SystemExit, match="fission runs made with .*eval_fission_seed_0.json"):
        bench.pin_arms([old], ["no_rollback"])
    bench.eval_path(old, "fission", 0).unlink()
    bench.pin_arms([old], ["no_rollback", "fission"])  # no_rollback's overrides are the same
    recorded = json.loads((old / bench.ARMS_FILE).read_text())
    assert recorded == {"no_rollback": bench.ARMS["no_rollback"], "fission": bench.ARMS["fission"]}
    _eval(old, "fission", 0, {0}, {})
    bench.pin_arms([old], ["fission"])  # recorded now: reused
    recorded["fission"] = ["something else"]
    (old / bench.ARMS_FILE).write_text(json.dumps(recorded))
    with pytest.raises(SystemExit, match="something else"):
        bench.pin_arms([old], [], record=False)


def _no_run(*args: str, log: Path) -> None:
    raise AssertionError(f"ran toolgrpo {' '.join(args)}")


def test_a_checkout_with_only_the_kept_copies_resumes_and_reports_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "toolgrpo", _no_run)  # every (arm, seed) is done: nothing may run
    work, out = tmp_path / "work", tmp_path / "results" / "negatives.json"
    work.mkdir()
    bench.pin_arms([work], list(bench.ARMS))  # as a run does before its first eval
    for s in (0, 1):
        _eval(work, "no_rollback", s, {0, 1, 2, 3 + s}, {0: 2, 1: 1})
        _eval(work, "fission", s, {0, 1, 2, 5, 6 + s}, {0: 1})
    for path in work.glob("eval_*.json"):
        record = json.loads(path.read_text())
        for x in record["samples"]:
            x["messages"] = [{"role": "user", "content": "What is 2+3?"}]
        path.write_text(json.dumps(record))
        arm, s = path.stem.removeprefix("eval_").rsplit("_seed_", 1)
        run = bench.run_dir(work, arm, int(s))
        (run / "checkpoints" / "global_step_2").mkdir(parents=True)
        (run / "checkpoints" / "global_step_2" / "trainer_state.json").write_text("{}")
        rows = [{"step": 0, "reward/mean": 9.0}] + [
            {"step": i, "reward/mean": i / 4 + int(s), "rollback/repaired_frac": 0.5,
             "timing/step_s": 80.0}
            for i in (1, 2)
        ]  # fmt: skip
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lr = "actor_rollout_ref.actor.optim.lr=5e-5"

    def run_bench(w: Path, *extra: str) -> dict:
        bench.main(["--seeds", "0", "1", "--arms", "no_rollback", "fission", "--steps", "2",
                    "--work", str(w), "--out", str(out), *extra])  # fmt: skip
        return json.loads(out.read_text())

    full = run_bench(work, lr)  # the full work directory: keeps the copies
    kept = tmp_path / "results" / "negatives_kept"
    assert sorted(p.name for p in kept.glob("eval_*")) == sorted(
        p.name for p in work.glob("eval_*")
    )
    assert not any("messages" in p.read_text() for p in kept.glob("eval_*"))
    assert "timing/step_s" in (kept / "fission" / "seed_1" / "metrics.jsonl").read_text()
    assert full["arms"]["fission"]["training"]["1"]["reward/mean"] == pytest.approx(1.375)
    assert full["arms"]["fission"]["training"]["1"]["timing/step_s"] == pytest.approx(80.0)
    assert full["arms"]["fission"]["machine"]["0"] == bench.machine()  # the runs were here
    assert (kept / "fission" / "seed_0" / "machine.json").is_file()
    assert out.with_suffix(".png").stat().st_size > 0
    assert full["overrides"] == [lr] and "vs_no_rollback" in full["arms"]["fission"]
    assert run_bench(tmp_path / "fresh", lr) == full  # a fresh checkout: every run reused
    assert run_bench(tmp_path / "fresh2", "--report") == full
    args = (["no_rollback", "fission"], [0, 1], 2)
    assert bench.summarize(tmp_path / "empty", *args, kept=kept) == bench.summarize(work, *args)
    with pytest.raises(SystemExit, match="another setting"):  # kept runs of other overrides
        run_bench(tmp_path / "other", "actor_rollout_ref.actor.optim.lr=1e-4")
