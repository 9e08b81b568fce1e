"""Importance-sampling correction for rows a fixed policy sampled (pure tensor functions).

Two estimators (``rollout_only.bypass_mode``), in verl's rollout-correction vocabulary:

- decoupled (default, ``bypass_mode=false``): three policies. The PPO old log-probs of a fixed
  row are the actor's own (π_old, recomputed before the update), so the clip band sits around
  the actor, and a detached weight w = min(π_old/π_fixed, C) multiplies the loss:
  per sequence (``rollout_is=sequence``, w = Π_t of the token ratios; unbiased when C = ∞) or
  per token (``rollout_is=token``; ignores how the prefix distribution shifts, so biased beyond
  one-token responses, but of lower variance). C = ``rollout_is_threshold`` (null: untruncated).
- bypass (``bypass_mode=true``, the design's literal method): π_fixed's sampling log-probs *are*
  the old log-probs, so the PPO ratio is π/π_fixed per token. Biased twice: the clip band is
  centred on π_fixed, so tokens whose ratio leaves [1−ε, 1+ε] teach nothing, and per-token
  ratios do not correct the prefix. docs/mixture.md tabulates every mode's exact bias.

Beside the IS estimators (``objective="is"``), ``objective="shaped"`` trains fixed rows on
LUFFY's policy shaping (``toolgrpo.algos.offpolicy``): the PPO term is switched off on them
(weight 0, old log-probs the actor's own) and ``shaping_BR`` marks their tokens, which the
actor's update trains on −A·f(r), f(r) = r/(r + γ), unclipped. Shaped, not unbiased.

Whatever the objective, ``mixture/is_*`` report the untruncated weights at the configured level
(``algos.importance.raw_is_stats``): what the truncation hides.

Actor rows are never touched: their old log-probs stay whatever the trainer chose (reused from
generation when exactly on-policy, else recomputed) and their weight is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolgrpo.algos.importance import (
    importance_log_ratio,
    is_weight_stats,
    raw_is_stats,
    truncated_is_weights,
)
from toolgrpo.algos.offpolicy import shaping_grad_weight
from toolgrpo.algos.utils import masked_mean

ROLLOUT_IS_LEVELS = ("sequence", "token")
OBJECTIVES = ("is", "shaped")  # rollout_only.fixed_loss


@dataclass
class Correction:
    old_logprobs_BR: torch.Tensor
    is_weights_BR: torch.Tensor | None  # None: no extra weights (bypass mode)
    metrics: dict[str, float]
    shaping_BR: torch.Tensor | None = None  # 1 on tokens trained by policy shaping


def sequence_ess(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """Normalised effective sample size (Σw)²/(n·Σw²) of untruncated sequence weights, computed
    from log-weights (scale-free, so no overflow): 1 = as good as on-policy samples."""
    has = mask_BT.sum(-1) > 0
    if not bool(has.any()):
        return float("nan")
    lw = (log_ratio_BT * mask_BT).sum(-1)[has].double()
    w = torch.exp(lw - lw.max())
    return float(w.sum() ** 2 / (w.numel() * (w**2).sum()))


def correct_fixed_rows(
    old_logprobs_BR: torch.Tensor,
    rollout_logprobs_BR: torch.Tensor,
    current_logprobs_BR: torch.Tensor,
    mask_BR: torch.Tensor,
    fixed_B: torch.Tensor,
    bypass_mode: bool = False,
    level: str = "sequence",
    threshold: float | None = 2.0,
    objective: str = "is",
    shaping_gamma: float = 0.1,
    shaping_ratio: str = "ratio",
    shaping_normalize: bool = False,
) -> Correction:
    """Old log-probs (a new tensor) and IS weights for a batch whose ``fixed_B`` rows a fixed
    policy sampled. ``current_logprobs_BR`` (the actor before the update, π_old) matter on those
    rows only. Metrics describe the weights in effect: the token ratio π_old/π_fixed in bypass
    mode (before clipping), the truncated token or sequence weights when decoupled; with
    ``objective="shaped"``, f's gradient weight γ·r/(r + γ)² at θ_old (``shaping_ratio``:
    r = π_old/π_fixed, or r = π_old for ``prob``; times (1 + γ)²/γ with ``shaping_normalize``)."""
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"unknown rollout_is level {level!r}; known: sequence, token")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown fixed-row objective {objective!r}; known: is, shaped")
    if objective == "shaped" and bypass_mode:
        raise ValueError("policy shaping has no PPO old log-probs to bypass: use bypass_mode=false")
    fixed_B = fixed_B.bool()
    old = old_logprobs_BR.clone()  # it may alias the rollout log-probs (on-policy reuse)
    metrics = {"actor/importance_sampling": float(fixed_B.any())}
    if not bool(fixed_B.any()):
        return Correction(old, None, metrics)
    mask = mask_BR[fixed_B]
    log_ratio = importance_log_ratio(
        current_logprobs_BR[fixed_B], rollout_logprobs_BR[fixed_B], mask
    )
    weights, shaping = None, None
    raw_level = "token" if bypass_mode else level
    metrics.update(raw_is_stats(log_ratio, mask, raw_level, threshold))
    if objective == "shaped":  # the PPO term off on fixed rows; the update shapes them instead
        old[fixed_B] = current_logprobs_BR[fixed_B]
        weights = torch.ones_like(old)
        weights[fixed_B] = 0.0
        shaping = torch.zeros_like(old)
        shaping[fixed_B] = (mask != 0).to(old.dtype)
        r = torch.exp(log_ratio if shaping_ratio == "ratio" else current_logprobs_BR[fixed_B])
        gw = shaping_grad_weight(r, shaping_gamma, shaping_normalize)
        metrics["mixture/shaping_grad_weight_mean"] = float(masked_mean(gw, mask))
        used = None
    elif bypass_mode:
        old[fixed_B] = rollout_logprobs_BR[fixed_B]
        used = torch.exp(log_ratio)[mask.bool()]
    else:
        w = truncated_is_weights(log_ratio, mask, level, threshold)
        old[fixed_B] = current_logprobs_BR[fixed_B]
        weights = torch.ones_like(old)
        weights[fixed_B] = w
        has = mask.sum(-1) > 0
        used = w[mask.bool()] if level == "token" else w[has, 0]
        if used.numel() and threshold is not None:
            clipped = (used >= threshold).double().mean()
            metrics["actor/importance_weight_truncated_frac"] = float(clipped)
    if used is not None:
        metrics.update(is_weight_stats(used))
    metrics["actor/importance_log_ratio_mean"] = float(masked_mean(log_ratio, mask))
    metrics["rollout/fixed_seq_ess"] = sequence_ess(log_ratio, mask)
    return Correction(old, weights, metrics, shaping)
