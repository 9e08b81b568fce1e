"""An NLL term on chosen rows inside the RL loss (SRFT/ReLIFT-style guidance): pure functions.

A weak actor's own samples carry no advantage, and importance or shaped weights on another
policy's successes are small where the actor is far from them. Supervised guidance trains the
chosen rows (a fixed policy's successful episodes) on their negative log-likelihood, beside the
policy-gradient loss of the same step:

    L = L_pg + λ · agg(−log π_θ(token) over the chosen rows' tokens)

aggregated like the policy loss, with the whole batch's denominator (rows not chosen add 0 but
still count), so the two terms are one loss over the batch. ∂L/∂log π = −λ/N on a chosen token
(token-mean over N tokens): the push a PPO token gets at ratio 1 with advantage λ.
"""

from __future__ import annotations

import torch

from toolgrpo.algos.losses import agg_loss

__all__ = ["guided_nll_loss"]


def guided_nll_loss(
    logprobs_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    rows_B: torch.Tensor,
    coef: float = 1.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """λ·agg(−log π) over the tokens of rows with ``rows_B`` != 0 (a 0/1 or bool per row);
    exactly 0, with gradient, when no row is chosen or λ = 0."""
    if rows_B.dim() != 1 or rows_B.shape[0] != logprobs_BT.shape[0]:
        raise ValueError(f"rows_B must hold one flag per row, got shape {tuple(rows_B.shape)}")
    if coef < 0:
        raise ValueError(f"the guided NLL weight must be >= 0, got {coef}")
    chosen = (rows_B != 0).unsqueeze(-1) & (response_mask_BT != 0)
    nll = torch.where(chosen, -logprobs_BT, torch.zeros_like(logprobs_BT))
    return coef * agg_loss(nll, response_mask_BT, loss_agg_mode, loss_scale_factor)
