"""The IS correction of fixed-policy rows, on hand-made tensors: who gets which old log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from toolgrpo.mixture import correct_fixed_rows
from toolgrpo.mixture.correction import sequence_ess

MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0], [-0.5, 0.0], [-1.0, -1.0]])  # sampling log-probs
CURRENT = torch.tensor([[-1.5, -2.5], [-0.5, 0.0], [-1.0 + math.log(2.0), -1.0 + math.log(3.0)]])
FIXED = torch.tensor([False, False, True])


def test_bypass_mode_keeps_fixed_rows_old_logprobs_at_their_sampler():
    old_actor = CURRENT.clone()  # what the trainer had set (recomputed by the actor)
    c = correct_fixed_rows(old_actor, ROLLOUT, CURRENT, MASK, FIXED, bypass_mode=True)
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
    c = correct_fixed_rows(rollout, rollout, CURRENT, MASK, FIXED, level="token")  # on-policy reuse
    assert torch.equal(rollout, ROLLOUT)
    assert torch.equal(c.old_logprobs_BR[2], CURRENT[2])


def test_token_weights_fixed_rows_only_and_truncates():
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED, level="token", threshold=2.5)
    w = c.is_weights_BR
    assert torch.equal(w[:2], torch.ones(2, 2))
    torch.testing.assert_close(w[2], torch.tensor([2.0, 2.5]))
    assert torch.equal(c.old_logprobs_BR[2], CURRENT[2])  # PPO clips around the actor itself
    assert c.metrics["actor/importance_weight_truncated_frac"] == 0.5


def test_sequence_weights_one_per_sequence():
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED, level="sequence", threshold=10.0)
    torch.testing.assert_close(c.is_weights_BR[2], torch.tensor([6.0, 6.0]))  # 2 * 3
    assert c.metrics["actor/importance_weight_mean"] == pytest.approx(6.0)  # one sequence
    assert c.metrics["actor/importance_weight_ess"] == pytest.approx(1.0)


def test_no_fixed_rows_is_a_no_op():
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, torch.zeros(3, dtype=torch.bool))
    assert torch.equal(c.old_logprobs_BR, ROLLOUT) and c.is_weights_BR is None
    assert c.metrics == {"actor/importance_sampling": 0.0}


def test_default_is_decoupled_sequence_truncated_at_two():
    """The default estimator (issue #17): the actor's own old log-probs, sequence weight
    min(π_old/π_fixed, 2); the fixed row's sequence ratio here is 6, so it is truncated."""
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED)
    assert torch.equal(c.old_logprobs_BR[2], CURRENT[2])
    torch.testing.assert_close(c.is_weights_BR[2], torch.tensor([2.0, 2.0]))
    assert c.metrics["actor/importance_weight_truncated_frac"] == 1.0


def test_untruncated_weights_with_threshold_none():
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED, threshold=None)
    torch.testing.assert_close(c.is_weights_BR[2], torch.tensor([6.0, 6.0]))
    assert "actor/importance_weight_truncated_frac" not in c.metrics


def test_sequence_ess_is_scale_free_and_survives_huge_log_weights():
    mask = torch.ones(3, 1)
    assert sequence_ess(torch.tensor([[500.0], [500.0], [500.0]]), mask) == pytest.approx(1.0)
    # weights 1, 1, e^800: one row carries all the weight -> ESS = 1/n
    assert sequence_ess(torch.tensor([[0.0], [0.0], [800.0]]), mask) == pytest.approx(1 / 3)


def test_unknown_level_raises():
    with pytest.raises(ValueError, match="rollout_is"):
        correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED, level="vtrace")


def test_fixed_groups_with_signal_counts_groups_whose_scores_differ():
    from types import SimpleNamespace

    from toolgrpo.mixture.mixture import fixed_groups_with_signal

    batch = SimpleNamespace(
        uids=["a", "a", "b", "b", "c", "c", "d", "d"],
        policies=["fixed"] * 6 + ["actor"] * 2,
        scores_B=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, -1.0, 1.0, 0.0]),
        is_negative=[False] * 5 + [True, False, False],  # c's difference is a negative's
    )
    assert fixed_groups_with_signal(batch) == pytest.approx(1 / 3)  # a only, of a, b, c
