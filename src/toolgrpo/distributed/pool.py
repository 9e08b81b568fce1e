"""Ray mode (``trainer.distributed.backend=ray``): rollouts run on N Ray actors.

Each worker (``toolgrpo.distributed.worker``) holds a copy of the policy, a generator and the
environments. The trainer pushes weights through the object store, one ``ray.put`` per version;
a rollout call is cut into contiguous chunks, one per worker, each seeded independently of the
worker that runs it (``chunks.CallSeeds``), and the results are put back in call order.

With a mixture (``rollout_only.model_path``) every worker also holds the fixed policies: a call
may name one (``policy``), and ``fixed_generators`` are the driver's handles on them, so the fixed
share of generation scales out with the pool as the actor's does.

Fault tolerance: every remote call has a deadline (``call_timeout_s``). A worker that dies (its
process crashed, was killed, or lost its node) or misses a deadline is killed and replaced, the
replacement gets the current weights, and the chunk it held is run again; the run continues.
After ``max_worker_restarts`` restarts in a run the next failure stops it with the worker's last
error. An exception raised by our own code in a worker (a bug, a bad config) is not a crash: it
propagates as is, since a restart would only raise it again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.task import Task
from toolgrpo.distributed.chunks import CallSeeds, split_even, weights_to_send
from toolgrpo.distributed.frontends import PoolEpisodeRunner, PoolGenerator
from toolgrpo.distributed.worker import ChunkResult, RolloutWorker, WorkerInfo
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.multi_turn import Condition

log = logging.getLogger(__name__)

# Starting a worker loads a model (and maybe a vLLM engine): not a hang, even on a busy machine.
STARTUP_TIMEOUT_S = 300.0
# What reaches the workers from the driver's environment (caches, offline mode, backend knobs).
FORWARDED_ENV = ("TOOLGRPO_", "HF_", "TRANSFORMERS_", "VLLM_", "TORCHDYNAMO_", "OMP_WAIT_POLICY")


def worker_env(threads: int) -> dict[str, str]:
    """Env vars for a worker process: the forwarded ones (never a *TOKEN* secret) plus its
    thread count, set before torch is imported there."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(FORWARDED_ENV) and "TOKEN" not in k.upper()
    }
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def restartable_errors() -> tuple[type[BaseException], ...]:
    """Ray errors that mean the worker (not the work) failed: a restart may fix them."""
    from ray import exceptions as rex

    names = (
        "RayActorError",  # includes ActorDiedError and ActorUnavailableError
        "GetTimeoutError",
        "WorkerCrashedError",
        "ObjectLostError",
        "OutOfMemoryError",
        "NodeDiedError",
        "LocalRayletDiedError",
    )
    return tuple(getattr(rex, n) for n in names if hasattr(rex, n))


@dataclass
class _Slot:
    """One worker position; its actor changes when it is replaced."""

    index: int
    actor: Any
    version: int = -1  # weights it holds (-1: the ones it loaded from disk)
    last_error: str = ""


@dataclass
class _Job:
    chunk: int
    slot: _Slot
    method: str
    args: tuple
    deadline: float


class RolloutPool:
    def __init__(self, cfg: TrainConfig) -> None:
        import ray

        fixed = checked_fixed_labels(cfg)  # a bad one fails here, not as N workers' crashes
        self._ray = ray
        self.cfg = cfg
        self.dist = d = cfg.trainer.distributed
        self.timeout = float(d.call_timeout_s)
        self.startup_timeout = max(self.timeout, STARTUP_TIMEOUT_S)
        self._restartable = restartable_errors()
        self._owns_ray = not ray.is_initialized()
        t0 = time.perf_counter()
        if self._owns_ray:
            # "" starts a cluster of our own ("local": even if another one runs on this machine,
            # which a bare ray.init() would join); otherwise join the given one.
            kwargs = {"include_dashboard": False, **d.ray_init_kwargs}
            ray.init(address=d.address or "local", **kwargs)
        self.init_s = time.perf_counter() - t0
        self._actor_cls = ray.remote(RolloutWorker)
        self._slots: list[_Slot] = []
        self._weights: tuple[int, Any] | None = None  # (version, ObjectRef) of the last push
        self._seeds = CallSeeds(cfg.trainer.seed)
        self.restarts = 0
        self.requeued = 0
        self.weight_push_s = self.weight_put_s = self.weight_mb = 0.0
        self._step = {"wall": 0.0, "compute": 0.0}  # rollout calls since the last metrics()
        self._closed = False
        # One caller at a time: async training's rollout thread dispatches while the trainer
        # pushes weights (or validates); a push waits for the chunk in flight to come back.
        self._lock = threading.RLock()
        t0 = time.perf_counter()
        try:
            self._slots = [_Slot(i, self._spawn(i)) for i in range(d.num_rollout_workers)]
            infos = self._start_all()
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - t0
        self.eos_ids = list(infos[0].eos_ids)
        log.info(
            "Ray pool: %d workers up in %.1fs (ray.init %.1fs)",
            len(infos),
            self.start_s,
            self.init_s,
        )
        self.generator = PoolGenerator(self)
        # One generator per fixed policy of the mixture, sampling on the workers.
        self.fixed_generators = {label: PoolGenerator(self, label) for label in fixed}

    # ---- the trainer's interface ----------------------------------------------------------
    def episode_runner(self, tokenizer: Any, router: Any) -> Any:
        return PoolEpisodeRunner(self, tokenizer, router)

    def sync_weights(self, model: Any, version: int) -> None:
        """One object-store copy of this version's weights; every worker loads it."""
        with self._lock:
            t0 = time.perf_counter()
            payload = weights_to_send(model)
            ref = self._ray.put(payload)
            self.weight_put_s = time.perf_counter() - t0
            self.weight_mb = payload.nbytes / 2**20
            self._weights = (version, ref)  # the previous version's object is freed with its ref
            self._dispatch("set_weights", [(version, ref)] * len(self._slots), self.startup_timeout)
            for s in self._slots:
                s.version = version
            self.weight_push_s = time.perf_counter() - t0

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, policy: str | None = None
    ) -> list[Completion]:
        """``params.n`` completions per prompt by ``policy`` (a fixed policy's label; None = the
        actor), grouped by prompt in prompt order."""
        ranges = split_even(len(prompts), len(self._slots))
        seeds = self._seeds.next(len(ranges))
        args = [
            (prompts[s:e], params, seed, policy) for (s, e), seed in zip(ranges, seeds, strict=True)
        ]
        out: list[Completion] = []
        for (start, _), res in zip(ranges, self._rollout("generate", args), strict=True):
            out.extend(replace(c, prompt_index=c.prompt_index + start) for c in res.items)
        return out

    def play(
        self,
        tasks: Sequence[Task],
        params: SamplingParams,
        step: int,
        policy_version: int,
        rollback: bool = True,
        conditions: Sequence[Condition | None] | None = None,
        policy: str | None = None,
    ) -> list[Episode]:
        """``params.n`` episodes per task, grouped by task in task order, played on the workers
        by ``policy`` (a fixed policy's label; None = the actor); ``conditions`` (task-major, n
        per task) travel with their tasks."""
        n = params.n
        if conditions is not None and len(conditions) != len(tasks) * n:
            raise ValueError(f"{len(conditions)} conditions for {len(tasks) * n} episodes")
        ranges = split_even(len(tasks), len(self._slots))
        seeds = self._seeds.next(len(ranges))
        args = [
            (
                list(tasks[s:e]),
                params,
                step,
                policy_version,
                rollback,
                list(conditions[s * n : e * n]) if conditions is not None else None,
                seed,
                policy,
            )
            for (s, e), seed in zip(ranges, seeds, strict=True)
        ]
        return [ep for res in self._rollout("play", args) for ep in res.items]

    def metrics(self) -> dict[str, float]:
        """The pool's counters for the run (restarts, the last weight push)."""
        return {
            "ray/num_workers": float(len(self._slots)),
            "ray/worker_restarts": float(self.restarts),
            "ray/requeued_tasks": float(self.requeued),
            "ray/weight_push_s": self.weight_push_s,  # put + every worker loaded it
            "ray/weight_put_s": self.weight_put_s,
            "ray/weight_push_mb": self.weight_mb,
            "ray/weight_version": float(min((s.version for s in self._slots), default=-1)),
        }

    def rollout_times(self) -> dict[str, float]:
        """The Ray share of the rollout calls since the last call (read right after a step's
        rollout, on the thread that made it: with async training that is not the update's)."""
        with self._lock:
            wall, compute = self._step["wall"], self._step["compute"]
            self._step = {"wall": 0.0, "compute": 0.0}
        return {
            "ray/rollout_wall_s": wall,
            "ray/worker_compute_s": compute,
            "ray/dispatch_overhead_s": max(0.0, wall - compute),
        }

    def worker_info(self) -> list[WorkerInfo]:
        with self._lock:
            return self._dispatch("ping", [()] * len(self._slots), self.timeout)

    @property
    def actors(self) -> list[Any]:
        """The live actor handles, by worker index (tests inject faults through them)."""
        return [s.actor for s in self._slots]

    def close(self) -> None:
        """Stop the workers (letting a vLLM engine shut down first), and Ray if we started it."""
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        try:
            refs = [s.actor.close.remote() for s in self._slots]
            ray.wait(refs, num_returns=len(refs), timeout=10.0)
        except Exception as exc:  # best effort: they are killed next anyway
            log.debug("closing workers: %s", exc)
        for s in self._slots:
            self._kill(s.actor)
        self._weights = None
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    # ---- dispatch and recovery ------------------------------------------------------------
    def _rollout(self, method: str, args: list[tuple]) -> list[ChunkResult]:
        with self._lock:
            t0 = time.perf_counter()
            results: list[ChunkResult] = self._dispatch(method, args, self.timeout)
            self._step["wall"] += time.perf_counter() - t0
            # Chunks run in parallel: the work took as long as the slowest one.
            self._step["compute"] += max((r.compute_s for r in results), default=0.0)
        return results

    def _dispatch(self, method: str, args: list[tuple], timeout: float) -> list[Any]:
        """``method(*args[c])`` on worker c for every chunk c; results in chunk order. A chunk
        whose worker fails is re-run on that worker's replacement."""
        if len(args) > len(self._slots):
            raise ValueError(f"{len(args)} chunks for {len(self._slots)} workers")
        results: list[Any] = [None] * len(args)
        live = {}
        for c, a in enumerate(args):
            job = _Job(c, self._slots[c], method, a, 0.0)
            live[self._submit(job, timeout)] = job
        while live:
            wait_s = max(0.0, min(j.deadline for j in live.values()) - time.monotonic())
            ready, _ = self._ray.wait(list(live), num_returns=1, timeout=wait_s)
            if not ready:  # the earliest deadline passed: that worker is hung
                now = time.monotonic()
                for ref, job in list(live.items()):
                    if job.deadline <= now:
                        del live[ref]
                        err = self._ray.exceptions.GetTimeoutError(
                            f"worker {job.slot.index}: {method} took longer than "
                            f"trainer.distributed.call_timeout_s={timeout:g}"
                        )
                        live[self._recover(job, err, timeout)] = job
                continue
            job = live.pop(ready[0])
            try:
                results[job.chunk] = self._ray.get(ready[0], timeout=timeout)
            except self._restartable as err:
                live[self._recover(job, err, timeout)] = job
        return results

    def _submit(self, job: _Job, timeout: float) -> Any:
        job.deadline = time.monotonic() + timeout
        return getattr(job.slot.actor, job.method).remote(*job.args)

    def _recover(self, job: _Job, err: BaseException, timeout: float) -> Any:
        """Replace the job's worker, then run the job again on the replacement."""
        self._replace(job.slot, err)
        self.requeued += 1
        log.warning("re-queued %s chunk %d on worker %d", job.method, job.chunk, job.slot.index)
        return self._submit(job, timeout)

    def _replace(self, slot: _Slot, err: BaseException) -> None:
        while True:
            self.restarts += 1
            slot.last_error = _summary(err)
            limit = self.dist.max_worker_restarts
            if self.restarts > limit:
                raise RuntimeError(
                    f"rollout worker {slot.index} failed after the run used all {limit} worker "
                    f"restarts (trainer.distributed.max_worker_restarts); its last error: "
                    f"{slot.last_error}"
                ) from err
            log.warning(
                "rollout worker %d failed (%s); restarting it (%d/%d)",
                slot.index,
                slot.last_error,
                self.restarts,
                limit,
            )
            self._kill(slot.actor)
            slot.actor, slot.version = self._spawn(slot.index), -1
            try:  # the replacement starts with the run's current weights
                if self._weights is not None:
                    version, ref = self._weights
                    self._ray.get(
                        slot.actor.set_weights.remote(version, ref), timeout=self.startup_timeout
                    )
                    slot.version = version
                else:
                    self._ray.get(slot.actor.ping.remote(), timeout=self.startup_timeout)
                return
            except self._restartable as again:
                if getattr(again, "actor_init_failed", False):  # it would fail every time
                    raise RuntimeError(
                        f"a replacement for rollout worker {slot.index} failed to start: "
                        f"{_summary(again)}"
                    ) from again
                err = again

    def _spawn(self, index: int) -> Any:
        d = self.dist
        # Restarts are ours (with weights and re-queueing), so Ray's own are off.
        return self._actor_cls.options(
            num_cpus=d.num_cpus_per_worker,
            max_restarts=0,
            max_task_retries=0,
            runtime_env={"env_vars": worker_env(max(1, int(d.num_cpus_per_worker)))},
        ).remote(self.cfg, index)

    def _start_all(self) -> list[WorkerInfo]:
        """Wait for every worker to load; a worker that cannot start is a setup error (a path
        missing on that node, an import failing there), reported without restarts."""
        try:
            return self._ray.get(
                [s.actor.ping.remote() for s in self._slots], timeout=self.startup_timeout
            )
        except self._restartable as err:
            raise RuntimeError(f"a Ray rollout worker failed to start: {_summary(err)}") from err

    def _kill(self, actor: Any) -> None:
        try:
            self._ray.kill(actor, no_restart=True)
        except Exception as exc:  # already gone
            log.debug("ray.kill: %s", exc)


def checked_fixed_labels(cfg: TrainConfig) -> list[str]:
    """The labels of the mixture's fixed policies (none without ``rollout_only.model_path``),
    after the driver's checks of their tokenizer and base (no weights): a wrong path or
    tokenizer is the one-line ``ConfigError`` of a local run, raised before any worker loads."""
    if not cfg.rollout_only.model_path:
        return []
    from toolgrpo.mixture.policies import check_fixed, fixed_specs
    from toolgrpo.models.loading import load_tokenizer
    from toolgrpo.models.registry import resolve_model

    specs, actor = fixed_specs(cfg), cfg.actor_rollout_ref.model.path
    check_fixed(specs, load_tokenizer(resolve_model(actor).hf_dir), actor)
    return [s.label for s in specs]


def _summary(err: BaseException, limit: int = 600) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text if len(text) <= limit else text[:limit] + " ..."
