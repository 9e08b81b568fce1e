"""Runs that cannot learn say so (issue 15, item 9): a constant reward (every group all-equal,
so every advantage 0) or every reward non-finite for ``trainer.warn_no_signal_steps`` steps in a
row logs a warning naming the metric that shows it. Before, such a run trained silently."""

from __future__ import annotations

import itertools
import logging

from toolgrpo.rewards.scoring import Score
from toolgrpo.trainer import rollout_stage
from toolgrpo.trainer.metrics import NoSignalWatch, group_stats, no_signal
from toolgrpo.trainer.trainer import Trainer

FLAT = {"batch/size": 4.0, "reward/nonfinite": 0.0, "reward/groups_all_equal_frac": 1.0}
MIXED = {"batch/size": 4.0, "reward/nonfinite": 0.0, "reward/groups_all_equal_frac": 0.5}
ALL_NAN = {"batch/size": 4.0, "reward/nonfinite": 4.0, "reward/groups_all_equal_frac": 1.0}


def test_no_signal_names_the_metric():
    assert "reward/groups_all_equal_frac" in no_signal(FLAT)
    assert "reward/nonfinite" in no_signal(ALL_NAN)
    assert no_signal(MIXED) is None
    # GAE's advantages come from values, not group comparisons
    assert no_signal(FLAT, group_estimator=False) is None
    assert no_signal(ALL_NAN, group_estimator=False) is not None


def test_group_stats_share_of_all_equal_groups():
    assert group_stats(["a", "a", "b", "b"], [1, 1, 0, 2]) == {"reward/groups_all_equal_frac": 0.5}


def test_watch_warns_after_consecutive_steps_only():
    w = NoSignalWatch(3)
    seen = [w.observe(m) for m in (FLAT, FLAT, MIXED, FLAT, FLAT, FLAT, FLAT, FLAT, FLAT)]
    assert [s is not None for s in seen] == [False] * 5 + [True, False, False, True]
    assert "3 steps in a row" in seen[5] and "6 steps in a row" in seen[8]
    off = NoSignalWatch(0)
    assert all(off.observe(FLAT) is None for _ in range(5))


def _run(make_train_config, tmp_path, caplog, steps=3, **extra) -> list[str]:
    cfg = make_train_config(steps=steps, out=tmp_path / "run", **{"trainer.save_freq": -1, **extra})
    with caplog.at_level(logging.WARNING, logger="toolgrpo.trainer.trainer"):
        Trainer(cfg).fit()
    return [r.getMessage() for r in caplog.records if "no learning signal" in r.getMessage()]


def test_constant_reward_run_warns(make_train_config, tmp_path, monkeypatch, caplog):
    flat = Score(1.0, 1.0, 0.0, 0.0, True, True)
    monkeypatch.setattr(rollout_stage, "score", lambda task, text, step, flags: flat)
    (warning,) = _run(make_train_config, tmp_path, caplog)  # the default: 3 steps
    assert "step 3" in warning and "reward/groups_all_equal_frac=1" in warning


def test_all_nan_rewards_warn_naming_nonfinite(make_train_config, tmp_path, monkeypatch, caplog):
    nan = Score(float("nan"), float("nan"), 0.0, 0.0, False, None)
    monkeypatch.setattr(rollout_stage, "score", lambda task, text, step, flags: nan)
    extra = {"reward.nan_policy": "zero", "trainer.warn_no_signal_steps": 2}
    (warning,) = _run(make_train_config, tmp_path, caplog, steps=2, **extra)
    assert "reward/nonfinite=4 of batch/size=4" in warning


def test_varied_reward_run_does_not_warn(make_train_config, tmp_path, monkeypatch, caplog):
    calls = itertools.count()

    def varied(task, text, step, flags):  # every sample a different score
        v = float(next(calls))
        return Score(v, 0.0, v, 0.0, False, False)

    monkeypatch.setattr(rollout_stage, "score", varied)
    assert _run(make_train_config, tmp_path, caplog) == []
