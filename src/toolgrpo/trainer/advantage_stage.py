"""The middle of a step, between rollout and update: PPO's old log-probs, reference log-probs
and values (``prepare_old_and_ref``), then token rewards and advantages (``compute_advantages``).

Both take what they read (the config, the actor, the mixture, the KL controller, the router)
and write their results into the batch; the loop (``trainer/trainer.py``) only calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgrpo.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
    token_level_rewards,
)
from toolgrpo.algos import compute_advantages as estimate_advantages
from toolgrpo.algos.utils import masked_mean
from toolgrpo.config.algorithm import AlgorithmConfig
from toolgrpo.config.schema import TrainConfig
from toolgrpo.mixture.schedule import ACTOR
from toolgrpo.trainer import rollout_correction
from toolgrpo.trainer.batch import Batch
from toolgrpo.trainer.metrics import negative_metrics

if TYPE_CHECKING:
    from toolgrpo.mixture import Mixture
    from toolgrpo.router.lm_price import LmPrice
    from toolgrpo.trainer.actor import Actor

KLController = FixedKLController | AdaptiveKLController


def prepare_old_and_ref(
    batch: Batch,
    cfg: TrainConfig,
    actor: Actor,
    mixture: Mixture | None = None,
    behaviour: bool = False,
) -> dict[str, float]:
    """PPO's old log-probs (``trainer/rollout_correction.py``: the sampler's in bypass mode
    and for asynchronous batches, else the trainer's, read off the update's own pass when
    that is exact, else recomputed here), reference log-probs when KL is on, and values
    for GAE. ``batch.old_source`` says which; the update measures the mismatch unless it
    was measured here."""
    gae = cfg.algorithm.adv_estimator == "gae"
    source = rollout_correction.old_logprob_source(cfg, behaviour, mixture is not None)
    batch.old_source = source
    metrics: dict[str, float] = {
        "actor/old_logprob_reused": float(source == "rollout"),
        "actor/old_logprob_in_update": float(source == "update"),
    }
    if source == "trainer":
        batch.old_logprobs_BR, batch.old_values_BR = actor.compute_logprobs(batch, with_values=gae)
        metrics.update(rollout_correction.measure(cfg, batch.old_logprobs_BR, batch))
    else:
        # "update": None tells the actor to take π_old from its own first pass
        batch.old_logprobs_BR = batch.rollout_logprobs_BR if source == "rollout" else None
        if gae:
            _, batch.old_values_BR = actor.compute_logprobs(batch, with_values=True)
    if mixture is not None:  # fixed-policy rows: the IS denominator is their sampler
        recomputed = source == "trainer"
        metrics.update(mixture.correct(batch, actor, recomputed=recomputed))
    if source == "trainer":  # the actor's rows: min(π_old/π_rollout, C)
        rollout_correction.weight_actor_rows(cfg, batch)
    if actor.needs_ref:
        a = cfg.actor_rollout_ref.actor
        batch.ref_logprobs_BR, _ = actor.compute_logprobs(batch, reference=True)
        # the metric only: with π_old still to come from the update, the sampler's stand in
        old = batch.old_logprobs_BR if source != "update" else batch.rollout_logprobs_BR
        kl = kl_penalty(old, batch.ref_logprobs_BR, a.kl_loss_type)
        metrics["actor/kl"] = float(masked_mean(kl, batch.response_mask_BR))
    else:
        metrics["actor/kl"] = 0.0  # no reference policy: KL is off
    return metrics


def compute_advantages(
    batch: Batch,
    alg: AlgorithmConfig,
    kl_ctrl: KLController | None,
    price: LmPrice | None = None,
) -> dict[str, float]:
    """Token rewards (with KL-in-reward, which steps ``kl_ctrl``), then the advantages and
    returns of ``algorithm.adv_estimator``; rolled-back negatives stay out of the baselines.
    With the router, the LM's scores and advantages carry the step's λ·cost (``price``, built
    where the routes were sampled) as ``router.lm_reward`` and ``router.lagrangian`` say."""
    scores_B = price.scores(batch.scores_B) if price is not None else batch.scores_B
    token_rewards = token_level_rewards(scores_B, batch.response_mask_BR)
    metrics: dict[str, float] = {}
    if alg.use_kl_in_reward:
        assert kl_ctrl is not None
        token_rewards, kl = apply_kl_in_reward(
            token_rewards,
            batch.old_logprobs_BR,
            batch.ref_logprobs_BR,
            batch.response_mask_BR,
            kl_ctrl.value,
            alg.kl_penalty,
        )
        metrics["actor/reward_kl_penalty_coeff"] = kl_ctrl.value
        kl_ctrl.update(kl, batch.size)
    batch.advantages_BR, batch.returns_BR = estimate_advantages(
        alg.adv_estimator,
        scores_B=token_rewards.sum(-1),
        response_mask_BT=batch.response_mask_BR,
        uids=batch.uids,
        token_rewards_BT=token_rewards,
        values_BT=batch.old_values_BR,
        gamma=alg.gamma,
        lam=alg.lam,
        norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo,
        is_negative_B=batch.is_negative,  # rolled-back attempts stay out of the baselines
        on_policy_B=[p == ACTOR for p in batch.policies],  # a mixture's actor rows (grpo_split)
    )
    if price is not None:  # router.lagrangian=price|advantage: A − λ·cost term
        metrics.update(price.advantages(batch))
    metrics.update(negative_metrics(batch))
    return metrics
