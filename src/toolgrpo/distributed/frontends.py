"""What the trainer holds in Ray mode: a ``Generator`` per policy (the actor's, and one per fixed
policy of a mixture) and an ``EpisodeRunner``, whose work runs on the pool's workers. The
trainer's code paths (single-turn rollouts, the router's rollouts, validation, multi-turn
episodes, the mixture's parts) stay the same as with a local backend. They see the pool only
through ``Pool``, what they call of it, so this module does not import ``pool`` (which builds
them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from toolgrpo.data.task import Task
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import Completion, Generator, SamplingParams
from toolgrpo.rollout.multi_turn import Condition
from toolgrpo.trainer.episodes import EpisodeRunner


class Pool(Protocol):
    """What the frontends call of ``pool.RolloutPool``."""

    cfg: Any
    generator: Generator
    eos_ids: list[int]

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, policy: str | None = None
    ) -> list[Completion]: ...

    def play(
        self,
        tasks: Sequence[Task],
        params: SamplingParams,
        step: int,
        policy_version: int,
        rollback: bool = True,
        conditions: Sequence[Condition | None] | None = None,
        policy: str | None = None,
    ) -> list[Episode]: ...


class PoolGenerator:
    """``generate`` split across the workers: n completions per prompt, grouped by prompt in
    prompt order, as every local backend returns them. ``policy``: the fixed policy that samples
    (its label), None for the actor."""

    def __init__(self, pool: Pool, policy: str | None = None) -> None:
        self.pool = pool
        self.policy = policy
        self.eos_ids = list(pool.eos_ids)  # fixed policies share the actor's tokenizer

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        return self.pool.generate(prompts, params, self.policy)


class PoolEpisodeRunner(EpisodeRunner):
    """Episodes played on the workers, each with its own environments; the driver keeps its
    router for the startup checks, and collates the returned episodes into the batch."""

    def __init__(self, pool: Pool, tokenizer: Any, router: Any) -> None:
        super().__init__(pool.cfg, pool.generator, tokenizer, router)
        self.pool = pool

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
        policy = None
        if isinstance(generator, PoolGenerator) and generator.pool is self.pool:
            policy = generator.policy  # a fixed policy's episodes, played by the workers too
        elif generator is not None and generator is not self.generator:
            # A generator that lives in this process: play here, as locally.
            return super().play(
                tasks, params, step, policy_version, generator, rollback, conditions
            )
        return self.pool.play(tasks, params, step, policy_version, rollback, conditions, policy)
