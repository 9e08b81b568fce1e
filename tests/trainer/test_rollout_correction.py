"""Rollout correction on the tiny model: π_old is the trainer's, not an engine's with other
numerics, and the free in-update π_old equals a separate recompute."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import read_metrics
from toolgrpo.trainer import rollout_correction
from toolgrpo.trainer.actor import Actor
from toolgrpo.trainer.rollout_correction import old_logprob_source
from toolgrpo.trainer.trainer import Trainer


def _other_numerics(trainer: Trainer) -> tuple[list, list]:
    """Make the sampler's recorded log-probs differ from the trainer's by a random shift per token
    in [-1, 1] nats (what a bf16 engine does, exaggerated), and capture each batch the update
    sees. Returns (batches, shifts): log π_rollout = log π_trainer + shift."""
    seen, shifts = [], []
    produce, update = trainer.produce, trainer.actor.update
    g = torch.Generator().manual_seed(0)

    def shifted(*a, **k):
        rolled = produce(*a, **k)
        b = rolled.batch
        shift = (torch.rand(b.rollout_logprobs_BR.shape, generator=g) * 2 - 1) * b.response_mask_BR
        b.rollout_logprobs_BR = b.rollout_logprobs_BR + shift
        shifts.append(shift)
        return rolled

    def capture(batch):
        seen.append(batch)
        return update(batch)

    trainer.produce, trainer.actor.update = shifted, capture
    return seen, shifts


def test_log_probs_of_an_engine_with_other_numerics_are_not_used_as_old(
    make_train_config, tmp_path
):
    trainer = Trainer(make_train_config(steps=1, out=tmp_path / "d"))
    seen, shifts = _other_numerics(trainer)
    (rec,) = trainer.fit()
    shift = shifts[0]
    m = seen[0].response_mask_BR.bool()
    assert seen[0].old_source == "update"  # one on-policy pass: π_old read off the update
    assert rec["actor/old_logprob_reused"] == 0.0
    # π_old is the trainer's: the first (only) pass has ratio 1 exactly, nothing is clipped
    assert rec["actor/clipfrac"] == 0.0 and rec["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    # the mismatch is measured, and each token's weight is min(π_old/π_rollout, 2) = e^-shift
    s = shift[m]
    assert rec["rollout/logprob_diff_mean"] == pytest.approx(float(s.abs().mean()), abs=1e-4)
    assert rec["rollout/logprob_diff_max"] == pytest.approx(float(s.abs().max()), abs=1e-4)
    ratio = torch.exp(-s)
    outside = float(((ratio < 0.8) | (ratio > 1.2)).float().mean())
    assert rec["rollout/mismatch_frac_outside_clip"] == pytest.approx(outside)
    assert rec["rollout/mismatch_kl"] == pytest.approx(float((ratio - 1 + s).mean()), rel=1e-3)
    w = ratio.clamp(max=2.0)
    assert rec["rollout/is_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-4)


def test_bypass_mode_uses_the_engines_log_probs_and_its_clip_shows_it(make_train_config, tmp_path):
    cfg = make_train_config(
        steps=1, out=tmp_path / "b", **{"algorithm.rollout_correction.bypass_mode": "true"}
    )
    trainer = Trainer(cfg)
    seen, shifts = _other_numerics(trainer)
    (rec,) = trainer.fit()
    shift = shifts[0]
    b = seen[0]
    assert b.old_source == "rollout" and rec["actor/old_logprob_reused"] == 1.0
    assert torch.equal(b.old_logprobs_BR, b.rollout_logprobs_BR)
    s = shift[b.response_mask_BR.bool()]
    assert rec["rollout/logprob_diff_mean"] == pytest.approx(float(s.abs().mean()), abs=1e-4)
    assert "rollout/is_weight_mean" not in rec  # no weights in bypass mode
    # PPO's ratio starts at π_trainer/π_rollout = e^-shift, not 1: its KL is the mean shift
    assert abs(float(s.mean())) > 0.01
    assert rec["actor/ppo_kl"] == pytest.approx(float(s.mean()), abs=1e-4)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_a_separate_recompute_weights_the_actors_rows(make_train_config, tmp_path, level):
    cfg = make_train_config(
        steps=1,
        out=tmp_path / level,
        **{
            "data.train_batch_size": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "algorithm.rollout_correction.rollout_is": level,
            "algorithm.rollout_correction.rollout_is_threshold": 1.5,
        },
    )
    trainer = Trainer(cfg)
    seen, shifts = _other_numerics(trainer)
    (rec,) = trainer.fit()
    shift = shifts[0]
    b = seen[0]
    assert b.old_source == "trainer"
    m = b.response_mask_BR.bool()
    log_w = -shift if level == "token" else -shift.sum(-1, keepdim=True).expand_as(shift)
    expect = torch.exp(log_w).clamp(max=1.5)
    assert bool((expect[m] == 1.5).any()) and bool((expect[m] < 1.0).any())  # both sides seen
    torch.testing.assert_close(b.is_weights_BR[m], expect[m], atol=2e-4, rtol=1e-4)
    assert bool((b.is_weights_BR[~m] == 1.0).all())
    assert rec["rollout/is_weight_truncated_frac"] > 0


def test_the_update_pass_pi_old_equals_a_separate_recompute(make_train_config, tmp_path):
    """The free path (π_old read off the update's first pass, weights applied there) and the
    explicit one (a no-grad pass, then weights) give the same update."""
    trainer = Trainer(make_train_config(steps=1, out=tmp_path / "e"))
    seen, _ = _other_numerics(trainer)
    trainer.actor.update = lambda batch: seen.append(batch) or {}  # collect, do not train
    trainer.train_step(1)
    batch = seen[0]
    batch.advantages_BR = torch.randn(batch.response_mask_BR.shape)
    start = copy.deepcopy(trainer.policy.model.state_dict())
    results = []
    for source in ("update", "trainer"):
        trainer.policy.model.load_state_dict(start)
        actor = Actor(trainer.policy, trainer.cfg, 1)
        b = copy.copy(batch)
        b.old_source = source
        if source == "trainer":
            b.old_logprobs_BR, _ = actor.compute_logprobs(b)
            b.is_weights_BR = None
            rollout_correction.weight_actor_rows(trainer.cfg, b)
        else:
            b.old_logprobs_BR, b.is_weights_BR = None, None
        metrics = actor.update(b)
        results.append((metrics, copy.deepcopy(trainer.policy.model.state_dict())))
    (m_u, w_u), (m_t, w_t) = results
    assert m_u["actor/pg_loss"] == pytest.approx(m_t["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert "rollout/logprob_diff_mean" in m_u and "rollout/logprob_diff_mean" not in m_t
    for k, v in w_u.items():
        torch.testing.assert_close(v, w_t[k], rtol=1e-5, atol=1e-7, msg=k)
    assert any(not torch.equal(v, start[k]) for k, v in w_u.items())  # it did train


@pytest.mark.parametrize(
    "extra, behaviour, first, expect",
    [
        ({}, False, False, "update"),
        ({}, True, False, "rollout"),  # asynchronous batches: the behaviour policy's
        ({"algorithm.rollout_correction.bypass_mode": "true"}, False, False, "rollout"),
        ({}, False, True, "trainer"),  # the mixture reads π_old before the update
        ({"actor_rollout_ref.actor.use_kl_loss": "true"}, False, False, "update"),
        ({"actor_rollout_ref.model.lora_dropout": 0.1}, False, False, "trainer"),
        ({"actor_rollout_ref.actor.ppo_epochs": 2}, False, False, "trainer"),
        ({"data.train_batch_size": 4}, False, False, "trainer"),  # two mini-batches
        ({"algorithm.adv_estimator": "gae"}, False, False, "trainer"),
        ({"algorithm.use_kl_in_reward": "true"}, False, False, "trainer"),
    ],
)
def test_where_old_log_probs_come_from(make_train_config, extra, behaviour, first, expect):
    cfg = make_train_config(**extra)
    assert old_logprob_source(cfg, behaviour, first) == expect


def test_every_step_logs_the_mismatch(make_train_config, tmp_path):
    out = tmp_path / "m"
    Trainer(make_train_config(steps=2, out=out)).fit()
    for rec in read_metrics(out):
        for key in (
            "rollout/logprob_diff_mean",
            "rollout/logprob_diff_max",
            "rollout/mismatch_kl",
            "rollout/mismatch_frac_outside_clip",
            "rollout/is_weight_mean",
        ):
            assert key in rec, key
        assert rec["rollout/logprob_diff_max"] < 1e-3  # HF fp32 sampler = the trainer
