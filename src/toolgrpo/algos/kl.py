"""Token-level KL estimators between the policy and a reference, and the KL-coefficient controllers.

Kinds (verl names): ``k1``/``kl`` = logp - ref; ``abs`` = |logp - ref|; ``k2``/``mse`` =
0.5 (logp - ref)^2; ``k3``/``low_var_kl`` = exp(ref - logp) - (ref - logp) - 1 (Schulman's
low-variance estimator; log-ratio clamped to +-20, output to +-10). A trailing ``+`` (``k3+``)
keeps the forward value of the kind but back-propagates k2's gradient (straight-through), whose
expectation is the true KL gradient.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "KL_KINDS",
    "kl_penalty",
    "FixedKLController",
    "AdaptiveKLController",
    "get_kl_controller",
]

_ALIASES = {
    "k1": "k1",
    "kl": "k1",
    "abs": "abs",
    "k2": "k2",
    "mse": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
}
KL_KINDS: tuple[str, ...] = tuple(_ALIASES) + tuple(f"{k}+" for k in _ALIASES)


def _kl_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Evaluate one base KL kind element-wise; unknown kinds raise ValueError."""
    base = _ALIASES.get(kind)
    if base is None:
        raise ValueError(f"unknown KL kind {kind!r}; known kinds: {', '.join(KL_KINDS)}")
    diff = logprob - ref_logprob
    if base == "k1":
        return diff
    if base == "abs":
        return diff.abs()
    if base == "k2":
        return 0.5 * diff.square()
    log_ratio = torch.clamp(-diff, min=-20.0, max=20.0)  # ref - logp
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Element-wise KL(pi || ref) estimate of the given kind; ``kind+`` uses k2's gradient."""
    if kind.endswith("+"):
        value = _kl_forward(logprob, ref_logprob, kind[:-1])
        k2 = _kl_forward(logprob, ref_logprob, "k2")
        return k2 + (value - k2).detach()
    return _kl_forward(logprob, ref_logprob, kind)


class FixedKLController:
    """Constant KL coefficient (verl ``kl_ctrl.type=fixed``)."""

    def __init__(self, kl_coef: float) -> None:
        """Store the constant coefficient."""
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient stays fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019), as verl ``kl_ctrl.type=adaptive``.

    value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        """Validate and store the initial coefficient, target KL and horizon (in samples)."""
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards the value that keeps the observed KL near the target."""
        if not math.isfinite(current_kl):
            raise ValueError(f"current_kl must be finite, got {current_kl}")
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(
    type: str, kl_coef: float, target_kl: float = 0.1, horizon: int = 10000
) -> FixedKLController | AdaptiveKLController:
    """Build the kl_ctrl controller named by ``type``: ``fixed`` or ``adaptive``."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown kl_ctrl type {type!r}; known: fixed, adaptive")
