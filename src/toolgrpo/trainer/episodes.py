"""The trainer's multi-turn rollout stage: tasks → episodes (played concurrently) → a batch."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import Generator, SamplingParams
from toolgrpo.rollout.multi_turn import Condition, EpisodeLimits, play_tasks
from toolgrpo.rollout.rollback import (
    RollbackPolicy,
    check_negative_reward,
    check_snapshot_support,
)
from toolgrpo.trainer.batch import Batch, collate_episodes


class NonFiniteReward(ValueError):
    """A reward came back NaN/inf with ``reward.nan_policy=error``."""


def make_router(cfg: TrainConfig, flags: RllaFlags) -> EnvRouter:
    """The config's environments; RLLA tasks get the run's reward flags."""
    specs: dict[str, Any] = {"rlla": {"flags": asdict(flags)}}
    for task_type, spec in cfg.actor_rollout_ref.rollout.multi_turn.envs.items():
        merged = dict(specs.get(task_type, {}))
        merged.update(dict(spec or {}))
        specs[task_type] = merged
    return EnvRouter(specs)


def episode_limits(cfg: TrainConfig) -> EpisodeLimits:
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    return EpisodeLimits(
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.data.max_response_length,
        max_tokens_per_turn=mt.max_tokens_per_turn,
        max_tool_response_length=mt.max_tool_response_length,
        tool_response_truncate_side=mt.tool_response_truncate_side,
        error_reward=mt.error_reward,
    )


class EpisodeRunner:
    def __init__(
        self, cfg: TrainConfig, generator: Generator, tokenizer: Any, router: EnvRouter
    ) -> None:
        self.cfg = cfg
        self.generator = generator
        self.tokenizer = tokenizer
        self.router = router
        self.limits = episode_limits(cfg)
        self.rollback = RollbackPolicy.from_config(cfg.actor_rollout_ref.rollout.multi_turn)

    def check(self, tasks: Sequence[Task]) -> None:
        """At startup: an environment for every task type, and one that can snapshot its state
        for every type that runs tools when rollback is on; when negatives are kept, a
        ``negative_reward`` no higher than any environment's lowest reward."""
        self.router.check({t.task_type for t in tasks})
        if self.rollback is not None:
            check_snapshot_support(self.router, tasks)
            rb = self.rollback
            if rb.save_negatives and rb.max_negatives_per_group > 0:
                check_negative_reward(self.router, tasks, rb.negative_reward)

    def play(
        self,
        tasks: Sequence[Task],
        params: SamplingParams,
        step: int,
        policy_version: int,
        generator: Generator | None = None,
        rollback: bool = True,
        conditions: Sequence[Condition | None] | None = None,
    ) -> list[Episode]:
        """``params.n`` episodes per task, grouped by task; generation batched across them.
        ``rollback=False`` (validation) plays the policy as is, even with rollback configured;
        ``conditions`` rewrite each episode's opening prompt (the router's routes)."""
        mt = self.cfg.actor_rollout_ref.rollout.multi_turn
        batcher = GenerationBatcher(
            generator or self.generator,
            params,
            self.cfg.actor_rollout_ref.rollout.generation_batch_size,
        )
        try:
            return asyncio.run(
                play_tasks(
                    tasks,
                    params.n,
                    self.router,
                    batcher,
                    self.tokenizer,
                    self.limits,
                    step=step,
                    policy_version=policy_version,
                    max_concurrent=mt.max_concurrent_episodes,
                    rollback=self.rollback if rollback else None,
                    conditions=conditions,
                )
            )
        finally:
            batcher.close()

    def to_batch(self, episodes: Sequence[Episode]) -> tuple[Batch, int]:
        """The training batch, with non-finite rewards handled per ``reward.nan_policy``; the
        episodes' negative samples (if kept) follow as extra rows scored ``negative_reward``."""
        bad = 0
        for e in episodes:
            if not math.isfinite(e.reward):
                if self.cfg.reward.nan_policy == "error":
                    raise NonFiniteReward(f"non-finite reward {e.reward} for task {e.task_id}")
                bad += 1
                e.reward = 0.0
        negatives = self.rollback is not None and self.rollback.save_negatives
        batch = collate_episodes(episodes, self.tokenizer.pad_token_id, negatives)
        scores = [e.reward for e in episodes]
        if self.rollback is not None:
            scores += [self.rollback.negative_reward] * (batch.size - len(episodes))
        batch.scores_B = torch.tensor(scores, dtype=torch.float32)
        return batch, bad
