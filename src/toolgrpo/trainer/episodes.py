"""The trainer's multi-turn rollout stage: tasks → episodes (played concurrently) → a batch."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.envs.schema_augment import augment, episode_rng
from toolgrpo.rewards.scoring import finite_in_float32
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.episode import EnvFailureError, Episode
from toolgrpo.rollout.generator import Generator, SamplingParams
from toolgrpo.rollout.multi_turn import Condition, EpisodeLimits, play_tasks
from toolgrpo.rollout.rollback import (
    RollbackPolicy,
    check_negative_reward,
    check_snapshot_support,
)
from toolgrpo.trainer.batch import Batch, collate_episodes

log = logging.getLogger(__name__)
# Estimators that rank an episode against its group: one left alone there has no baseline.
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "grpo_split")


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
        env_call_timeout_s=mt.env_call_timeout_s,
        env_episode_timeout_s=mt.env_episode_timeout_s,
        tool_format=mt.format,
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
        for every type that runs tools when rollback retries; when negatives are kept, a
        ``negative_reward`` no higher than any environment's lowest reward."""
        types = {t.task_type for t in tasks}
        self.router.check(types)
        aug = self.cfg.actor_rollout_ref.rollout.multi_turn.schema_augmentation
        unknown = sorted(set(aug.task_types) - types) if aug.enable else []
        if unknown:
            raise EnvConfigError(
                f"multi_turn.schema_augmentation.task_types names {', '.join(unknown)}, which no "
                f"task of the data has (its task types: {', '.join(sorted(types))})"
            )
        rb = self.rollback
        if rb is None:
            return
        check_snapshot_support(self.router, tasks, rb.mode)  # retry and fission restore states
        if rb.keeps_negatives:
            check_negative_reward(self.router, tasks, rb.negative_reward)
        if not rb.save_negatives and rb.mode != "fission":
            log.warning(
                "tool rollback with save_negative_samples=false erases every retried failure: "
                "the failing calls are never trained against, and reward/* sees only repairs "
                "(docs/multi_turn.md, 'Tool-call rollback'); reward/first_try_mean and "
                "rollback/erased show what is hidden"
            )

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
        ``rollback=False`` (validation) plays the policy as is, even with rollback or schema
        augmentation configured;
        ``conditions`` rewrite each episode's opening prompt (the router's routes)."""
        mt = self.cfg.actor_rollout_ref.rollout.multi_turn
        router = self.training_router(step) if rollback else self.router
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
                    router,
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

    def training_router(self, step: int) -> EnvRouter:
        """The router of training episodes: with ``multi_turn.schema_augmentation``, a share of
        the tasks (drawn per task and step: a whole group alike) offer renamed tools."""
        aug = self.cfg.actor_rollout_ref.rollout.multi_turn.schema_augmentation
        if not aug.enable:
            return self.router
        seed, types = self.cfg.trainer.seed, set(aug.task_types)

        def hook(task: Task, env: Env) -> Env:
            if types and task.task_type not in types:
                return env
            rng = episode_rng(seed, step, task.task_id)
            return augment(env, rng) if rng.random() < aug.prob else env

        return self.router.with_hook(hook)

    def trainable(self, episodes: Sequence[Episode], step: int = 0) -> list[int]:
        """Indices of the episodes that train, after the step's environment failures are
        reported: a failed episode is dropped (with its negatives), and so is one that failures
        left alone in its group (no baseline under a group estimator). Raises
        ``EnvFailureError`` when more than ``max_env_failure_ratio`` of them failed."""
        failed = [e for e in episodes if e.env_failure is not None]
        if failed:
            warn_env_failures(failed, self.router, step)
            ratio = self.cfg.actor_rollout_ref.rollout.multi_turn.max_env_failure_ratio
            if len(failed) > ratio * len(episodes):
                raise EnvFailureError(
                    f"step {step}: {len(failed)} of {len(episodes)} episodes failed in their "
                    f"environment (more than actor_rollout_ref.rollout.multi_turn."
                    f"max_env_failure_ratio={ratio:g}); {failure_summary(failed, self.router)}"
                )
        grouped = self.cfg.algorithm.adv_estimator in GROUP_ESTIMATORS
        return trainable_indices(episodes, grouped)

    def to_batch(self, episodes: Sequence[Episode]) -> tuple[Batch, int]:
        """The training batch, with non-finite rewards handled per ``reward.nan_policy``; the
        episodes' negative samples (if kept) follow as extra rows scored ``negative_reward``,
        then fission's continuations (``Episode.forks``) under their own rewards.
        ``batch.truncated`` marks the truncated episodes' rows (``mask_truncated_rows``)."""
        bad = 0
        forks = [f for e in episodes for f in e.forks]
        for e in [*episodes, *forks]:
            if not finite_in_float32(e.reward):  # checked as the scores tensor will hold it
                if self.cfg.reward.nan_policy == "error":
                    raise NonFiniteReward(
                        f"non-finite reward {e.reward} (in float32, the training dtype) for "
                        f"task {e.task_id!r}"
                    )
                bad += 1
                e.reward = 0.0
        negatives = self.rollback is not None and self.rollback.save_negatives
        batch = collate_episodes(episodes, self.tokenizer.pad_token_id, negatives)
        negs = batch.size - len(episodes) - len(forks)
        worst = self.rollback.negative_reward if self.rollback is not None else 0.0
        scores = [e.reward for e in episodes] + [worst] * negs + [f.reward for f in forks]
        batch.scores_B = torch.tensor(scores, dtype=torch.float32)
        truncated = [e.truncated for e in episodes] + [False] * negs
        batch.truncated = truncated + [f.truncated for f in forks]
        return batch, bad


def mask_truncated_rows(batch: Batch) -> torch.Tensor | None:
    """DAPO's overlong filtering (``multi_turn.mask_truncated``), for the update only: the rows
    of truncated episodes get a zero response mask, after their scores have set their groups'
    baselines (``compute_advantages``), so they stay in the baseline and train no token. Returns
    the full mask to put back after the update (what the step's metrics describe), or None."""
    rows = [i for i, t in enumerate(batch.truncated) if t]
    if not rows:
        return None
    full = batch.response_mask_BR
    batch.response_mask_BR = full.clone()
    batch.response_mask_BR[rows] = 0.0
    return full


def trainable_indices(episodes: Sequence[Episode], grouped: bool) -> list[int]:
    """Episodes whose environment did not fail; with ``grouped``, minus any that failures left
    as the only member of a group that had more (a singleton's GRPO advantage is its raw score)."""
    size: Counter[str] = Counter(e.uid for e in episodes)
    ok = [i for i, e in enumerate(episodes) if e.env_failure is None]
    left: Counter[str] = Counter(episodes[i].uid for i in ok)
    if not grouped:
        return ok
    return [i for i in ok if not (left[episodes[i].uid] == 1 and size[episodes[i].uid] > 1)]


def _env_label(task_type: str, router: EnvRouter) -> str:
    try:
        env_type = router.spec(task_type).type
    except Exception:  # an unknown type is itself the failure the reason names
        return f"task type {task_type!r}"
    if env_type == task_type:
        return f"environment {env_type!r}"
    return f"task type {task_type!r} (environment {env_type!r})"


def warn_env_failures(failed: Sequence[Episode], router: EnvRouter, step: int) -> None:
    """One warning per distinct (task type, reason) in the step, not one per episode."""
    counts = Counter((e.task_type, e.env_failure) for e in failed)
    for (task_type, reason), k in sorted(counts.items(), key=lambda kv: -kv[1]):
        log.warning(
            "step %d: %d episode(s) of %s failed in the environment: %s",
            step,
            k,
            _env_label(task_type, router),
            reason,
        )


def failure_summary(failed: Sequence[Episode], router: EnvRouter) -> str:
    """The most common failure, as '<environment>: <reason>' (for the one-line error)."""
    (task_type, reason), k = Counter((e.task_type, e.env_failure) for e in failed).most_common(1)[0]
    return f"{_env_label(task_type, router)}, {k} episode(s): {reason}"


def stand_in_rewards(episodes: Sequence[Episode]) -> list[float]:
    """Episode rewards for consumers that need one per episode (the tool router): a failed
    episode gets the mean of its group's others (0 if none), so it moves no baseline."""
    by_uid: dict[str, list[float]] = {}
    for e in episodes:
        if e.env_failure is None:
            by_uid.setdefault(e.uid, []).append(e.reward)
    out = []
    for e in episodes:
        others = by_uid.get(e.uid, [])
        if e.env_failure is None:
            out.append(e.reward)
        else:
            out.append(math.fsum(others) / len(others) if others else 0.0)
    return out
