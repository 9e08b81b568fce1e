"""Masked reductions against hand computations."""

import math

import pytest
import torch

from toolgrpo.algos.utils import masked_mean, masked_sum, masked_var, masked_whiten

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 6.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 1]])


def test_masked_sum_and_mean_ignore_nan_at_masked_positions():
    assert masked_sum(X, M).item() == pytest.approx(1 + 2 + 4 + 6)
    assert masked_mean(X, M).item() == pytest.approx(13 / 4)
    assert masked_sum(X, M, dim=-1).tolist() == pytest.approx([3.0, 10.0])
    assert masked_mean(X, M, dim=-1).tolist() == pytest.approx([1.5, 5.0])
    assert masked_mean(X, M.bool(), dim=0).tolist() == pytest.approx([2.5, 2.0, 6.0])


def test_masked_mean_empty_mask_is_zero_with_grad():
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    out = masked_mean(x, torch.zeros(1, 2))
    assert out.item() == 0.0
    out.backward()
    assert x.grad.tolist() == [[0.0, 0.0]]
    assert masked_mean(x, torch.tensor([[0, 1]]), dim=-1).tolist() == [2.0]


def test_masked_var_unbiased_and_biased():
    vals = [1.0, 2.0, 4.0, 6.0]
    mean = sum(vals) / 4  # 3.25
    ss = sum((v - mean) ** 2 for v in vals)  # 14.75
    x = torch.tensor([[1.0, 2.0, 99.0], [4.0, 99.0, 6.0]])
    assert masked_var(x, M).item() == pytest.approx(ss / 3)
    assert masked_var(x, M, unbiased=False).item() == pytest.approx(ss / 4)


def test_masked_var_rejects_empty_and_single():
    with pytest.raises(ValueError):
        masked_var(torch.ones(2), torch.zeros(2))
    with pytest.raises(ValueError):
        masked_var(torch.ones(2), torch.tensor([1, 0]))


def test_masked_whiten():
    x = torch.tensor([[1.0, 2.0, 99.0], [4.0, 99.0, 6.0]])
    mean, std = 3.25, math.sqrt(14.75 / 3)
    out = masked_whiten(x, M)
    for (i, j), v in {(0, 0): 1.0, (0, 1): 2.0, (1, 0): 4.0, (1, 2): 6.0}.items():
        assert out[i, j].item() == pytest.approx((v - mean) / std, rel=1e-5)
    kept = masked_whiten(x, M, shift_mean=False)
    assert kept[1, 2].item() == pytest.approx((6.0 - mean) / std + mean, rel=1e-5)
