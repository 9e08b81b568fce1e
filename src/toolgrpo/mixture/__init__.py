"""Mixture of rollout policies: a fixed policy shares rollout duty with the actor, and importance
sampling keeps the policy gradient about the actor: E_π[r] = E_fixed[(π/π_fixed)·r].

Config (the design's keys; off unless ``rollout_only.model_path`` is set)::

    rollout_only:
      model_path: smollm2-135m     # what actor_rollout_ref.model.path accepts; frozen, no optimizer
      temperature: 0.8             # unset (null) sampling fields inherit actor_rollout_ref.rollout:
      top_p: null                  #   temperature, top_p, top_k, generation_batch_size; n and
      top_k: null                  #   max_response_length are always the actor's
      bypass_mode: false           # false: decoupled PPO + truncated IS (default); true: the
      rollout_is: sequence         #   design's literal π_fixed-as-old (biased, docs/mixture.md)
      rollout_is_threshold: 2.0    # C in min(π_old/π_fixed, C); null = untruncated
      fixed_loss: is               # is | shaped: LUFFY's −A·r/(r + γ) (beyond the design)
      shaping_gamma: 0.1           #   γ; shaping_ratio: ratio (π/π_fixed) | prob (π)
      shaping_normalize: false     #   f × (1 + γ)²/γ: weight 1 at r = 1, as on-policy tokens
      fixed_kl_loss: true          # false: actor.use_kl_loss's term skips fixed rows
      guided_coef: 0.0             # λ > 0: + λ·NLL on fixed rows scoring >= guided_min_score
      guided_min_score: 1.0        #   (SRFT/ReLIFT-style guidance, ``objective``)
      extra_policies: [...]        # more fixed policies (unset fields take rollout_only's)
    rollout_allocation_schedule:
      type: constant               # constant|linear|exponential|step|adaptive|module:Class
      alpha: 0.5
      groups: whole                # whole | mixed: k = fixed_per_group fixed samples join the
      fixed_per_group: 1           #   actor's group of n; GRPO over n + k (beyond the design)
    algorithm:
      adv_estimator: grpo_split    # LUFFY's: mixed groups' baseline over the actor's rows only

The fixed policies must share the actor's tokenizer (checked at startup) and sample on the
actor's backend (HF or vLLM). Rows carry their sampler in ``Batch.policies``; see
``correction`` for their old log-probs and weights, ``objective`` for the update's other terms
on them and their share of it, ``groups`` for mixed groups and ``schedule`` for the schedule API.
"""

from toolgrpo.mixture.correction import ROLLOUT_IS_LEVELS, Correction, correct_fixed_rows
from toolgrpo.mixture.mixture import Mixture, RolloutPart
from toolgrpo.mixture.policies import FixedPolicies, FixedSpec, fixed_specs, tokenizer_mismatch
from toolgrpo.mixture.schedule import (
    ACTOR,
    FIXED,
    SCHEDULES,
    RolloutAllocationSchedule,
    allocate,
    build_schedule,
    pick_fixed,
    register_schedule,
)

__all__ = [
    "ACTOR",
    "FIXED",
    "ROLLOUT_IS_LEVELS",
    "SCHEDULES",
    "Correction",
    "FixedPolicies",
    "FixedSpec",
    "Mixture",
    "RolloutPart",
    "RolloutAllocationSchedule",
    "allocate",
    "build_schedule",
    "correct_fixed_rows",
    "fixed_specs",
    "pick_fixed",
    "register_schedule",
    "tokenizer_mismatch",
]
