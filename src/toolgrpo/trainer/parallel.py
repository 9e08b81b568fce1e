"""The loop's hooks for a sharded update (``trainer.distributed.strategy=fsdp2``).

Rank 0 keeps one unsharded copy of the policy: it samples with it (HF), pushes it onward to vLLM
or Ray workers, and saves it in checkpoints. After every update the shards are gathered into it
one parameter at a time. Other ranks hold shards only and never sample, log or write.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from toolgrpo.config.loader import ConfigError
from toolgrpo.distributed.fsdp import Ranks, gather_into
from toolgrpo.models.loading import Policy

if TYPE_CHECKING:
    from toolgrpo.trainer.actor import Actor


def check_strategy(cfg: Any) -> None:
    """Features whose code runs the policy outside the actor's collective passes are refused."""
    if cfg.trainer.distributed.strategy == "none":
        return
    refused = {
        "router.enable": cfg.router.enable,
        "async_training.enable": cfg.async_training.enable,
        "rollout_only.model_path": bool(cfg.rollout_only.model_path),
        "algorithm.adv_estimator=gae": cfg.algorithm.adv_estimator == "gae",
    }
    on = [k for k, v in refused.items() if v]
    if on:
        raise ConfigError(
            f"trainer.distributed.strategy={cfg.trainer.distributed.strategy} does not support "
            f"{', '.join(on)} yet; use strategy=none for them"
        )


def actor_policy(policy: Policy, ranks: Ranks) -> Policy:
    """The policy the actor shards: on rank 0 a copy (the original stays whole for rollouts and
    checkpoints), elsewhere the loaded one itself (sharding frees its full tensors)."""
    if ranks.sharded and ranks.main:
        return replace(policy, model=copy.deepcopy(policy.model))
    return policy


def refresh_rollout_copy(actor: Actor, policy: Policy, ranks: Ranks) -> None:
    """Gather the updated shards into rank 0's copy (a collective: every rank calls it)."""
    if actor.root is None:
        return
    gather_into(actor.root, policy.model if ranks.main else None, only_trainable=True)


class NullTracker:
    """What ranks other than 0 log: nothing."""

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass
