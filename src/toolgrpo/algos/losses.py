"""Policy / value / KL losses and their token-to-scalar aggregation.

Shapes: ``_BT`` tensors are (batch, response tokens); masks are 0/1 (bool, int or float).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from toolgrpo.algos.kl import kl_penalty
from toolgrpo.algos.utils import masked_mean, masked_sum

__all__ = [
    "AGG_MODES",
    "agg_loss",
    "ppo_policy_loss",
    "register_policy_loss",
    "get_policy_loss",
    "entropy_from_logits",
    "kl_loss",
    "value_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _seq_mean(per_seq_B: torch.Tensor, has_tokens_B: torch.Tensor) -> torch.Tensor:
    """Mean over sequences that have at least one mask token; 0 (with grad) if there are none."""
    return masked_mean(per_seq_B, has_tokens_B.to(per_seq_B.dtype))


def agg_loss(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar; the mode decides how long responses are weighted.

    ``token-mean``: sum / #tokens. ``seq-mean-token-sum``: mean over sequences of token sums.
    ``seq-mean-token-mean``: mean over sequences of token means (GRPO paper).
    ``seq-mean-token-sum-norm`` (Dr.GRPO) follows verl S2: seq-mean-token-sum / loss_scale_factor,
    the factor defaulting to the max response length T = mask.shape[-1] (verl S1 instead divided
    the batch-wide token sum by T, without dividing by the number of sequences).
    Sequences with no mask token are excluded from seq-means; no mask token at all gives 0.
    """
    if loss_BT.shape != mask_BT.shape:
        raise ValueError(f"loss {tuple(loss_BT.shape)} and mask {tuple(mask_BT.shape)} differ")
    mask_f = (mask_BT != 0).to(loss_BT.dtype) if mask_BT.dtype == torch.bool else mask_BT
    if mode == "token-mean":
        return masked_mean(loss_BT, mask_f)
    has_tokens = (mask_BT != 0).any(dim=-1)
    if mode == "seq-mean-token-sum":
        return _seq_mean(masked_sum(loss_BT, mask_f, dim=-1), has_tokens)
    if mode == "seq-mean-token-mean":
        return _seq_mean(masked_mean(loss_BT, mask_f, dim=-1), has_tokens)
    if mode == "seq-mean-token-sum-norm":
        factor = float(mask_BT.shape[-1]) if loss_scale_factor is None else float(loss_scale_factor)
        if factor <= 0:
            raise ValueError(f"loss_scale_factor must be > 0, got {factor}")
        return _seq_mean(masked_sum(loss_BT, mask_f, dim=-1), has_tokens) / factor
    raise ValueError(f"unknown loss_agg_mode {mode!r}; known: {', '.join(AGG_MODES)}")


PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
_POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator registering a policy loss with ppo_policy_loss's leading positional arguments."""

    def decorator(fn: PolicyLoss) -> PolicyLoss:
        existing = _POLICY_LOSSES.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"policy loss {name!r} is already registered to {existing}")
        _POLICY_LOSSES[name] = fn
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """Look up a policy loss by name; unknown names raise ValueError listing the known ones."""
    try:
        return _POLICY_LOSSES[name]
    except KeyError:
        known = ", ".join(sorted(_POLICY_LOSSES))
        raise ValueError(f"unknown policy loss {name!r}; known: {known}") from None


@register_policy_loss("vanilla")
def ppo_policy_loss(
    old_logprobs_BT: torch.Tensor,
    logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    is_weights_BT: torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clip (DAPO clip-higher) and dual clip for A < 0.

    L = max(-A r, -A clip(r, 1-low, 1+high)); for A < 0 also capped at -A c, so a huge ratio
    on a bad token cannot blow up the loss. Optional detached IS weights multiply L per token.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual clip), got {clip_ratio_c}")
    shapes = {tuple(t.shape) for t in (old_logprobs_BT, logprobs_BT, advantages_BT)}
    if len(shapes) != 1 or tuple(response_mask_BT.shape) not in shapes:
        raise ValueError("old_logprobs, logprobs, advantages and response_mask must share a shape")
    mask = response_mask_BT
    log_ratio = logprobs_BT - old_logprobs_BT.detach()
    ratio = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    adv = advantages_BT.detach()
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_clip = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = torch.minimum(loss_clip, -adv * clip_ratio_c)
    pg_losses = torch.where(adv < 0, loss_dual, loss_clip)
    if is_weights_BT is not None:
        if is_weights_BT.shape != pg_losses.shape:
            raise ValueError("is_weights_BT must have the same shape as the logprobs")
        pg_losses = pg_losses * is_weights_BT.detach()
    loss = agg_loss(pg_losses, mask, loss_agg_mode, loss_scale_factor)
    with torch.no_grad():
        clipped = (loss_clipped > loss_unclipped).to(ratio.dtype)
        lower = ((loss_clip > loss_dual) & (adv < 0)).to(ratio.dtype)
        metrics = {
            "pg_clipfrac": float(masked_mean(clipped, mask)),
            "pg_clipfrac_lower": float(masked_mean(lower, mask)),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
        }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim as logsumexp - sum(p * logits) (stable).

    Logits are shifted by their (detached) max first, which keeps float32 precision for large
    logits; -inf logits (masked vocabulary) contribute 0 instead of 0 * -inf = NaN.
    """
    shift = logits.detach().amax(dim=-1, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    z = logits - shift
    probs = torch.softmax(z, dim=-1)
    finite_z = torch.where(torch.isneginf(z), torch.zeros_like(z), z)
    return torch.logsumexp(z, dim=-1) - (probs * finite_z).sum(dim=-1)


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kind: str = "low_var_kl",
    agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    rows_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL-to-reference loss term (verl use_kl_loss): agg_loss(kl_penalty(logp, ref, kind)).

    ``rows_B`` (0/1 per row, None: all): rows with 0 add no KL but still count in the
    aggregation's denominator, so the KL of the other rows weighs as it would in the whole
    batch (a mixture's fixed-policy rows, ``rollout_only.fixed_kl_loss=false``)."""
    kl = kl_penalty(logprobs, ref_logprobs.detach(), kind)
    if rows_B is not None:
        keep = (rows_B != 0).unsqueeze(-1).expand_as(kl)
        kl = torch.where(keep, kl, torch.zeros_like(kl))
    return agg_loss(kl, mask, agg_mode, loss_scale_factor)


def value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cliprange_value: float,
    agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, float]:
    """Clipped critic loss 0.5 agg(max((v-R)^2, (clip(v, v_old +- c) - R)^2)), and its clipfrac.

    Clipping keeps the critic from moving far from the rollout-time values in one update.
    """
    old = old_values_BT.detach()
    ret = returns_BT.detach()
    v_clipped = torch.clamp(values_BT, old - cliprange_value, old + cliprange_value)
    loss1 = (values_BT - ret).square()
    loss2 = (v_clipped - ret).square()
    loss = 0.5 * agg_loss(torch.maximum(loss1, loss2), mask_BT, agg_mode)
    with torch.no_grad():
        clipfrac = float(masked_mean((loss2 > loss1).to(loss1.dtype), mask_BT))
    return loss, clipfrac
