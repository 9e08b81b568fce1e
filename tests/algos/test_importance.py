"""Importance weights against their formulas on hand-made tensors."""

from __future__ import annotations

import math

import pytest
import torch

from toolgrpo.algos.importance import importance_log_ratio, is_weight_stats, truncated_is_weights

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
LOG_RATIO = torch.tensor([[math.log(2.0), math.log(0.5), 0.0], [math.log(4.0), 0.0, 0.0]])


def test_log_ratio_is_masked_clamped_and_detached():
    target = torch.tensor([[0.0, -1.0, 9.0], [-50.0, 0.0, 0.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    lr = importance_log_ratio(target, behaviour, MASK)
    assert torch.equal(lr, torch.tensor([[1.0, 0.0, 0.0], [-20.0, 0.0, 0.0]]))
    assert not lr.requires_grad


def test_token_weights_truncate_at_the_threshold():
    w = truncated_is_weights(LOG_RATIO, MASK, "token", threshold=3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0], [3.0, 1.0, 1.0]]))
    untruncated = truncated_is_weights(LOG_RATIO, MASK, "token", threshold=None)
    assert untruncated[1, 0] == pytest.approx(4.0)


def test_sequence_weights_are_the_product_over_masked_tokens():
    w = truncated_is_weights(LOG_RATIO, MASK, "sequence", threshold=3.0)
    # row 0: 2 * 0.5 = 1 on both real tokens; row 1: min(4, 3) = 3
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0], [3.0, 1.0, 1.0]]))


def test_bad_level_and_threshold_raise():
    with pytest.raises(ValueError, match="level"):
        truncated_is_weights(LOG_RATIO, MASK, "turn")
    with pytest.raises(ValueError, match="threshold"):
        truncated_is_weights(LOG_RATIO, MASK, "token", threshold=0.0)


def test_weight_stats_and_effective_sample_size():
    m = is_weight_stats(torch.tensor([1.0, 1.0, 1.0, 1.0]))
    assert m["actor/importance_weight_ess"] == pytest.approx(1.0)
    m = is_weight_stats(torch.tensor([4.0, 0.0, 0.0, 0.0]))
    assert m["actor/importance_weight_ess"] == pytest.approx(0.25)  # one sample carries it all
    assert m["actor/importance_weight_mean"] == 1.0 and m["actor/importance_weight_max"] == 4.0
    assert m["actor/importance_weight_min"] == 0.0
    assert m["actor/importance_weight_std"] == pytest.approx(math.sqrt(3.0))
    assert is_weight_stats(torch.tensor([])) == {}
