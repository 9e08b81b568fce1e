"""The guided NLL term and the KL loss restricted to rows, against their formulas."""

from __future__ import annotations

import pytest
import torch

from toolgrpo.algos.guided import guided_nll_loss
from toolgrpo.algos.kl import kl_penalty
from toolgrpo.algos.losses import kl_loss

LP = torch.tensor([[-0.5, -1.0, -9.0], [-2.0, -0.1, -0.3], [-0.2, -0.4, -0.6]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
ROWS = torch.tensor([0, 1, 1])


def test_token_mean_nll_of_chosen_rows_over_every_token():
    lp = LP.clone().requires_grad_(True)
    got = guided_nll_loss(lp, MASK, ROWS, 0.5)
    # chosen tokens: row 1 (2.0 + 0.1 + 0.3) and row 2 (0.2); the denominator: all 6 tokens
    assert float(got.detach()) == pytest.approx(0.5 * (2.4 + 0.2) / 6)
    got.backward()
    want = torch.tensor([[0.0, 0.0, 0.0], [1, 1, 1], [1, 0, 0]]) * (-0.5 / 6)
    torch.testing.assert_close(lp.grad, want)  # a chosen token: an advantage-λ PPO push


def test_seq_mean_token_mean_averages_each_chosen_row_then_every_row():
    got = guided_nll_loss(LP, MASK, ROWS.bool(), 2.0, "seq-mean-token-mean")
    assert float(got) == pytest.approx(2.0 * ((2.4 / 3) + 0.2) / 3)


def test_no_chosen_row_or_zero_weight_is_exactly_zero():
    lp = LP.clone().requires_grad_(True)
    assert float(guided_nll_loss(lp, MASK, torch.zeros(3)).detach()) == 0.0
    assert float(guided_nll_loss(lp, MASK, ROWS, 0.0).detach()) == 0.0
    with pytest.raises(ValueError, match="one flag per row"):
        guided_nll_loss(lp, MASK, torch.ones(2))
    with pytest.raises(ValueError, match=">= 0"):
        guided_nll_loss(lp, MASK, ROWS, -1.0)


def test_the_kl_loss_on_chosen_rows_keeps_the_whole_batchs_denominator():
    ref = LP - 0.3
    per_token = kl_penalty(LP, ref, "low_var_kl")
    whole = kl_loss(LP, ref, MASK)
    assert float(whole) == pytest.approx(float((per_token * MASK).sum() / 6))
    keep = torch.tensor([1.0, 0.0, 1.0])  # row 1 (a fixed row) out
    got = kl_loss(LP, ref, MASK, rows_B=keep)
    assert float(got) == pytest.approx(float((per_token * MASK * keep[:, None]).sum() / 6))
    torch.testing.assert_close(kl_loss(LP, ref, MASK, rows_B=torch.ones(3)), whole)
