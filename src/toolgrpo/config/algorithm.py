"""The ``algorithm`` section: advantage estimator, KL in the reward and its controller, the
rollout/trainer mismatch correction and dynamic sampling (verl's names). Re-exported by
``toolgrpo.config.schema``."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["AlgorithmConfig", "FilterGroupsConfig", "KLCtrlConfig", "RolloutCorrectionConfig"]


@dataclass
class KLCtrlConfig:
    type: str = "fixed"  # "fixed" | "adaptive"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class RolloutCorrectionConfig:
    """verl's ``algorithm.rollout_correction``: the sampler's log-probs (vLLM, or ``generate``
    with a KV cache) are not the trainer's. Decoupled (default): π_old is the trainer's own
    log-prob (free when the update is one exactly on-policy pass, else one extra forward) and
    each of the actor's tokens is weighted by min(π_old/π_rollout, C). Bypass: the sampler's
    log-probs are π_old, so PPO's ratio and clip absorb the mismatch. The mismatch is logged
    either way (``rollout/logprob_diff_*``, ``rollout/mismatch_*``)."""

    bypass_mode: bool = False
    rollout_is: str | None = "token"  # token | sequence | null (no weights, π_old still trainer's)
    rollout_is_threshold: float | None = 2.0  # C; null = untruncated


@dataclass
class FilterGroupsConfig:
    """verl's ``algorithm.filter_groups``, DAPO's dynamic sampling: a group whose samples all
    score the same gives GRPO no gradient, so the step keeps only groups whose ``metric``
    differs and samples further batches of ``data.train_batch_size`` tasks until
    ``train_batch_size`` such groups are in, or ``max_num_gen_batches`` batches were sampled
    (then it trains on the groups it has; <= 0: no limit, as in verl)."""

    enable: bool = False
    metric: str = "score"  # the row's task reward, what the group estimator normalises
    max_num_gen_batches: int = 4


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # grpo | dr_grpo | rloo | gae | grpo_split (mixed groups)
    norm_adv_by_std_in_grpo: bool = True
    gamma: float = 1.0
    lam: float = 1.0
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
