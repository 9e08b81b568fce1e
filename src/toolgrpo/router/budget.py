"""The budget's state across steps: λ, and the costs seen since the last dual step."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from toolgrpo.algos.router import pi_dual_update


@dataclass
class Budget:
    """λ is updated every ``update_every`` steps from the mean cost per example over those steps
    (so K > 1 averages out small batches); it is checkpointed, so a resumed run keeps its price.
    With ``dual_kp`` > 0, λ is the integral plus k_p times the last cost error (``integral`` holds
    the former); with k_p = 0 the two are equal and the step is plain dual ascent."""

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

    def __post_init__(self) -> None:
        if self.integral is None:  # a fresh budget: the integral starts at λ
            self.integral = self.lam

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
        """Restore λ and the open window; the budget, η and K stay as configured now."""
        for key in ("lam", "steps_seen", "cost_sum", "cost_count", "updates"):
            if key in state:
                setattr(self, key, type(getattr(self, key))(state[key]))
        # A checkpoint from before the PI term has no integral: plain ascent's λ is its integral.
        integral = state.get("integral")
        self.integral = float(integral) if integral is not None else self.lam
