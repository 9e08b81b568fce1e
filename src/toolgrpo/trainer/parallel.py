"""The loop's hooks for a sharded update (``trainer.distributed.strategy=fsdp2``).

Each rank that samples (every rank by default, ``trainer.distributed.rollout_ranks``) keeps one
unsharded copy of the policy: it samples with it (HF) or pushes it onward to its vLLM engine (or
rank 0's Ray workers); rank 0's copy is also the one checkpoints save. After every update the
shards are gathered into those copies one parameter at a time. Only rank 0 logs and writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolgrpo.config.loader import to_yaml
from toolgrpo.config.schema import TrainConfig
from toolgrpo.distributed.fsdp import Ranks, gather_into
from toolgrpo.distributed.sharded_load import actor_policy
from toolgrpo.models.loading import Policy
from toolgrpo.rollout.backends import sync_weights
from toolgrpo.trainer.run_dir import write_text
from toolgrpo.trainer.tracking import Tracker

__all__ = ["actor_policy", "open_tracker", "push_weights", "refresh_rollout_copy"]

if TYPE_CHECKING:
    from toolgrpo.trainer.actor import Actor


def refresh_rollout_copy(actor: Actor, policy: Policy, ranks: Ranks) -> None:
    """Gather the updated shards into the rollout copy of every rank that samples, one
    parameter at a time (a collective: every rank calls it)."""
    if actor.root is None:
        return
    gather_into(actor.root, policy.model if ranks.samples else None, only_trainable=True)


def push_weights(actor: Actor, policy: Policy, ranks: Ranks, backend: Any, version: int) -> None:
    """After an update (or a resume): shards into rank 0's copy, then that copy to a
    ``backend`` holding its own (vLLM, a Ray pool); a no-op for HF sampling in one process."""
    refresh_rollout_copy(actor, policy, ranks)
    sync_weights(backend, policy.model, version)


def open_tracker(
    ranks: Ranks,
    cfg: TrainConfig,
    out: Path,
    total_steps: int,
    step: int,
    startup: Sequence[str] = (),
) -> Tracker | NullTracker:
    """Rank 0 writes the run's config and metrics and prints ``startup`` (what runs, where its
    outputs and logs go); other ranks get a tracker that drops them."""
    if not ranks.main:
        return NullTracker()
    write_text(out / "config.yaml", to_yaml(cfg))  # never through a link
    tracker = Tracker.for_run(cfg, out, total_steps, step)
    for line in startup:
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
