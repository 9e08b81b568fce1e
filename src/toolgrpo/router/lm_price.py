"""What the router gives the LM's own reward for one step: λ·cost per batch row.

Built where the routes were sampled (``RouterRuntime.bind_rows``) and carried with the step's
batch, so whoever computes advantages needs no router: under FSDP2 only rank 0 holds the router,
and every rank prices the same rows with the same λ. ``call_price`` builds the same object for a
run with no router and a fixed price per tool call (``reward.tool_call_cost``).

**The LM's price per group.** Under ``lagrangian=price`` with GRPO's std normalisation the LM's
advantage is (r − r̄)/σ_g − λ·(c − c̄)/s: its task term is on its group's scale σ_g, its cost
term on the router's scale s. In reward units a call then costs the LM λ·σ_g/s in a group, λ
only where σ_g = s: groups whose rewards spread widely price calls above λ, near-ties below it,
and a tied group (no task term) still pays λ·(c − c̄)/s. Putting the cost on σ_g instead would
make a near-tie's cost term unbounded, as GRPO makes its task term unit-size. Under Dr.GRPO
(``algorithm.adv_estimator=dr_grpo``: r − r̄, s = 1) the LM's price is exactly λ in every group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from toolgrpo.algos.router import group_z


@dataclass(frozen=True)
class LmPrice:
    cost_B: torch.Tensor  # per batch row; NaN: a rolled-back negative (no rollout of its own)
    lam: float  # the λ this step's rewards were shaped with
    spread: float  # the step's within-group task-reward spread (lagrangian=price's scale)
    lm_reward: str  # router.lm_reward
    lagrangian: str  # router.lagrangian
    norm_by_std: bool  # the LM's own GRPO normalises by the group std

    def _on(self, *modes: str) -> bool:
        return self.lm_reward == "lagrangian" and self.lagrangian in modes

    def scores(self, scores_B: torch.Tensor) -> torch.Tensor:
        """The LM's scores: r_task − λ·cost per row (``lm_reward=lagrangian``, λ in the reward),
        else r_task. Negatives keep their fixed ``negative_reward``."""
        if not self._on("reward"):
            return scores_B
        return scores_B - self.lam * torch.nan_to_num(self.cost_B, nan=0.0)

    def advantages(self, batch: Any) -> dict[str, float]:
        """The run's own GRPO advantages minus the cost's, in the same groups. ``advantage``:
        A_LM = Z(r_task) − λ·Z(cost). ``price``: A_LM = A_task − λ·(c − c̄)/s, the cost centred
        in its group and put on the scale GRPO put the task rewards on (s: the step's
        within-group reward spread under std normalisation, else 1), so λ prices a call in
        reward for the LM as it does for the router."""
        if not self._on("advantage", "price") or batch.advantages_BR is None:
            return {}
        neg = torch.isnan(self.cost_B)
        price = self.lagrangian == "price"
        z_B = group_z(
            torch.nan_to_num(self.cost_B, nan=0.0),
            batch.uids,
            self.norm_by_std and not price,
            neg.tolist(),
        )
        if price and self.norm_by_std:
            z_B = z_B / self.spread
        shift_BR = self.lam * z_B[:, None] * batch.response_mask_BR.to(torch.float32)
        batch.advantages_BR = batch.advantages_BR - shift_BR
        if batch.returns_BR is not None:
            batch.returns_BR = batch.returns_BR - shift_BR
        return {"router/lm_cost_adv_abs": float(z_B.abs().mean()) * self.lam}


def call_price(calls: Sequence[int | None], price: float, norm_by_std: bool) -> LmPrice:
    """``reward.tool_call_cost``: r − price·calls in the LM's reward, one row per entry of
    ``calls`` (None: a rolled-back negative, which keeps its fixed score). No head and no dual
    step: the LM alone learns when a call is worth its price (OTC, arXiv 2504.14870, puts the
    cost of calls in the reward the same way)."""
    cost_B = torch.tensor(
        [float(c) if c is not None else float("nan") for c in calls], dtype=torch.float32
    )
    return LmPrice(cost_B, float(price), 1.0, "lagrangian", "reward", norm_by_std)
