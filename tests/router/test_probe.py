"""The linear probe of task type on router features: separable types are found, noise is not."""

from __future__ import annotations

import pytest
import torch

from toolgrpo.router.probe import probe_accuracy


def test_separable_types_score_near_one_and_noise_near_chance():
    g = torch.Generator().manual_seed(0)
    centers = 3 * torch.randn(3, 32, generator=g)
    labels = [i % 3 for i in range(150)]
    feats = centers[labels] + torch.randn(150, 32, generator=g)
    assert probe_accuracy(feats, labels) >= 0.95
    noise = torch.randn(150, 32, generator=g)
    assert probe_accuracy(noise, labels) < 0.5  # chance is 1/3


def test_wide_features_and_few_rows_like_a_held_out_set():
    """SmolLM2's width (576) and 100 rows: types that differ by a spread-out shift are found;
    the same rows with shuffled types are not."""
    g = torch.Generator().manual_seed(1)
    centers = 0.3 * torch.randn(2, 576, generator=g)
    labels = ["tool" if i % 2 else "direct" for i in range(100)]
    feats = centers[[i % 2 for i in range(100)]] + torch.randn(100, 576, generator=g)
    assert probe_accuracy(feats, labels) >= 0.9
    shuffled = [labels[i] for i in torch.randperm(100, generator=g).tolist()]
    assert probe_accuracy(feats, shuffled) < 0.7


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="labels"):
        probe_accuracy(torch.zeros(4, 2), [0, 1, 0])
    with pytest.raises(ValueError, match="2 classes"):
        probe_accuracy(torch.zeros(10, 2), [0] * 10)
