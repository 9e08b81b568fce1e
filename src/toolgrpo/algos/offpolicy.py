"""Policy shaping for rows another policy sampled (LUFFY, arXiv 2504.14945): pure tensor functions.

Importance sampling asks the actor to reproduce its own gradient from another policy's samples;
when the actor is weak, its probability of a good teacher token is tiny, so π/π_fixed ≪ 1 and the
teacher's best tokens teach almost nothing. LUFFY instead trains the off-policy tokens on a
shaped ratio f(r) = r / (r + γ) with no clipping, so the per-token loss is −A·f(r) and

    ∇(−A·f(r)) = −A · γ·r / (r + γ)² · ∇log π_θ(token)

The weight γ·r/(r + γ)² peaks (at 1/4) where r = γ, so tokens the actor finds unlikely but not
impossible get the largest push. LUFFY takes r = π_θ (the teacher's probability treated as 1,
since their traces carry none); when the fixed policy's sampling log-probs are known, r can be
the importance ratio π_θ/π_fixed instead (``behaviour_logprobs_BT``). Either way the estimator is
*shaped*, not unbiased: its expectation is not the on-policy gradient (``tests/algos``).

The weight is at most 1/4, and γ/(1 + γ)² ≈ 0.083 (γ = 0.1) where the actor already agrees with
the fixed policy, so next to the actor's own tokens (weight ≈ 1 under PPO) the fixed tokens push
about ten times less. ``normalize`` multiplies f by (1 + γ)²/γ, so the weight is exactly 1 at
r = 1 (and peaks at (1 + γ)²/(4γ) at r = γ): with r = π/π_fixed and the two policies equal, the
normalized estimator *is* the on-policy gradient, and otherwise it keeps LUFFY's shape at the
actor's own scale.
"""

from __future__ import annotations

import torch

from toolgrpo.algos.losses import agg_loss
from toolgrpo.algos.utils import masked_mean

__all__ = [
    "SHAPING_RATIOS",
    "shaping",
    "shaping_gain",
    "shaping_grad_weight",
    "shaping_ratio",
    "shaped_token_loss",
    "shaped_policy_loss",
]

SHAPING_RATIOS = ("ratio", "prob")  # r = π_θ/π_fixed (fixed log-probs known) | r = π_θ (LUFFY)
_CLAMP = 20.0


def shaping_gain(gamma: float = 0.1, normalize: bool = False) -> float:
    """The factor on f: 1 (LUFFY's), or (1 + γ)²/γ, which makes f's gradient weight 1 at r = 1."""
    if not gamma > 0:
        raise ValueError(f"shaping gamma must be > 0, got {gamma}")
    return (1 + gamma) ** 2 / gamma if normalize else 1.0


def shaping(r: torch.Tensor, gamma: float = 0.1, normalize: bool = False) -> torch.Tensor:
    """f(r) = r / (r + γ) (times ``shaping_gain``): increasing, bounded, steepest at small r."""
    return shaping_gain(gamma, normalize) * r / (r + gamma)


def shaping_grad_weight(
    r: torch.Tensor, gamma: float = 0.1, normalize: bool = False
) -> torch.Tensor:
    """r·f'(r) = γr/(r + γ)² (times ``shaping_gain``): the factor on ∇log π of a shaped token."""
    return shaping_gain(gamma, normalize) * gamma * r / (r + gamma) ** 2


def shaping_ratio(
    logprobs_BT: torch.Tensor, behaviour_logprobs_BT: torch.Tensor | None = None
) -> torch.Tensor:
    """r per token, differentiable in ``logprobs_BT``: π_θ/π_behaviour, or π_θ when the
    behaviour log-probs are unknown (``None``: LUFFY's teacher probability of 1)."""
    log_r = logprobs_BT
    if behaviour_logprobs_BT is not None:
        log_r = logprobs_BT - behaviour_logprobs_BT.detach()
    return torch.exp(log_r.clamp(-_CLAMP, _CLAMP))


def shaped_token_loss(
    logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    gamma: float = 0.1,
    behaviour_logprobs_BT: torch.Tensor | None = None,
    normalize: bool = False,
) -> torch.Tensor:
    """−A·f(r) per token, unclipped; the gradient flows through f (advantages are detached)."""
    r = shaping_ratio(logprobs_BT, behaviour_logprobs_BT)
    return -advantages_BT.detach() * shaping(r, gamma, normalize)


def shaped_policy_loss(
    logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    gamma: float = 0.1,
    behaviour_logprobs_BT: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    shaped_BT: torch.Tensor | None = None,
    normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The shaped loss aggregated like the PPO loss. ``shaped_BT`` (0/1) picks the tokens that
    take it: the others add 0 but still count in the aggregation's denominator, so this term plus
    a PPO loss whose weights are 0 on the shaped tokens is one loss over the whole batch."""
    tok = shaped_token_loss(logprobs_BT, advantages_BT, gamma, behaviour_logprobs_BT, normalize)
    sel = response_mask_BT if shaped_BT is None else response_mask_BT * shaped_BT
    tok = torch.where(sel != 0, tok, torch.zeros_like(tok))
    loss = agg_loss(tok, response_mask_BT, loss_agg_mode, loss_scale_factor)
    with torch.no_grad():
        r = shaping_ratio(logprobs_BT.detach(), behaviour_logprobs_BT)
        metrics = {
            "shaping_ratio_mean": float(masked_mean(r, sel)),
            "shaping_grad_weight_mean": float(
                masked_mean(shaping_grad_weight(r, gamma, normalize), sel)
            ),
        }
    return loss, metrics
