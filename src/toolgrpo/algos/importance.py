"""Importance weights for samples drawn from another policy (a fixed rollout policy, a stale one).

The ratio w = π_target(y) / π_behaviour(y) turns an expectation under the behaviour policy into
one under the target: E_target[f] = E_behaviour[w·f]. Log-ratios are clamped to ±20 before
``exp`` (as the PPO ratio is) so one wild token cannot overflow a batch.

Truncated IS (TIS) uses min(w, C), detached, as a per-token multiplier of the policy loss:
- ``token``: w_t = π(y_t | y_<t) / π_b(y_t | y_<t). Low variance, but it corrects each token's own
  choice only, not the shift in which prefixes are reached, so it is exact for one-token responses
  and a good approximation when the two policies are close.
- ``sequence``: w = Π_t w_t, broadcast over the response. Unbiased before truncation for whole
  responses; its variance grows with length and with the policies' distance, which C bounds at
  the price of some bias.
"""

from __future__ import annotations

import math

import torch

from toolgrpo.algos.utils import masked_sum

__all__ = [
    "IS_LEVELS",
    "importance_log_ratio",
    "truncated_is_weights",
    "is_weight_stats",
    "raw_is_stats",
]

IS_LEVELS = ("token", "sequence")
_CLAMP = 20.0
_RAW_CLAMP = 50.0  # raw weights are reported up to e^50 (~5e21), finite in any JSON


def importance_log_ratio(
    target_logprobs_BT: torch.Tensor, behaviour_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """log π_target − log π_behaviour per token, clamped; exactly 0 where the mask is 0."""
    diff = (target_logprobs_BT - behaviour_logprobs_BT).clamp(-_CLAMP, _CLAMP)
    return torch.where(mask_BT != 0, diff, torch.zeros_like(diff)).detach()


def truncated_is_weights(
    log_ratio_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    level: str = "token",
    threshold: float | None = 2.0,
) -> torch.Tensor:
    """Detached weights min(w, threshold) at token or sequence level (``None``: no truncation).

    Masked positions get weight 1 (they are masked out of the loss anyway)."""
    if level not in IS_LEVELS:
        raise ValueError(f"unknown IS level {level!r}; known: {', '.join(IS_LEVELS)}")
    if threshold is not None and threshold <= 0:
        raise ValueError(f"IS threshold must be > 0, got {threshold}")
    log_ratio = log_ratio_BT.detach()
    if level == "sequence":
        seq = masked_sum(log_ratio, mask_BT, dim=-1).clamp(-_CLAMP, _CLAMP)
        log_ratio = seq.unsqueeze(-1).expand_as(log_ratio_BT)
    w = torch.exp(log_ratio.clamp(-_CLAMP, _CLAMP))
    if threshold is not None:
        w = w.clamp(max=threshold)
    return torch.where(mask_BT != 0, w, torch.ones_like(w))


def is_weight_stats(weights: torch.Tensor, prefix: str = "actor/importance_weight") -> dict:
    """Mean, std, min, max and normalised effective sample size (Σw)² / (n·Σw²) ∈ (0, 1] of a flat
    set of weights: an ESS near 1 means the behaviour samples are nearly as good as on-policy."""
    w = weights.detach().double().flatten()
    if w.numel() == 0:
        return {}
    ess = float(w.sum() ** 2 / (w.numel() * (w**2).sum())) if float(w.abs().sum()) > 0 else 0.0
    return {
        f"{prefix}_mean": float(w.mean()),
        f"{prefix}_std": float(w.std(unbiased=False)),
        f"{prefix}_min": float(w.min()),
        f"{prefix}_max": float(w.max()),
        f"{prefix}_ess": ess,
    }


def raw_is_stats(
    log_ratio_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    level: str = "sequence",
    threshold: float | None = 2.0,
    prefix: str = "mixture/is",
) -> dict[str, float]:
    """What truncation hides: the *untruncated* weights at ``level`` (one per sequence, or one
    per token), their mean and max, their normalised effective sample size (Σw)²/(n·Σw²), and
    the share above ``threshold`` (the ones min(w, C) changes; 0 when untruncated).

    ``log_ratio_BT`` is ``importance_log_ratio``'s (per token clamped to ±20); a sequence's
    log-weight is their sum, capped at 50 for the mean and max only (the ESS is scale-free)."""
    if level not in IS_LEVELS:
        raise ValueError(f"unknown IS level {level!r}; known: {', '.join(IS_LEVELS)}")
    lr = log_ratio_BT.detach().double()
    if level == "sequence":
        has = mask_BT.sum(-1) > 0
        lw = masked_sum(lr, mask_BT, dim=-1)[has]
    else:
        lw = lr[mask_BT != 0]
    if lw.numel() == 0:
        return {}
    rel = torch.exp(lw - lw.max())  # scale-free: no overflow however large the weights
    w = torch.exp(lw.clamp(max=_RAW_CLAMP))
    return {
        f"{prefix}_weight_raw_mean": float(w.mean()),
        f"{prefix}_weight_raw_max": float(w.max()),
        f"{prefix}_ess": float(rel.sum() ** 2 / (rel.numel() * (rel**2).sum())),
        f"{prefix}_truncated_frac": (
            float((lw > math.log(threshold)).double().mean()) if threshold is not None else 0.0
        ),
    }
