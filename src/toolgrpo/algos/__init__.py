"""Pure tensor functions for GRPO/PPO: advantages, KL, losses and masked reductions."""

from toolgrpo.algos.advantages import (
    apply_kl_in_reward,
    compute_advantages,
    compute_dr_grpo_advantages,
    compute_gae_advantages,
    compute_grpo_advantages,
    compute_rloo_advantages,
    get_adv_estimator,
    register_adv_estimator,
    token_level_rewards,
)
from toolgrpo.algos.grpo_split import compute_grpo_split_advantages
from toolgrpo.algos.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    get_kl_controller,
    kl_penalty,
)
from toolgrpo.algos.losses import (
    AGG_MODES,
    agg_loss,
    entropy_from_logits,
    get_policy_loss,
    kl_loss,
    ppo_policy_loss,
    register_policy_loss,
    value_loss,
)
from toolgrpo.algos.utils import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_in_reward",
    "compute_advantages",
    "compute_dr_grpo_advantages",
    "compute_gae_advantages",
    "compute_grpo_advantages",
    "compute_grpo_split_advantages",
    "compute_rloo_advantages",
    "entropy_from_logits",
    "get_adv_estimator",
    "get_kl_controller",
    "get_policy_loss",
    "kl_loss",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "ppo_policy_loss",
    "register_adv_estimator",
    "register_policy_loss",
    "token_level_rewards",
    "value_loss",
]
