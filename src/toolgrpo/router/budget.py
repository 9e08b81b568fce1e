"""The budget's state across steps: λ, the costs seen since the last dual step, and the price
scale s that puts r_task − λ·cost on one scale for every step (``router.lagrangian=price``)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from toolgrpo.algos.router import (
    lagrangian_advantages,
    pi_dual_update,
    running_variance,
    spread_value,
    within_group_variance,
)


@dataclass
class Budget:
    """λ is updated every ``update_every`` steps from the mean cost per example over those steps
    (so K > 1 averages out small batches); it is checkpointed, so a resumed run keeps its price.
    With ``dual_kp`` > 0, λ is the integral plus k_p times the last cost error (``integral`` holds
    the former); with k_p = 0 the two are equal and the step is plain dual ascent.

    The price scale s is the square root of an exponential average (``spread_decay`` per step,
    bias-corrected) of each step's within-group variance of task reward: a step on which one
    group stops tying moves it by a fraction (1 − decay) of that step's variance, not from 1 to
    that group's spread at once. Decay 0 is the batch's own spread (1 when every group ties)."""

    budget: float
    lam: float = 0.0
    dual_lr: float = 0.5
    update_every: int = 1
    dual_kp: float = 0.0
    integral: float | None = None  # the integral term; None = start from lam
    steps_seen: int = 0  # steps observed since the last dual step
    cost_sum: float = 0.0
    cost_count: int = 0
    updates: int = 0
    spread_decay: float = 0.9
    spread_sq: float = 0.0  # the running average of the within-group variance
    spread_steps: int = 0  # steps folded into it

    def __post_init__(self) -> None:
        if self.integral is None:  # a fresh budget: the integral starts at λ
            self.integral = self.lam

    @classmethod
    def from_config(cls, rc: Any) -> Budget:  # a RouterConfig
        return cls(
            rc.budget,
            rc.lambda_init,
            rc.dual_lr,
            rc.update_every,
            dual_kp=rc.dual_kp,
            spread_decay=rc.spread_decay,
        )

    @property
    def scale(self) -> float:
        """s, the price scale (``algos.router.spread_value``)."""
        return spread_value(self.spread_sq, self.spread_steps, self.spread_decay)

    def advantages(
        self,
        task_B: torch.Tensor,
        cost_B: torch.Tensor,
        uids: Sequence[Hashable],
        mode: str = "price",
        norm_by_std: bool = True,
        skip_B: Sequence[bool] | None = None,
    ) -> torch.Tensor:
        """The head's advantages of one step under λ (``lagrangian_advantages``); ``price``
        first folds the step's within-group variance into s, then divides by it. ``skip_B``
        rows (another policy's rollouts) get 0 and inform neither s nor any group mean."""
        if mode == "price":
            var = within_group_variance(task_B, uids, skip_B)
            self.spread_sq, self.spread_steps = running_variance(
                self.spread_sq, self.spread_steps, var, self.spread_decay
            )
        return lagrangian_advantages(
            task_B, cost_B, self.lam, uids, mode, norm_by_std, self.scale, skip_B
        )

    def observe(self, costs: list[float]) -> None:
        """One step's per-example costs."""
        self.cost_sum += float(sum(costs))
        self.cost_count += len(costs)
        self.steps_seen += 1

    def step(self) -> bool:
        """The dual step when ``update_every`` steps have been observed; True if λ moved."""
        if self.steps_seen < self.update_every or self.cost_count == 0:
            return False
        mean_cost = self.cost_sum / self.cost_count
        self.integral, self.lam = pi_dual_update(
            self.integral, mean_cost, self.budget, self.dual_lr, self.dual_kp
        )
        self.steps_seen, self.cost_sum, self.cost_count = 0, 0.0, 0
        self.updates += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore λ, the open window and the price scale; the budget, η, K and the decay stay
        as configured now. A checkpoint from before the running scale starts it afresh."""
        keys = ("lam", "steps_seen", "cost_sum", "cost_count", "updates")
        for key in (*keys, "spread_sq", "spread_steps"):
            if key in state:
                setattr(self, key, type(getattr(self, key))(state[key]))
        # A checkpoint from before the PI term has no integral: plain ascent's λ is its integral.
        integral = state.get("integral")
        self.integral = float(integral) if integral is not None else self.lam
