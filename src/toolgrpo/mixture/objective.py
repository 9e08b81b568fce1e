"""What the update does with a mixture's fixed-policy rows beside their PPO term, and how much of
the update they get.

``Mixture.correct`` sets the fixed rows' old log-probs and weights before the update; the actor's
loss then adds, per micro-batch (``FixedObjective.terms``):

- **policy shaping** (``rollout_only.fixed_loss=shaped``, LUFFY): −A·f(r) on the tokens
  ``Batch.shaping_BR`` marks (``algos.offpolicy``);
- **guided NLL** (``rollout_only.guided_coef`` = λ > 0, SRFT/ReLIFT-style): λ·NLL on the fixed
  rows that scored at least ``guided_min_score`` (``algos.guided``);

and the KL-to-reference loss skips the fixed rows with ``rollout_only.fixed_kl_loss=false``
(``kl_rows``). Every term shares the policy loss's aggregation and denominator.

``mixture/fixed_grad_share`` says how much of the update the fixed rows get: the share of
Σ|∂L_pg/∂log π(token)| (L_pg: the PPO, shaped and guided terms; KL and entropy left out) on
fixed rows' tokens, summed over the update's micro-batches with their loss weights. It is the
|A|·tokens·weight share read exactly off the loss (clipping, IS and shaping weights and the
aggregation included), at the cost of one more elementwise pass of the loss per micro-batch; the
share of the parameter-gradient norm would need a second backward through the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from toolgrpo.algos.guided import guided_nll_loss
from toolgrpo.algos.offpolicy import shaped_policy_loss
from toolgrpo.mixture.schedule import ACTOR

if TYPE_CHECKING:
    from toolgrpo.trainer.batch import Batch

SHARE = "mixture/fixed_grad_share"
_FIXED_MASS, _ALL_MASS = "mixture/_grad_weight_fixed", "mixture/_grad_weight_all"


def fixed_rows(policies: Sequence[str], n: int) -> torch.Tensor:
    """Bool per row: a fixed policy sampled it (no labels: every row is the actor's)."""
    if not policies:
        return torch.zeros(n, dtype=torch.bool)
    return torch.tensor([p != ACTOR for p in policies], dtype=torch.bool)


def guided_rows(
    policies: Sequence[str],
    scores_B: torch.Tensor | None,
    is_negative: Sequence[bool],
    min_score: float,
) -> torch.Tensor:
    """Bool per row: a fixed policy's real sample (not a rolled-back negative) whose score
    reaches ``min_score``: the successes the guided NLL trains on."""
    n = len(policies)
    if scores_B is None or n == 0:
        return torch.zeros(n, dtype=torch.bool)
    ok = (scores_B.detach().cpu() >= min_score) & fixed_rows(policies, n)
    if is_negative:
        ok &= ~torch.tensor([bool(x) for x in is_negative], dtype=torch.bool)
    return ok


def grad_weight_masses(
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    fixed_B: torch.Tensor,
) -> dict[str, float]:
    """Σ|∂loss/∂log π| over the fixed rows' tokens and over all tokens, with ``loss_of`` (a pure
    function of the log-probs) evaluated on a detached copy: the model's graph is not touched."""
    lp = logprobs_BT.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_of(lp)
    (g,) = torch.autograd.grad(loss, lp, allow_unused=True)
    coef = torch.zeros_like(lp) if g is None else g.detach().abs()
    coef = torch.where(mask_BT != 0, coef, torch.zeros_like(coef))
    fixed = fixed_B.to(coef.device).unsqueeze(-1)
    return {_FIXED_MASS: float((coef * fixed).sum()), _ALL_MASS: float(coef.sum())}


def pop_grad_share(metrics: dict[str, float]) -> dict[str, float]:
    """Take the summed masses out of an update's metrics; ``{SHARE: fixed / all}`` (0 when the
    loss asked nothing of any token), or nothing when no masses were summed."""
    fixed, total = metrics.pop(_FIXED_MASS, None), metrics.pop(_ALL_MASS, None)
    if fixed is None or total is None:
        return {}
    return {SHARE: fixed / total if total > 0 else 0.0}


@dataclass(frozen=True)
class FixedObjective:
    """The ``rollout_only`` settings the actor's loss reads for fixed rows."""

    shaping_gamma: float = 0.1
    shaping_ratio: str = "ratio"  # ratio: r = π/π_fixed | prob: r = π
    shaping_normalize: bool = False
    fixed_kl_loss: bool = True
    guided_coef: float = 0.0
    guided_min_score: float = 1.0

    @classmethod
    def from_config(cls, cfg: Any) -> FixedObjective:
        ro = cfg.rollout_only
        return cls(
            ro.shaping_gamma,
            ro.shaping_ratio,
            ro.shaping_normalize,
            ro.fixed_kl_loss,
            ro.guided_coef,
            ro.guided_min_score,
        )

    def terms(
        self,
        mb: Batch,
        logprobs_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        agg_mode: str,
        scale: float | None,
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The shaped and guided terms of micro-batch ``mb`` (None: neither applies), and the
        guided term's value (``mixture/guided_loss``, λ included)."""
        r = logprobs_BT.shape[1]
        loss: torch.Tensor | None = None
        metrics: dict[str, float] = {}
        if mb.shaping_BR is not None:  # the PPO term has weight 0 on those tokens
            fixed_lp = mb.rollout_logprobs_BR[:, :r] if self.shaping_ratio == "ratio" else None
            adv, shaped_BT = mb.advantages_BR[:, :r], mb.shaping_BR[:, :r]
            args = (self.shaping_gamma, fixed_lp, agg_mode, scale, shaped_BT)
            loss, _ = shaped_policy_loss(logprobs_BT, adv, mask_BT, *args, self.shaping_normalize)
        if self.guided_coef > 0:
            rows = guided_rows(mb.policies, mb.scores_B, mb.is_negative, self.guided_min_score)
            nll = guided_nll_loss(
                logprobs_BT, mask_BT, rows.to(logprobs_BT.device), self.guided_coef, agg_mode, scale
            )
            metrics["mixture/guided_loss"] = float(nll.detach())
            loss = nll if loss is None else loss + nll
        return loss, metrics

    def grad_masses(
        self,
        loss_of: Callable[[torch.Tensor], torch.Tensor],
        logprobs_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        mb: Batch,
    ) -> dict[str, float]:
        """``grad_weight_masses`` of micro-batch ``mb``'s policy loss (``pop_grad_share``)."""
        return grad_weight_masses(loss_of, logprobs_BT, mask_BT, fixed_rows(mb.policies, mb.size))

    def kl_rows(self, mb: Batch) -> torch.Tensor | None:
        """1 per row the KL loss covers: None (every row), or the actor's rows only."""
        if self.fixed_kl_loss:
            return None
        rows = ~fixed_rows(mb.policies, mb.size)
        return rows.to(device=mb.response_mask_BR.device, dtype=mb.response_mask_BR.dtype)
