"""Whose log-probs are PPO's old ones, and the correction of the sampler/trainer mismatch
(``algorithm.rollout_correction``; the tensor maths is in ``toolgrpo.algos.mismatch``).

Three sources of π_old:
- ``rollout`` (``bypass_mode=true``, and asynchronous batches): the sampler's log-probs. PPO's
  ratio π_θ/π_rollout then carries the mismatch (and any staleness) and its clip bounds it.
- ``update``: the trainer's log-probs, read off the update's own first pass. When the update is
  one pass over one mini-batch, that pass runs at θ_old, so this is the recomputed π_old exactly,
  at no extra cost; the truncated weights min(π_old/π_rollout, C) are applied in the same pass.
- ``trainer``: a separate no-grad pass before the update (several mini-batches or epochs, or
  something that reads π_old before the update: GAE values, KL, the mixture's weights).

The mismatch is measured in every mode: on the whole batch with ``trainer`` and ``update``, on
the update's first mini-batch with ``rollout`` (the only pass that runs at θ_old; for
asynchronous batches it then includes their staleness).

With top-k / top-p sampling the sampler's log-probs are those of the truncated distribution q it
drew from, so the weights are π_old/q (the kept mass, ≤ 1: the importance correction for drawing
from q) and the mismatch metrics include the truncation, not only the kernels.
"""

from __future__ import annotations

import torch

from toolgrpo.algos.mismatch import mismatch_metrics, rollout_is_stats, rollout_is_weights
from toolgrpo.config.schema import TrainConfig
from toolgrpo.mixture.schedule import ACTOR
from toolgrpo.trainer.batch import Batch


def old_logprob_source(cfg: TrainConfig, behaviour: bool, reads_old_first: bool) -> str:
    """``rollout``, ``update`` or ``trainer`` (above). ``reads_old_first``: something needs π_old
    before the update runs (the reference KL metric, the mixture's weights)."""
    alg = cfg.algorithm
    if behaviour or alg.rollout_correction.bypass_mode:
        return "rollout"
    a = cfg.actor_rollout_ref.actor
    one_pass = a.ppo_epochs == 1 and a.ppo_mini_batch_size >= cfg.data.train_batch_size
    # LoRA dropout makes the update's pass (train mode) a noisy draw of π_old, not π_old itself
    exact = one_pass and cfg.actor_rollout_ref.model.lora_dropout == 0
    before = reads_old_first or alg.adv_estimator == "gae" or alg.use_kl_in_reward
    return "update" if exact and not before else "trainer"


def actor_tokens(batch: Batch) -> torch.Tensor:
    """``response_mask`` on the rows the actor sampled (a fixed policy's rows are the mixture's)."""
    if not batch.policies:
        return batch.response_mask_BR
    actor_B = torch.tensor([p == ACTOR for p in batch.policies], dtype=batch.response_mask_BR.dtype)
    return batch.response_mask_BR * actor_B.unsqueeze(-1)


def clip_band(cfg: TrainConfig) -> tuple[float, float]:
    """PPO's (ε_low, ε_high): ``clip_ratio_low`` / ``_high``, each defaulting to ``clip_ratio``."""
    a = cfg.actor_rollout_ref.actor
    low = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
    high = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
    return low, high


def measure(
    cfg: TrainConfig,
    trainer_lp_BR: torch.Tensor,
    batch: Batch,
    rows_B: torch.Tensor | None = None,
) -> dict[str, float]:
    """Mismatch metrics of the actor's tokens (``rows_B``: only these rows were measured), and,
    when π_old is the trainer's (``batch.old_source`` not ``rollout``), the weights' statistics."""
    mask = actor_tokens(batch)
    if rows_B is not None:
        mask = mask * rows_B.to(mask.dtype).unsqueeze(-1)
    out = mismatch_metrics(trainer_lp_BR, batch.rollout_logprobs_BR, mask, *clip_band(cfg))
    rc = cfg.algorithm.rollout_correction
    if rc.rollout_is and batch.old_source != "rollout":
        w = rollout_is_weights(
            trainer_lp_BR, batch.rollout_logprobs_BR, mask, rc.rollout_is, rc.rollout_is_threshold
        )
        out.update(rollout_is_stats(w, mask, rc.rollout_is_threshold))
    return out


def weight_actor_rows(cfg: TrainConfig, batch: Batch) -> None:
    """With π_old recomputed by the trainer (``trainer`` source), multiply the actor's tokens'
    loss weights by min(π_old/π_rollout, C); a fixed policy's rows keep the mixture's weights."""
    rc = cfg.algorithm.rollout_correction
    if not rc.rollout_is or batch.old_logprobs_BR is None:
        return
    w = rollout_is_weights(
        batch.old_logprobs_BR,
        batch.rollout_logprobs_BR,
        actor_tokens(batch),
        rc.rollout_is,
        rc.rollout_is_threshold,
    )
    batch.is_weights_BR = w if batch.is_weights_BR is None else batch.is_weights_BR * w


def update_pass_weights(
    cfg: TrainConfig, old_lp_BT: torch.Tensor, rollout_lp_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor | None:
    """The ``update`` source's weights for one micro-batch, from the pass's own log-probs."""
    rc = cfg.algorithm.rollout_correction
    if not rc.rollout_is:
        return None
    return rollout_is_weights(
        old_lp_BT, rollout_lp_BT, mask_BT, rc.rollout_is, rc.rollout_is_threshold
    )
