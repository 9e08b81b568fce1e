"""Masked reductions over (batch, token) tensors, shared by advantages and losses.

Masked positions are replaced by 0 with ``torch.where`` before reducing, so garbage at padding
(NaN/inf logprobs of pad tokens) never leaks into a reduction or its gradient.
"""

from __future__ import annotations

import torch

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten"]


def _select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return ``x * mask`` with exact zeros where ``mask == 0`` (even if ``x`` is NaN there)."""
    if mask.shape != x.shape:
        mask = mask.expand_as(x)
    mask = mask.to(x.dtype) if mask.dtype == torch.bool else mask
    return torch.where(mask != 0, x * mask, torch.zeros_like(x))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over positions where ``mask`` is non-zero (weighted by ``mask``)."""
    selected = _select(x, mask)
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over masked positions; an empty mask gives exactly 0 (not NaN), with grad."""
    total = masked_sum(x, mask, dim)
    mask_f = mask.expand_as(x).to(x.dtype)
    count = mask_f.sum() if dim is None else mask_f.sum(dim=dim)
    safe = torch.where(count > 0, count, torch.ones_like(count))
    return torch.where(count > 0, total / safe, torch.zeros_like(total))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all masked positions (Bessel-corrected if ``unbiased``).

    Raises ValueError for an empty mask, or a single element when ``unbiased`` (division by zero).
    """
    count = mask.expand_as(x).to(x.dtype).sum()
    if count.item() <= 0:
        raise ValueError("masked_var: the mask selects no element")
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        if count.item() <= 1:
            raise ValueError("masked_var: unbiased variance needs at least 2 masked elements")
        var = var * count / (count - 1)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Scale ``x`` to unit (unbiased) masked variance; also zero mean if ``shift_mean``.

    Values at masked-out positions are transformed too (callers mask them); stats use masked ones.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened
