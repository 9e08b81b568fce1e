"""The trainer with multi-turn episodes and with asynchronous rollouts, on the tiny model."""

from __future__ import annotations

import math

import torch

from tests.conftest import read_metrics
from toolgrpo.trainer.trainer import Trainer

MT = {"actor_rollout_ref.rollout.multi_turn.enable": "true"}


def test_multi_turn_rlla_run_logs_episode_metrics(make_train_config, tmp_path):
    out = tmp_path / "mt"
    trainer = Trainer(make_train_config(steps=2, out=out, **MT))
    seen = []
    orig = trainer.actor.update

    def update(batch):
        seen.append(batch.response_mask_BR.clone())
        return orig(batch)

    trainer.actor.update = update
    trainer.fit()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        for key in (
            "episode/reward/mean",
            "episode/rlla/turns/mean",
            "episode/stop/answer",
            "episode/reward/format/mean",
            "rollout/prefix_mismatch",
            "reward/mean",
        ):
            assert key in r and math.isfinite(r[key]), key
        assert r["episode/rlla/turns/mean"] == 1.0  # RLLA is single-turn
        assert r["batch/size"] == 4
    assert all(m.sum() > 0 for m in seen)


def test_async_with_zero_staleness_is_the_synchronous_loop(make_train_config, tmp_path):
    runs = {}
    for name, extra in {
        "sync": {},
        "async": {"async_training.enable": "true", "async_training.staleness_threshold": "0"},
    }.items():
        out = tmp_path / name
        trainer = Trainer(make_train_config(steps=3, out=out, **extra))
        trainer.fit()
        runs[name] = (read_metrics(out), trainer.policy.model.state_dict())
    (m_sync, w_sync), (m_async, w_async) = runs["sync"], runs["async"]
    for a, b in zip(m_sync, m_async, strict=True):
        assert a["reward/mean"] == b["reward/mean"]
        assert a["tokens/generated"] == b["tokens/generated"]
        assert b["async/staleness"] == 0.0
    for k, v in w_sync.items():
        torch.testing.assert_close(w_async[k], v, rtol=0, atol=0, msg=k)


def test_async_with_staleness_runs_ahead_and_stays_within_the_bound(make_train_config, tmp_path):
    out = tmp_path / "stale"
    extra = {"async_training.enable": "true", "async_training.staleness_threshold": "1"}
    Trainer(make_train_config(steps=4, out=out, **extra)).fit()
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    stale = [r["async/staleness"] for r in recs]
    assert all(0 <= s <= 1 for s in stale) and max(stale) == 1.0  # it did run ahead
    assert all(r["actor/old_logprob_reused"] == 1.0 for r in recs)  # behaviour log-probs
