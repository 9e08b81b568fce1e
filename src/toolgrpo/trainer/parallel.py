"""The loop's hooks for a sharded update (``trainer.distributed.strategy=fsdp2``).

Rank 0 keeps one unsharded copy of the policy: it samples with it (HF), pushes it onward to vLLM
or Ray workers, and saves it in checkpoints. After every update the shards are gathered into it
one parameter at a time. Other ranks hold shards only and never sample, log or write.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from toolgrpo.config.loader import to_yaml
from toolgrpo.distributed.fsdp import Ranks, gather_into
from toolgrpo.models.loading import Policy
from toolgrpo.rollout.backends import sync_weights
from toolgrpo.trainer.run_dir import write_text
from toolgrpo.trainer.summary import startup_lines
from toolgrpo.trainer.tracking import Tracker

if TYPE_CHECKING:
    from toolgrpo.trainer.actor import Actor
    from toolgrpo.trainer.trainer import Trainer


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


def push_weights(trainer: Trainer, version: int) -> None:
    """After an update (or a resume): shards into rank 0's copy, then that copy to backends
    holding their own (vLLM, Ray workers); a no-op for HF sampling in one process."""
    refresh_rollout_copy(trainer.actor, trainer.policy, trainer.ranks)
    sync_weights(trainer.pool or trainer.generator, trainer.policy.model, version)


def open_tracker(trainer: Trainer) -> Tracker | NullTracker:
    """Rank 0 writes the run's config and metrics; other ranks get a tracker that drops them."""
    if not trainer.ranks.main:
        return NullTracker()
    write_text(trainer.out / "config.yaml", to_yaml(trainer.cfg))  # never through a link
    tracker = Tracker.for_run(trainer.cfg, trainer.out, trainer.total_steps, trainer.step)
    for line in startup_lines(trainer):  # what runs, where its outputs and logs go
        tracker.console.print(line, soft_wrap=True, markup=False, highlight=False)
    return tracker


class NullTracker:
    """What ranks other than 0 log: nothing."""

    def begin_step(self, step: int) -> None:
        pass

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass
