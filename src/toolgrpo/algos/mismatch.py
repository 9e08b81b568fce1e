"""Rollout/trainer mismatch: how far the sampler's log-probs are from the trainer's, and the
truncated importance weights that correct what remains (pure tensor functions).

The engine that samples (vLLM, or ``generate`` with a KV cache) and the trainer's forward compute
the same policy with different kernels; in bf16 their log-probs of the same token differ. Using
the sampler's log-probs as PPO's old log-probs then silently mixes two policies. The decoupled
correction (verl's rollout correction, TRL's vLLM IS correction) takes the trainer's log-probs
as π_old and weights each token by min(π_old/π_rollout, C).

Metrics (over the tokens the policy sampled, ``mask`` 1), with ρ = π_trainer / π_rollout:
- ``logprob_diff_mean`` / ``_max``: mean and max |log π_trainer − log π_rollout|;
- ``mismatch_kl``: KL(π_rollout ‖ π_trainer) per token, by the k3 estimator ρ − 1 − log ρ
  (unbiased for samples drawn from π_rollout, and never negative);
- ``mismatch_frac_outside_clip``: share of tokens whose ρ lies outside PPO's clip band
  [1 − ε_low, 1 + ε_high]: the tokens an update that anchors its ratio on the sampler's
  log-probs (bypass mode) would clip before the policy has moved at all.
"""

from __future__ import annotations

import torch

from toolgrpo.algos.importance import IS_LEVELS, importance_log_ratio, truncated_is_weights

__all__ = ["mismatch_metrics", "rollout_is_weights", "rollout_is_stats"]


def mismatch_metrics(
    trainer_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    prefix: str = "rollout/",
) -> dict[str, float]:
    """The mismatch metrics above; an empty dict when ``mask`` selects no token."""
    m = mask_BT != 0
    if not bool(m.any()):
        return {}
    log_ratio = importance_log_ratio(trainer_logprobs_BT, rollout_logprobs_BT, mask_BT)[m].double()
    ratio = torch.exp(log_ratio)
    outside = (ratio < 1.0 - clip_ratio_low) | (ratio > 1.0 + clip_ratio_high)
    return {
        f"{prefix}logprob_diff_mean": float(log_ratio.abs().mean()),
        f"{prefix}logprob_diff_max": float(log_ratio.abs().max()),
        f"{prefix}mismatch_kl": float((ratio - 1.0 - log_ratio).mean()),
        f"{prefix}mismatch_frac_outside_clip": float(outside.double().mean()),
    }


def rollout_is_weights(
    trainer_logprobs_BT: torch.Tensor,
    rollout_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    level: str = "token",
    threshold: float | None = 2.0,
) -> torch.Tensor:
    """Detached weights min(π_trainer/π_rollout, C), per token or per sequence (the product of
    a row's token ratios, broadcast); 1 where ``mask`` is 0."""
    if level not in IS_LEVELS:
        raise ValueError(f"unknown rollout_is level {level!r}; known: token, sequence")
    log_ratio = importance_log_ratio(trainer_logprobs_BT, rollout_logprobs_BT, mask_BT)
    return truncated_is_weights(log_ratio, mask_BT, level, threshold)


def rollout_is_stats(
    weights_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    threshold: float | None,
    prefix: str = "rollout/",
) -> dict[str, float]:
    """Mean, min and truncated share of the weights in effect on the masked tokens."""
    m = mask_BT != 0
    if not bool(m.any()):
        return {}
    w = weights_BT.detach()[m].double()
    out = {f"{prefix}is_weight_mean": float(w.mean()), f"{prefix}is_weight_min": float(w.min())}
    if threshold is not None:
        out[f"{prefix}is_weight_truncated_frac"] = float((w >= threshold).double().mean())
    return out
