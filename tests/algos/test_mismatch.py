"""Rollout/trainer mismatch metrics and weights against their formulas, on hand-made tensors."""

from __future__ import annotations

import math

import pytest
import torch

from toolgrpo.algos.mismatch import mismatch_metrics, rollout_is_stats, rollout_is_weights


def _case():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -0.1, 0.0, 0.0]])
    rollout = torch.tensor([[-1.1, -1.0, -0.5, 7.0], [-0.3, -0.4, 5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    return trainer, rollout, mask


def test_metrics_follow_their_formulas_and_ignore_masked_tokens():
    trainer, rollout, mask = _case()
    m = mismatch_metrics(trainer, rollout, mask, 0.2, 0.28)
    d = [0.1, -1.0, 0.0, 0.0, 0.3]  # log ρ = trainer − rollout on the five real tokens
    assert m["rollout/logprob_diff_mean"] == pytest.approx(sum(abs(x) for x in d) / 5)
    assert m["rollout/logprob_diff_max"] == pytest.approx(1.0)
    k3 = sum(math.exp(x) - 1 - x for x in d) / 5
    assert m["rollout/mismatch_kl"] == pytest.approx(k3)
    # ρ: e^0.1 = 1.105 (in), e^-1 = 0.37 (out), 1, 1, e^0.3 = 1.35 (out of [0.8, 1.28])
    assert m["rollout/mismatch_frac_outside_clip"] == pytest.approx(2 / 5)


def test_identical_log_probs_give_zero_mismatch_and_no_tokens_no_metrics():
    trainer, _, mask = _case()
    m = mismatch_metrics(trainer, trainer.clone(), mask)
    assert m["rollout/logprob_diff_max"] == 0.0 and m["rollout/mismatch_kl"] == 0.0
    assert m["rollout/mismatch_frac_outside_clip"] == 0.0
    assert mismatch_metrics(trainer, trainer, torch.zeros_like(mask)) == {}


def test_kl_estimate_is_never_negative():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 32, generator=g), torch.randn(64, 32, generator=g)
    assert mismatch_metrics(a, b, torch.ones(64, 32))["rollout/mismatch_kl"] >= 0.0


def test_token_weights_truncate_at_c_and_are_one_off_the_mask():
    trainer, rollout, mask = _case()
    w = rollout_is_weights(trainer, rollout, mask, "token", 1.2)
    expect = torch.tensor(
        [[math.exp(0.1), math.exp(-1.0), 1.0, 1.0], [1.0, min(math.exp(0.3), 1.2), 1.0, 1.0]]
    )
    torch.testing.assert_close(w, expect)
    assert not w.requires_grad


def test_sequence_weights_are_the_product_of_a_rows_ratios():
    trainer, rollout, mask = _case()
    w = rollout_is_weights(trainer, rollout, mask, "sequence", None)
    row0, row1 = math.exp(0.1 - 1.0), math.exp(0.3)
    torch.testing.assert_close(w[0, :3], torch.full((3,), row0))
    torch.testing.assert_close(w[1, :2], torch.full((2,), row1))
    assert w[0, 3] == 1.0 and w[1, 2] == 1.0  # masked
    with pytest.raises(ValueError, match="rollout_is level"):
        rollout_is_weights(trainer, rollout, mask, "geometric")


def test_weight_stats_count_truncated_tokens():
    w = torch.tensor([[2.0, 0.5, 1.0], [2.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    s = rollout_is_stats(w, mask, 2.0)
    assert s["rollout/is_weight_mean"] == pytest.approx(5.5 / 4)
    assert s["rollout/is_weight_min"] == 0.5
    assert s["rollout/is_weight_truncated_frac"] == pytest.approx(0.5)
    assert "rollout/is_weight_truncated_frac" not in rollout_is_stats(w, mask, None)
