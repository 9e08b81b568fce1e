"""benchmarks/long_run.py: every checkpoint paired with the warm start and with the main job's
length, RLLA where scored, the training curve from the run's metrics, and a checkout holding only
the kept copies reporting the same without running anything."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import long_run as lr  # noqa: E402

from tests.benchmarks.test_main_job_seeds import _env, _rlla  # noqa: E402


def test_the_schedule_comes_from_the_config():
    total, every = lr.schedule()
    assert lr.checkpoint_steps(total, every)[-1] == total and total > lr.MAIN_JOB_STEPS
    assert lr.checkpoint_steps(20, 8) == [8, 16, 20]  # the last step is saved too
    assert lr.rlla_steps(64, 16) == [16, 32, 48, 64]
    assert lr.rlla_steps(64, 0) == [64]


def _finished_run(run: Path, steps: list[int]) -> None:
    for s in steps:
        ck = run / "checkpoints" / f"global_step_{s}"
        ck.mkdir(parents=True)
        (ck / "trainer_state.json").write_text("{}")
    rows = [{"step": 0, "val/all/accuracy": 0.4, "timing/step_s": 9.0}]
    rows += [{"step": i, "reward/mean": 0.1 * i, "big": [0] * 9} for i in (1, 2, 3)]
    rows += [{"step": 3, "val/all/accuracy": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_checkpoints_are_scored_once_paired_and_a_kept_checkout_reports_the_same(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(lr, "plot", lambda result, path: None)
    monkeypatch.setattr(lr, "schedule", lambda config=lr.CONFIG: (32, 16))
    work, out = tmp_path / "work", tmp_path / "results" / "long_run"
    work.mkdir()
    run = tmp_path / "by_hand"
    _finished_run(run, [16, 32])
    solved = {"step_16": {0, 1, 2, 3, 4, 5}, "step_32": {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}}
    totals = {"warmstart": [0.0, 1.0, -1.0, 2.0], "step_16": [0.0, 1.0, -1.0, 1.0],
              "step_32": [1.0, 1.0, -1.0, 1.0]}  # fmt: skip
    calls = []

    def fake_eval(*args: str, log: Path) -> None:  # toolgrpo eval, writing what it would
        assert args[0] == "eval", args
        calls.append(args)
        dest = Path(args[args.index("--output") + 1])
        tag = dest.stem.split("_", 2)[2]
        if dest.name.startswith("eval_env"):
            _env(dest, solved.get(tag, {0, 1, 2, 3}), talk=True)
        else:
            _rlla(dest, totals[tag], talk=True)

    monkeypatch.setattr(lr, "toolgrpo", fake_eval)
    lr.main(["--work", str(work), "--run", str(run), "--rlla-every", "16", "--out", str(out)])
    got = json.loads(out.with_suffix(".json").read_text())
    assert len(calls) == 6  # warm start, steps 16 and 32: held out and RLLA each
    s16, s32 = got["checkpoints"]
    assert (s16["step"], s16["gain"], s16["up"], s16["down"]) == (16, 10.0, 2, 0)
    assert (s32["step"], s32["gain"], s32["up"]) == (32, 30.0, 6)
    assert "vs_main_job" not in s16
    assert s32["vs_main_job"]["gain"] == 20.0  # 4 more of 20 tasks than at step 16
    assert s16["rlla_diff"] == -0.25 and s32["rlla_diff"] == 0.0
    assert got["warm_start"] == {"accuracy": 20.0, "rlla": 0.5}
    assert got["seed"] == 0
    assert [r["step"] for r in got["training"]] == [0, 1, 2, 3, 3]
    assert all("big" not in r for r in got["training"])
    assert got["training"][4] == {"step": 3, "val/all/accuracy": 0.5}

    monkeypatch.setattr(lr, "toolgrpo", lambda *a, log: pytest.fail(f"ran {a}"))
    lr.main(["--work", str(work), "--run", str(run), "--out", str(out)])  # all there: no run
    again = json.loads(out.with_suffix(".json").read_text())
    assert again == got
    lr.main(["--work", str(tmp_path / "fresh"), "--out", str(out), "--report"])
    assert json.loads(out.with_suffix(".json").read_text()) == got  # from the kept copies
    kept = tmp_path / "results" / "long_run_kept"
    assert not any("messages" in p.read_text() for p in kept.glob("*.json"))
    with pytest.raises(SystemExit, match="another setting"):  # another seed's evals are not it
        lr.main(["--work", str(work), "--run", str(run), "--seed", "1", "--out", str(out)])
