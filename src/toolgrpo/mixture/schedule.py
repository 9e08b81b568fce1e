"""Allocation schedules: which policy samples the rollouts of training step ``step``.

Steps count from 1, as the trainer's global step. α(step) is the probability that the actor
samples; otherwise a fixed policy does. Every random draw is seeded by ``(seed, step[, group])``
alone, so a schedule is a pure function of the step: a resumed run makes the same choices as an
uninterrupted one and the checkpoint needs to store nothing.

- ``constant``: α = ``alpha``.
- ``linear``: α = ``alpha0 + beta·step``, clamped to [0, ``max_alpha``].
- ``exponential``: α = 1 − exp(−``gamma``·step), capped at ``max_alpha``.
- ``step``: ``initial_policy`` samples until the first of ``switch_steps``; the policy flips at
  each switch step (the switch step itself already uses the new policy). α is then 0 or 1.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import MixtureScheduleConfig

ACTOR = "actor"
FIXED = "fixed"
SCHEDULE_TYPES = ("constant", "linear", "exponential", "step")
_KEY = "rollout_only.schedule"


def _uniform(seed: int, *keys: object) -> float:
    """A uniform draw in [0, 1) that depends only on its keys (string seeds hash with SHA-512,
    stable across processes and Python runs, unlike ``hash``)."""
    return random.Random(":".join(str(k) for k in (seed, *keys))).random()


@dataclass(frozen=True)
class Schedule:
    type: str = "constant"
    alpha: float = 0.5
    alpha0: float = 0.0
    beta: float = 0.05
    max_alpha: float = 1.0
    gamma: float = 0.1
    switch_steps: tuple[int, ...] = ()
    initial_policy: str = FIXED
    seed: int = 0

    def __post_init__(self) -> None:
        if self.type not in SCHEDULE_TYPES:
            raise ConfigError(
                f"{_KEY}.type={self.type!r} is not one of {', '.join(SCHEDULE_TYPES)}"
            )
        for name in ("alpha", "alpha0", "max_alpha"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ConfigError(f"{_KEY}.{name} must be in [0, 1], got {v}")
        if not math.isfinite(self.beta):
            raise ConfigError(f"{_KEY}.beta must be finite, got {self.beta}")
        if self.type == "exponential" and not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ConfigError(f"{_KEY}.gamma must be > 0, got {self.gamma}")
        if self.type == "step":
            if self.initial_policy not in (ACTOR, FIXED):
                raise ConfigError(
                    f"{_KEY}.initial_policy={self.initial_policy!r} is not one of actor, fixed"
                )
            steps = list(self.switch_steps)
            if not steps:
                raise ConfigError(f"{_KEY}.switch_steps must list at least one step")
            if any(s < 1 for s in steps):
                raise ConfigError(f"{_KEY}.switch_steps must be >= 1 (steps count from 1)")
            if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
                raise ConfigError(f"{_KEY}.switch_steps must be strictly increasing, got {steps}")

    @classmethod
    def from_config(cls, cfg: MixtureScheduleConfig, default_seed: int = 0) -> Schedule:
        return cls(
            type=cfg.type,
            alpha=cfg.alpha,
            alpha0=cfg.alpha0,
            beta=cfg.beta,
            max_alpha=cfg.max_alpha,
            gamma=cfg.gamma,
            switch_steps=tuple(cfg.switch_steps),
            initial_policy=cfg.initial_policy,
            seed=default_seed if cfg.seed is None else cfg.seed,
        )

    def actor_probability(self, step: int) -> float:
        """α(step): the probability that the actor samples step ``step``."""
        if step < 1:
            raise ValueError(f"steps count from 1, got {step}")
        if self.type == "constant":
            return self.alpha
        if self.type == "linear":
            return min(max(self.alpha0 + self.beta * step, 0.0), self.max_alpha)
        if self.type == "exponential":
            return min(1.0 - math.exp(-self.gamma * step), self.max_alpha)
        flips = sum(1 for s in self.switch_steps if s <= step)
        actor_first = self.initial_policy == ACTOR
        return 1.0 if actor_first == (flips % 2 == 0) else 0.0

    def get_policy_choice(self, step: int) -> str:
        """``"actor"`` or ``"fixed"`` for the whole of step ``step``."""
        return ACTOR if _uniform(self.seed, step) < self.actor_probability(step) else FIXED

    def group_choices(self, step: int, n_groups: int) -> list[str]:
        """One choice per prompt group of step ``step`` (per-sample mixing)."""
        alpha = self.actor_probability(step)
        return [ACTOR if _uniform(self.seed, step, g) < alpha else FIXED for g in range(n_groups)]


def pick_fixed(weights: Sequence[float], seed: int, *keys: object) -> int:
    """Index of the fixed policy that samples, drawn ∝ ``weights`` from the same seeded keys."""
    total = float(sum(weights))
    u = _uniform(seed, "fixed", *keys) * total
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if u < acc:
            return i
    return len(weights) - 1


def allocate(
    schedule: Schedule,
    step: int,
    n_groups: int,
    labels: Sequence[str],
    weights: Sequence[float],
    per_sample: bool = False,
) -> list[str]:
    """The policy label (``"actor"`` or one of ``labels``) of each prompt group of a step.

    Per step, every group gets the step's choice. Per sample, each group is drawn on its own;
    a group is never split, because GRPO's baseline compares the samples of one prompt."""
    if per_sample:
        choices = schedule.group_choices(step, n_groups)
        keys: list[tuple[object, ...]] = [(step, g) for g in range(n_groups)]
    else:
        choices = [schedule.get_policy_choice(step)] * n_groups
        keys = [(step,)] * n_groups
    return [
        ACTOR if c == ACTOR else labels[pick_fixed(weights, schedule.seed, *k)]
        for c, k in zip(choices, keys, strict=True)
    ]
