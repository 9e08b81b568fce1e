"""The IS correction of fixed-policy rows, on hand-made tensors: who gets which old log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from toolgrpo.mixture import correct_fixed_rows

MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0], [-0.5, 0.0], [-1.0, -1.0]])  # sampling log-probs
CURRENT = torch.tensor([[-1.5, -2.5], [-0.5, 0.0], [-1.0 + math.log(2.0), -1.0 + math.log(3.0)]])
FIXED = torch.tensor([False, False, True])


def test_ppo_clip_keeps_fixed_rows_old_logprobs_at_their_sampler():
    old_actor = CURRENT.clone()  # what the trainer had set (recomputed by the actor)
    c = correct_fixed_rows(old_actor, ROLLOUT, CURRENT, MASK, FIXED, "ppo_clip")
    assert torch.equal(c.old_logprobs_BR[:2], CURRENT[:2])  # actor rows untouched
    assert torch.equal(c.old_logprobs_BR[2], ROLLOUT[2])  # fixed row: π_fixed is the denominator
    assert c.is_weights_BR is None
    assert c.metrics["actor/importance_sampling"] == 1.0
    assert c.metrics["actor/importance_weight_mean"] == pytest.approx(2.5)  # tokens: 2, 3
    assert c.metrics["actor/importance_weight_min"] == pytest.approx(2.0)
    assert c.metrics["actor/importance_weight_max"] == pytest.approx(3.0)
    assert c.metrics["actor/importance_weight_ess"] == pytest.approx(25 / 26)


def test_correction_never_writes_through_an_aliased_rollout_tensor():
    rollout = ROLLOUT.clone()
    c = correct_fixed_rows(rollout, rollout, CURRENT, MASK, FIXED, "tis_token")  # on-policy reuse
    assert torch.equal(rollout, ROLLOUT)
    assert torch.equal(c.old_logprobs_BR[2], CURRENT[2])


def test_tis_token_weights_fixed_rows_only_and_truncates():
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED, "tis_token", threshold=2.5)
    w = c.is_weights_BR
    assert torch.equal(w[:2], torch.ones(2, 2))
    torch.testing.assert_close(w[2], torch.tensor([2.0, 2.5]))
    assert torch.equal(c.old_logprobs_BR[2], CURRENT[2])  # PPO clips around the actor itself
    assert c.metrics["actor/importance_weight_truncated_frac"] == 0.5


def test_tis_seq_weights_one_per_sequence():
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED, "tis_seq", threshold=10.0)
    torch.testing.assert_close(c.is_weights_BR[2], torch.tensor([6.0, 6.0]))  # 2 * 3
    assert c.metrics["actor/importance_weight_mean"] == pytest.approx(6.0)  # one sequence
    assert c.metrics["actor/importance_weight_ess"] == pytest.approx(1.0)


def test_no_fixed_rows_is_a_no_op():
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, torch.zeros(3, dtype=torch.bool))
    assert torch.equal(c.old_logprobs_BR, ROLLOUT) and c.is_weights_BR is None
    assert c.metrics == {"actor/importance_sampling": 0.0}


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="IS correction"):
        correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED, "vtrace")
