"""The mixture of rollout policies' sections (the design's ``rollout_only`` and
``rollout_allocation_schedule``, toolgrpo.mixture). Re-exported by ``toolgrpo.config.schema``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FixedPolicyConfig", "RolloutAllocationScheduleConfig", "RolloutOnlyConfig"]


@dataclass
class RolloutAllocationScheduleConfig:
    """Top-level ``rollout_allocation_schedule`` (the design's keys): how often the actor samples
    (α) rather than a fixed policy; see ``toolgrpo.mixture.schedule``. Used with rollout_only."""

    type: str = "constant"  # constant | linear | exponential | step | adaptive | a registered name
    alpha: float = 0.5  # constant: P(actor samples a step or group); adaptive: the starting α
    alpha_0: float = 0.0  # linear: α = alpha_0 + beta * step, capped at max_alpha
    beta: float = 0.05
    max_alpha: float = 1.0  # cap for linear, exponential and adaptive
    gamma: float = 0.1  # exponential: α = 1 - exp(-gamma * step)
    switch_steps: list[int] = field(default_factory=list)  # step: the policy flips at each
    initial_policy: str = "fixed"  # step: who samples before the first switch (actor | fixed)
    seed: int | None = None  # None = trainer.seed
    per_sample: bool = False  # False: one policy per step; True: one per prompt group
    # whole: a group is sampled by one policy. mixed (beyond the design): a draw of "fixed" adds
    # fixed_per_group fixed samples to the actor's group of n; GRPO ranks all n + k together.
    groups: str = "whole"  # whole | mixed
    fixed_per_group: int = 1  # k, with groups=mixed
    # adaptive: α rises from alpha toward max_alpha as the fixed rows' sequence ESS falls, and
    # jumps to max_alpha once the actor's rollout reward reaches the fixed policy's.
    signal: str = "ess"  # adaptive: ess | reward | ess_or_reward
    ema: float = 0.5  # adaptive: weight of the newest observation in the running averages
    params: dict[str, Any] = field(default_factory=dict)  # a user schedule's own settings


@dataclass
class FixedPolicyConfig:
    """One more fixed policy; unset fields take ``rollout_only``'s value, then the actor's."""

    model_path: str = ""
    adapter_path: str = ""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    weight: float = 1.0  # share among fixed policies when a fixed policy samples


@dataclass
class RolloutOnlyConfig:
    """A fixed (frozen) policy that shares rollout duty with the actor, corrected by importance
    sampling. Off unless ``model_path`` is set; unset (None) sampling fields inherit
    ``actor_rollout_ref.rollout``'s."""

    model_path: str = ""  # HF dir, .gguf file, or alias, like actor_rollout_ref.model.path
    adapter_path: str = ""  # a LoRA adapter on top of it
    dtype: str | None = None  # None = actor_rollout_ref.model.dtype
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    generation_batch_size: int | None = None
    weight: float = 1.0  # share of this policy among the fixed ones
    extra_policies: list[FixedPolicyConfig] = field(default_factory=list)
    # The IS estimator for fixed rows (verl's rollout-correction vocabulary; toolgrpo.mixture.
    # correction). false: decoupled PPO, clipped around the actor's own old log-probs, times a
    # truncated weight min(π_old/π_fixed, C). true: the design's literal method, π_fixed as the PPO
    # old log-probs (biased: see docs/mixture.md).
    bypass_mode: bool = False
    rollout_is: str = "sequence"  # decoupled weight level: sequence | token
    rollout_is_threshold: float | None = 2.0  # C; null = untruncated
    # is: the estimator above. shaped (beyond the design): LUFFY's −A·f(r), f(r) = r/(r + γ),
    # unclipped, r = π/π_fixed (shaping_ratio=ratio) or π (prob: LUFFY's, π_fixed taken as 1).
    fixed_loss: str = "is"  # is | shaped
    shaping_gamma: float = 0.1
    shaping_ratio: str = "ratio"  # ratio | prob
    # f times (1 + γ)²/γ: weight 1 where the actor agrees with the fixed policy (r = 1), as an
    # on-policy token has; LUFFY's own f (false) gives fixed tokens at most 1/4 of that.
    shaping_normalize: bool = False
    # Beyond the design, what else the update does with fixed rows (toolgrpo.mixture.objective).
    # fixed_kl_loss: the KL-to-reference loss (actor.use_kl_loss) covers fixed rows too (true) or
    # the actor's rows only (false: no pull of the fixed policy's tokens back to the reference).
    fixed_kl_loss: bool = True
    # guided (SRFT/ReLIFT-style): + guided_coef × NLL of the fixed rows scoring >= guided_min_score
    # (a fixed policy's successes), aggregated like the policy loss; 0 = off.
    guided_coef: float = 0.0
    guided_min_score: float = 1.0  # the built-in environments' full marks
    offload: bool = False  # load the fixed model only for the steps that use it, free it after
