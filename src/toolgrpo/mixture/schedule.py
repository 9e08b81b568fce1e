"""Allocation schedules: which policy samples the rollouts of training step ``step``.

The design's API: an abstract ``RolloutAllocationSchedule`` with ``get_policy_choice(step)``, and
a registry, so a user schedule is one class plus its name in ``rollout_allocation_schedule.type``
(a registered name, or ``package.module:ClassName``, imported on first use)::

    @register_schedule("warmup_then_half")
    class WarmupThenHalf(RolloutAllocationSchedule):
        def get_policy_choice(self, step):
            return "fixed" if step <= self.cfg.params.get("warmup", 10) else "actor"

Steps count from 1, as the trainer's global step. Built-in schedules give α(step), the probability
that the actor samples; every draw is seeded by ``(seed, step[, group])`` alone, so they are pure
functions of the step and a resumed run makes the same choices.

- ``constant``: α = ``alpha``.
- ``linear``: α = ``alpha_0 + beta·step``, clamped to [0, ``max_alpha``].
- ``exponential``: α = 1 − exp(−``gamma``·step), capped at ``max_alpha``.
- ``step``: ``initial_policy`` samples until the first of ``switch_steps``; the policy flips at
  each switch step (the switch step itself already uses the new policy). α is then 0 or 1.
- ``adaptive`` (reads training metrics, ``observe``): α starts at ``alpha`` and rises toward
  ``max_alpha`` as the fixed rows' effective sample size falls (``signal: ess``), or jumps to
  ``max_alpha`` once the actor's rollout reward reaches the fixed policy's (``reward``), or both
  (``ess_or_reward``). Observations are running averages with weight ``ema`` on the newest; on
  resume the mixture replays them from ``metrics.jsonl``.
"""

from __future__ import annotations

import difflib
import importlib
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import RolloutAllocationScheduleConfig

ACTOR = "actor"
FIXED = "fixed"
KEY = "rollout_allocation_schedule"
ESS_METRIC = "rollout/fixed_seq_ess"  # untruncated sequence-level ESS of the fixed rows
REWARD_METRICS = ("rollout/reward_actor", "rollout/reward_fixed")
Choice = Literal["actor", "fixed"]


def _uniform(seed: int, *keys: object) -> float:
    """A uniform draw in [0, 1) that depends only on its keys (string seeds hash with SHA-512,
    stable across processes and Python runs, unlike ``hash``)."""
    return random.Random(":".join(str(k) for k in (seed, *keys))).random()


class RolloutAllocationSchedule(ABC):
    """Who samples each step. Subclasses implement ``get_policy_choice``; the rest is optional:
    ``group_choices`` (per-sample mixing), ``actor_probability`` (logged as ``rollout/alpha``)
    and ``observe`` (a step's training metrics, for adaptive schedules)."""

    name = ""

    def __init__(self, cfg: RolloutAllocationScheduleConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed

    @abstractmethod
    def get_policy_choice(self, step: int) -> Choice:
        """``"actor"`` or ``"fixed"`` for the whole of step ``step``."""

    def group_choices(self, step: int, n_groups: int) -> list[Choice]:
        """One choice per prompt group of step ``step`` (``per_sample``); default: the step's."""
        return [self.get_policy_choice(step)] * n_groups

    def actor_probability(self, step: int) -> float | None:
        """α(step) if the schedule has one (None: not logged)."""
        return None

    def observe(self, metrics: Mapping[str, float]) -> None:  # noqa: B027 - optional hook
        """Training metrics of a finished rollout/correction; ignored unless adaptive."""


SCHEDULES: dict[str, type[RolloutAllocationSchedule]] = {}


def register_schedule(
    name: str,
) -> Callable[[type[RolloutAllocationSchedule]], type[RolloutAllocationSchedule]]:
    """Class decorator: ``rollout_allocation_schedule.type=<name>`` selects the class."""

    def deco(cls: type[RolloutAllocationSchedule]) -> type[RolloutAllocationSchedule]:
        if name in SCHEDULES and SCHEDULES[name] is not cls:
            raise ValueError(f"schedule {name!r} is already registered to {SCHEDULES[name]}")
        cls.name = name
        SCHEDULES[name] = cls
        return cls

    return deco


def schedule_class(name: str) -> type[RolloutAllocationSchedule]:
    """A registered schedule, or ``module:Class`` imported (one-line errors either way)."""
    if name in SCHEDULES:
        return SCHEDULES[name]
    if ":" not in name:
        close = difflib.get_close_matches(name, sorted(SCHEDULES), n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(
            f"{KEY}.type={name!r} is not one of {', '.join(sorted(SCHEDULES))} nor a "
            f"'module:Class' path{hint}"
        )
    module, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{KEY}.type={name!r} cannot be imported: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, RolloutAllocationSchedule)):
        raise ConfigError(f"{KEY}.type={name!r} is not a RolloutAllocationSchedule subclass")
    return cls


def build_schedule(
    cfg: RolloutAllocationScheduleConfig, default_seed: int = 0
) -> RolloutAllocationSchedule:
    """The configured schedule (checked: bad settings raise ConfigError naming the key)."""
    seed = default_seed if cfg.seed is None else cfg.seed
    return schedule_class(cfg.type)(cfg, seed)


def _unit(cfg: RolloutAllocationScheduleConfig, *names: str) -> None:
    for name in names:
        v = getattr(cfg, name)
        if not (isinstance(v, int | float) and math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ConfigError(f"{KEY}.{name} must be in [0, 1], got {v}")


class ProbabilitySchedule(RolloutAllocationSchedule):
    """A schedule given by α(step) (subclasses implement ``alpha``): the step, or each group,
    is a seeded coin flip."""

    @abstractmethod
    def alpha(self, step: int) -> float: ...

    def actor_probability(self, step: int) -> float:
        if step < 1:
            raise ValueError(f"steps count from 1, got {step}")
        return self.alpha(step)

    def get_policy_choice(self, step: int) -> Choice:
        return ACTOR if _uniform(self.seed, step) < self.actor_probability(step) else FIXED

    def group_choices(self, step: int, n_groups: int) -> list[Choice]:
        alpha = self.actor_probability(step)
        return [ACTOR if _uniform(self.seed, step, g) < alpha else FIXED for g in range(n_groups)]


@register_schedule("constant")
class ConstantSchedule(ProbabilitySchedule):
    def __init__(self, cfg: RolloutAllocationScheduleConfig, seed: int = 0) -> None:
        super().__init__(cfg, seed)
        _unit(cfg, "alpha")

    def alpha(self, step: int) -> float:
        return self.cfg.alpha


@register_schedule("linear")
class LinearSchedule(ProbabilitySchedule):
    def __init__(self, cfg: RolloutAllocationScheduleConfig, seed: int = 0) -> None:
        super().__init__(cfg, seed)
        _unit(cfg, "alpha_0", "max_alpha")
        if not math.isfinite(cfg.beta):
            raise ConfigError(f"{KEY}.beta must be finite, got {cfg.beta}")

    def alpha(self, step: int) -> float:
        c = self.cfg
        return min(max(c.alpha_0 + c.beta * step, 0.0), c.max_alpha)


@register_schedule("exponential")
class ExponentialSchedule(ProbabilitySchedule):
    def __init__(self, cfg: RolloutAllocationScheduleConfig, seed: int = 0) -> None:
        super().__init__(cfg, seed)
        _unit(cfg, "max_alpha")
        if not (math.isfinite(cfg.gamma) and cfg.gamma > 0):
            raise ConfigError(f"{KEY}.gamma must be > 0, got {cfg.gamma}")

    def alpha(self, step: int) -> float:
        return min(1.0 - math.exp(-self.cfg.gamma * step), self.cfg.max_alpha)


@register_schedule("step")
class StepSchedule(ProbabilitySchedule):
    def __init__(self, cfg: RolloutAllocationScheduleConfig, seed: int = 0) -> None:
        super().__init__(cfg, seed)
        if cfg.initial_policy not in (ACTOR, FIXED):
            raise ConfigError(
                f"{KEY}.initial_policy={cfg.initial_policy!r} is not one of actor, fixed"
            )
        steps = list(cfg.switch_steps)
        if not steps:
            raise ConfigError(f"{KEY}.switch_steps must list at least one step")
        if any(s < 1 for s in steps):
            raise ConfigError(f"{KEY}.switch_steps must be >= 1 (steps count from 1)")
        if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            raise ConfigError(f"{KEY}.switch_steps must be strictly increasing, got {steps}")

    def alpha(self, step: int) -> float:
        flips = sum(1 for s in self.cfg.switch_steps if s <= step)
        actor_first = self.cfg.initial_policy == ACTOR
        return 1.0 if actor_first == (flips % 2 == 0) else 0.0


@register_schedule("adaptive")
class AdaptiveSchedule(ProbabilitySchedule):
    """α from training metrics: more actor rollouts as the fixed samples lose their weight
    (ESS → 0 means a few fixed rows carry all the weight), or once the actor does as well."""

    def __init__(self, cfg: RolloutAllocationScheduleConfig, seed: int = 0) -> None:
        super().__init__(cfg, seed)
        _unit(cfg, "alpha", "max_alpha")
        if cfg.alpha > cfg.max_alpha:
            raise ConfigError(f"{KEY}.alpha ({cfg.alpha}) must be <= max_alpha ({cfg.max_alpha})")
        if cfg.signal not in ("ess", "reward", "ess_or_reward"):
            raise ConfigError(
                f"{KEY}.signal={cfg.signal!r} is not one of ess, reward, ess_or_reward"
            )
        if not 0 < cfg.ema <= 1:
            raise ConfigError(f"{KEY}.ema must be in (0, 1], got {cfg.ema}")
        self.ess: float | None = None
        self.reward: dict[str, float] = {}

    def _avg(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.cfg.ema) * old + self.cfg.ema * new

    def observe(self, metrics: Mapping[str, float]) -> None:
        ess = metrics.get(ESS_METRIC)
        if ess is not None and math.isfinite(ess):
            self.ess = self._avg(self.ess, float(ess))
        for key in REWARD_METRICS:
            v = metrics.get(key)
            if v is not None and math.isfinite(v):
                self.reward[key] = self._avg(self.reward.get(key), float(v))

    def alpha(self, step: int) -> float:
        c = self.cfg
        alpha = c.alpha
        if c.signal in ("ess", "ess_or_reward") and self.ess is not None:
            alpha = c.alpha + (c.max_alpha - c.alpha) * (1.0 - min(max(self.ess, 0.0), 1.0))
        if c.signal in ("reward", "ess_or_reward") and len(self.reward) == 2:
            if self.reward[REWARD_METRICS[0]] >= self.reward[REWARD_METRICS[1]]:
                alpha = c.max_alpha
        return alpha


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
    schedule: RolloutAllocationSchedule,
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
    for c in choices:
        if c not in (ACTOR, FIXED):
            raise ValueError(f"schedule {schedule.name!r} returned {c!r}, not 'actor' or 'fixed'")
    return [
        ACTOR if c == ACTOR else labels[pick_fixed(weights, schedule.seed, *k)]
        for c, k in zip(choices, keys, strict=True)
    ]
