"""Mixture of rollout policies: a fixed policy shares rollout duty with the actor, and importance
sampling keeps the policy gradient about the actor: E_π[r] = E_fixed[(π/π_fixed)·r].

Config (``rollout_only``; off unless ``model_path`` is set, so existing configs are unchanged)::

    rollout_only:
      model_path: smollm2-135m     # what actor_rollout_ref.model.path accepts; frozen, no optimizer
      adapter_path: ""             # optional LoRA adapter on top of it
      temperature: 0.8             # unset (null) sampling fields inherit actor_rollout_ref.rollout:
      top_p: null                  #   temperature, top_p, top_k, generation_batch_size; n and
      top_k: null                  #   max_response_length are always the actor's
      weight: 1.0                  # share among the fixed policies when a fixed policy samples
      extra_policies:              # more fixed policies; unset fields take rollout_only's values,
        - {temperature: 1.2}       #   so this is the same model, loaded once, at temperature 1.2
        - {model_path: /ckpt/step_50/model, weight: 2.0}
      schedule: {type: constant, alpha: 0.5, per_sample: false, seed: null}
      is_correction: ppo_clip      # ppo_clip | tis_token | tis_seq (see mixture.correction)
      is_threshold: 2.0            # C in min(w, C) for tis_*
      offload: false               # load fixed models only for the steps that use them

The fixed policies must share the actor's tokenizer (vocabulary and special tokens), checked at
startup. Schedules (``mixture.schedule``) give α, the actor's probability per step; with
``per_sample`` each prompt group is drawn on its own. Rows carry their sampler in
``Batch.policies``; the old log-probs of fixed rows are the fixed policy's own sampling log-probs
(temperature and truncation included), never the actor's recomputed ones.
"""

from toolgrpo.mixture.correction import IS_CORRECTIONS, Correction, correct_fixed_rows
from toolgrpo.mixture.mixture import Mixture, RolloutPart
from toolgrpo.mixture.policies import FixedPolicies, FixedSpec, fixed_specs, tokenizer_mismatch
from toolgrpo.mixture.schedule import (
    ACTOR,
    FIXED,
    SCHEDULE_TYPES,
    Schedule,
    allocate,
    pick_fixed,
)

__all__ = [
    "ACTOR",
    "FIXED",
    "IS_CORRECTIONS",
    "SCHEDULE_TYPES",
    "Correction",
    "FixedPolicies",
    "FixedSpec",
    "Mixture",
    "RolloutPart",
    "Schedule",
    "allocate",
    "correct_fixed_rows",
    "fixed_specs",
    "pick_fixed",
    "tokenizer_mismatch",
]
