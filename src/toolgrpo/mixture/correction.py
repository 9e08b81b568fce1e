"""Importance-sampling correction for rows a fixed policy sampled (pure tensor functions).

Three modes (``rollout_only.is_correction``):

- ``ppo_clip`` (default): the fixed policy's sampling log-probs *are* the old log-probs, so the
  PPO ratio is π_current/π_fixed and the loss is unchanged. Its gradient is the exact IS
  policy gradient for tokens whose ratio lies inside the clip band [1−ε_low, 1+ε_high] (and below
  the dual-clip c for A < 0); tokens outside it contribute nothing. Right when the fixed policy is
  close to the actor (an earlier checkpoint, the same model at a nearby temperature); with a
  distant policy most tokens are clipped and the fixed samples teach little (``pg_clipfrac``).
- ``tis_token`` / ``tis_seq``: verl's decoupled form. The old log-probs are the current actor's,
  so PPO clips around the actor itself, and a detached weight min(π_current/π_fixed, C) per token
  (or per sequence) multiplies the loss. Right when the policies differ a lot: the trust region
  stays meaningful and C bounds the variance. ``tis_token`` suits short responses and close
  policies (it ignores the prefix shift); ``tis_seq`` is unbiased up to the truncation but its
  variance grows with response length.

Actor rows are never touched: their old log-probs stay whatever the trainer chose (reused from
generation when exactly on-policy, else recomputed) and their weight is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolgrpo.algos.importance import importance_log_ratio, is_weight_stats, truncated_is_weights
from toolgrpo.algos.utils import masked_mean

IS_CORRECTIONS = ("ppo_clip", "tis_token", "tis_seq")


@dataclass
class Correction:
    old_logprobs_BR: torch.Tensor
    is_weights_BR: torch.Tensor | None  # None: no extra weights (ppo_clip)
    metrics: dict[str, float]


def correct_fixed_rows(
    old_logprobs_BR: torch.Tensor,
    rollout_logprobs_BR: torch.Tensor,
    current_logprobs_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    fixed_B: torch.Tensor,
    mode: str = "ppo_clip",
    threshold: float = 2.0,
) -> Correction:
    """Old log-probs (a new tensor) and IS weights for a batch whose ``fixed_B`` rows a fixed
    policy sampled. ``current_logprobs_BR`` (the actor before the update) matter on those rows
    only. Metrics describe the weights in effect: the token ratio π_current/π_fixed for
    ``ppo_clip`` (before clipping), the truncated token or sequence weights for ``tis_*``."""
    if mode not in IS_CORRECTIONS:
        raise ValueError(f"unknown IS correction {mode!r}; known: {', '.join(IS_CORRECTIONS)}")
    fixed_B = fixed_B.bool()
    old = old_logprobs_BR.clone()  # it may alias the rollout log-probs (on-policy reuse)
    metrics = {"actor/importance_sampling": float(fixed_B.any())}
    if not bool(fixed_B.any()):
        return Correction(old, None, metrics)
    mask = mask_BR[fixed_B]
    log_ratio = importance_log_ratio(
        current_logprobs_BR[fixed_B], rollout_logprobs_BR[fixed_B], mask
    )
    weights = None
    if mode == "ppo_clip":
        old[fixed_B] = rollout_logprobs_BR[fixed_B]
        used = torch.exp(log_ratio)[mask.bool()]
    else:
        level = "token" if mode == "tis_token" else "sequence"
        w = truncated_is_weights(log_ratio, mask, level, threshold)
        old[fixed_B] = current_logprobs_BR[fixed_B]
        weights = torch.ones_like(old)
        weights[fixed_B] = w
        has = mask.sum(-1) > 0
        used = w[mask.bool()] if level == "token" else w[has, 0]
        if used.numel():
            clipped = (used >= threshold).double().mean()
            metrics["actor/importance_weight_truncated_frac"] = float(clipped)
    metrics.update(is_weight_stats(used))
    metrics["actor/importance_log_ratio_mean"] = float(masked_mean(log_ratio, mask))
    return Correction(old, weights, metrics)
