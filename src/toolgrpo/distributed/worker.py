"""One rollout worker: its own copy of the policy, a generator and the environments.

The class is plain Python; ``RolloutPool`` wraps it with ``ray.remote`` and runs each instance in
its own process, so this module imports (and its logic can be tested) without Ray. The worker
never trains: it loads the same model the trainer does (same dtypes, so its sampling log-probs
are the trainer's), then only ever receives versioned weights. With a mixture
(``rollout_only.model_path``) it also loads the run's fixed policies, frozen and never sent
weights, and samples them when a call names one.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.task import Task
from toolgrpo.distributed.chunks import WeightPayload
from toolgrpo.envs.pool import close_env_pools
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.backends import make_generator, sync_weights
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.multi_turn import Condition
from toolgrpo.tools.shared_pool import shutdown_shared_pool

FAULTS = ("exit", "hang", "raise")


@dataclass
class ChunkResult:
    """What a worker returns for one chunk of a call: its items (completions or episodes, in
    chunk order) and how long the work itself took, so the pool can tell Ray's overhead apart."""

    items: list[Any]
    compute_s: float
    version: int  # the weight version that produced the items
    worker: int


@dataclass(frozen=True)
class WorkerInfo:
    index: int
    pid: int
    version: int
    eos_ids: tuple[int, ...]
    load_s: float  # model, generator and environments, inside the worker
    fixed_loaded: int = 0  # fixed policies' models held now (0 with rollout_only.offload)


def seed_everything(seed: int) -> None:
    """Per call, so a chunk's samples depend on its seed only, not on which worker ran it or
    what that worker ran before."""
    torch.manual_seed(seed)
    random.seed(seed)


class RolloutWorker:
    def __init__(self, cfg: TrainConfig, index: int) -> None:
        # Imported here: the trainer imports this module, and a worker needs the heavy parts only.
        from toolgrpo.envs.plugins import load_plugins
        from toolgrpo.mixture.policies import FixedPolicies, fixed_specs
        from toolgrpo.models.loading import load_policy
        from toolgrpo.trainer.episodes import EpisodeRunner, make_router

        t0 = time.perf_counter()
        # A fresh process: the users' env modules the trainer imported (trainer.imports, made
        # absolute there, and installed entry points) register their types here too.
        load_plugins(cfg.trainer.imports)
        self.cfg = cfg
        self.index = index
        threads = max(1, int(cfg.trainer.distributed.num_cpus_per_worker))
        torch.set_num_threads(threads)
        torch.manual_seed(cfg.trainer.seed)
        # trainable=True: the trainer's weight dtypes (float32 masters for full fine-tuning), so
        # rollout log-probs can serve as the update's old log-probs, as they do locally.
        self.policy = load_policy(cfg.actor_rollout_ref.model)
        self.policy.model.requires_grad_(False)
        self.policy.model.eval()
        self.generator = make_generator(cfg, self.policy)
        # The mixture's fixed policies (a replacement worker loads them again here); the pool
        # checked their tokenizer and base before any worker started.
        self.fixed: FixedPolicies | None = None
        if cfg.rollout_only.model_path:
            self.fixed = FixedPolicies(
                fixed_specs(cfg),
                self.policy.tokenizer,
                cfg.actor_rollout_ref.model.path,
                cfg.rollout_only.offload,
                cfg,
                check=False,
            )
        self.runner = None
        if cfg.actor_rollout_ref.rollout.multi_turn.enable:
            flags = RllaFlags(**asdict(cfg.reward.rlla))
            router = make_router(cfg, flags)
            self.runner = EpisodeRunner(cfg, self.generator, self.policy.tokenizer, router)
        self._version = -1
        self._fault = ""
        eos = getattr(self.generator, "eos_ids", None) or [self.policy.tokenizer.eos_token_id]
        self._eos_ids = tuple(int(i) for i in eos)
        self._load_s = time.perf_counter() - t0

    # ---- control --------------------------------------------------------------------------
    def ping(self) -> WorkerInfo:
        fixed = self.fixed.loaded if self.fixed is not None else 0
        return WorkerInfo(
            self.index, os.getpid(), self._version, self._eos_ids, self._load_s, fixed
        )

    def version(self) -> int:
        return self._version

    def set_weights(self, version: int, weights: WeightPayload) -> int:
        """Load the trainer's tensors (all of them, or a LoRA policy's adapter only) and hand
        them on to a generator that keeps its own copy (vLLM)."""
        model = self.policy.model
        missing, unexpected = model.load_state_dict(weights.tensors(), strict=False)
        if unexpected:
            raise KeyError(f"worker {self.index}: unknown weights {sorted(unexpected)[:5]}")
        if missing and not self.policy.is_lora:
            raise KeyError(f"worker {self.index}: weights missing {sorted(missing)[:5]}")
        sync_weights(self.generator, model, version)
        self._version = version
        return version

    def inject_fault(self, kind: str) -> None:
        """Tests only: the next generate/play call exits the process, hangs, or raises."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULTS}")
        self._fault = kind

    def close(self) -> None:
        if self.fixed is not None:
            self.fixed.close()  # vLLM engines of fixed models of their own shape
        stop = getattr(self.generator, "close", None)
        if stop is not None:
            stop()
        shutdown_shared_pool()  # isolated tools' worker processes
        close_env_pools()  # pooled MCP servers

    # ---- work -----------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seed: int,
        policy: str | None = None,
    ) -> ChunkResult:
        """Completions of ``policy`` (a fixed policy's label; None = the actor)."""
        self._maybe_fail()
        t0 = time.perf_counter()
        try:
            generator = self._generator(policy)
            seed_everything(seed)  # after a load (offload), so samples depend on the seed only
            comps: list[Completion] = generator.generate(prompts, params)
        finally:
            self._release(policy)
        return ChunkResult(comps, time.perf_counter() - t0, self._version, self.index)

    def play(
        self,
        tasks: Sequence[Task],
        params: SamplingParams,
        step: int,
        policy_version: int,
        rollback: bool,
        conditions: Sequence[Condition | None] | None,
        seed: int,
        policy: str | None = None,
    ) -> ChunkResult:
        """Episodes of ``policy`` (a fixed policy's label; None = the actor)."""
        if self.runner is None:
            raise RuntimeError("play() needs actor_rollout_ref.rollout.multi_turn.enable=true")
        self._maybe_fail()
        t0 = time.perf_counter()
        try:
            generator = self._generator(policy)
            seed_everything(seed)
            episodes: list[Episode] = self.runner.play(
                tasks, params, step, policy_version, generator, rollback, conditions
            )
        finally:
            self._release(policy)
        return ChunkResult(episodes, time.perf_counter() - t0, self._version, self.index)

    def _generator(self, policy: str | None) -> Any:
        """The actor's generator, or a fixed policy's; a vLLM engine the two share gets this
        one's weights back first (as ``RolloutPart.activate`` does in one process)."""
        if policy is None:
            generator = self.generator
        elif self.fixed is None or policy not in self.fixed.specs:
            raise ValueError(f"worker {self.index}: no fixed policy {policy!r}")
        else:
            generator = self.fixed.generator(policy)
        claim = getattr(generator, "claim_engine", None)
        if claim is not None:
            claim()
        return generator

    def _release(self, policy: str | None) -> None:
        """With ``rollout_only.offload``, free the fixed model after the call that used it."""
        if policy is not None and self.fixed is not None:
            self.fixed.release()

    def _maybe_fail(self) -> None:
        kind, self._fault = self._fault, ""
        if kind == "exit":
            os._exit(1)  # a crash: no cleanup, no exception to report
        if kind == "hang":
            time.sleep(3600)
        if kind == "raise":
            raise ValueError(f"injected fault in worker {self.index}")
