"""The GRPO/PPO loop: rollout → reward → advantage → update, with checkpoints and metrics.

Each step is a short sequence of calls into the layers below; features hook in as modules.
"""

from __future__ import annotations

import copy
import logging
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from toolgrpo.algos import get_kl_controller
from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import TrainConfig, as_dict, data_seed
from toolgrpo.config.validate import validate_train_config
from toolgrpo.data.loader import load_tasks
from toolgrpo.data.task import Task
from toolgrpo.distributed.fsdp import start_ranks
from toolgrpo.distributed.rollout_share import RolloutShare
from toolgrpo.distributed.sharded_load import start_policy
from toolgrpo.envs.plugins import load_run_plugins
from toolgrpo.eval.evaluate import check_scorable, val_sampling_params
from toolgrpo.eval.offset_fit import offset_plan
from toolgrpo.mixture import Mixture
from toolgrpo.models.loading import load_tokenizer
from toolgrpo.models.registry import resolve_model
from toolgrpo.rewards.scoring import check_task
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.backends import make_generator
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.hf import HFGenerator
from toolgrpo.rollout.prompts import filter_overlong, refuse_split_routes
from toolgrpo.router.calibrate import Threshold
from toolgrpo.router.lm_price import LmPrice
from toolgrpo.router.runtime import RouterRuntime
from toolgrpo.run_log import RunLog
from toolgrpo.trainer import advantage_stage, filter_groups
from toolgrpo.trainer import state as ckpt_state
from toolgrpo.trainer.actor import Actor
from toolgrpo.trainer.batch import Batch
from toolgrpo.trainer.episodes import EpisodeRunner, make_router, mask_truncated_rows
from toolgrpo.trainer.metrics import NoSignalWatch, batch_metrics
from toolgrpo.trainer.parallel import actor_policy, open_tracker, push_weights
from toolgrpo.trainer.perf import memory_metrics
from toolgrpo.trainer.replay import AsyncRollout, take_batch
from toolgrpo.trainer.resume import prepare_output_dir
from toolgrpo.trainer.rollout_dump import make_dumper
from toolgrpo.trainer.rollout_stage import Rolled, RolloutStage, skipped_step
from toolgrpo.trainer.run_lock import RunLock
from toolgrpo.trainer.sampler import TaskSampler
from toolgrpo.trainer.summary import startup_lines, summary_lines
from toolgrpo.trainer.validation import ValSetup, validate

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        load_run_plugins(cfg)  # users' env types (trainer.imports, entry points) before checks
        validate_train_config(cfg)
        self.cfg = cfg
        self.ranks = start_ranks(cfg)  # trainer.device and, with fsdp2, the process group
        # Data before the model: a bad file fails in seconds, not after minutes of loading. The
        # tokenizer alone suffices to filter long prompts.
        self.tokenizer = load_tokenizer(resolve_model(cfg.actor_rollout_ref.model.path).hf_dir)
        self.tasks = self._load(cfg.data.train_files, cfg.data.max_samples)
        t = cfg.trainer
        val = self._read_val() if t.val_before_train or t.test_freq > 0 else None
        if val is not None and not cfg.actor_rollout_ref.rollout.multi_turn.enable:
            hint = "set actor_rollout_ref.rollout.multi_turn.enable=true to play them"
            check_scorable(val, cfg.data.val_files, hint)
        if cfg.trainer.num_threads > 0:
            torch.set_num_threads(cfg.trainer.num_threads)
        torch.manual_seed(cfg.trainer.seed)
        self.out = Path(cfg.trainer.output_dir)
        self.run_lock: RunLock | None = None
        self.run_log: RunLog | None = None  # <output_dir>/run.log: libraries' logs, warnings
        # Before the model loads: an earlier run here is resumed, refused, or moved aside; the
        # directory is resolved once and held (trainer/run_lock.py) until close().
        if self.ranks.main:
            self.out, self.run_lock = prepare_output_dir(
                self.out, cfg.trainer.resume, cfg.trainer.overwrite_output_dir, as_dict(cfg)
            )
            self.run_log = RunLog(self.out, cfg.trainer.verbose)
        self.pool: Any = None
        self.generator: Any = None
        try:
            # whole where it samples (every rank, or rank 0 with rollout_ranks=main); under
            # fsdp2 a rank that does not sample starts empty, filled by its shards
            self.policy = start_policy(cfg.actor_rollout_ref.model, self.ranks)
            self.tokenizer = self.policy.tokenizer
            self.sampler = TaskSampler(
                len(self.tasks), cfg.data.train_batch_size, data_seed(cfg), cfg.data.shuffle
            )
            self._setup(cfg)
        except BaseException:
            self.close()  # Ray workers, a vLLM engine, the run lock and log must not outlive us
            raise
        if val is not None:
            self._val_tasks = val

    def _setup(self, cfg: TrainConfig) -> None:
        r = cfg.actor_rollout_ref.rollout
        # Rollouts run here (HF or vLLM), or on Ray workers that hold their own generators.
        main = self.ranks.main
        samples = self.ranks.samples  # with fsdp2: every rank, or rank 0 (rollout_ranks=main)
        if cfg.trainer.distributed.backend == "ray" and main:
            from toolgrpo.distributed.pool import RolloutPool

            self.pool = RolloutPool(cfg)
        if samples:
            self.generator = self.pool.generator if self.pool else make_generator(cfg, self.policy)
        sampling = SamplingParams(
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=cfg.data.max_response_length,
            stop=tuple(r.stop),
        )
        # A fixed policy sharing rollout duty, off unless rollout_only.model_path is set. With
        # fsdp2 it samples on every rank that samples (and measures its support gap against
        # that rank's whole copy); rank 0 draws which groups it plays. A rank that does not
        # sample loads no fixed model, it only corrects the batch rank 0 broadcast. With
        # backend=ray the pool's workers hold and sample it.
        self.mixture: Mixture | None = None
        if cfg.rollout_only.model_path:
            lm = self.policy if samples else None
            self.mixture = Mixture(cfg, self.tokenizer, lm, samples, self.pool)
        self.total_steps = cfg.trainer.total_training_steps
        self.actor = Actor(actor_policy(self.policy, self.ranks), cfg, self.total_steps, self.ranks)
        kc = cfg.algorithm.kl_ctrl
        self.kl_ctrl = get_kl_controller(kc.type, kc.kl_coef, kc.target_kl, kc.horizon)
        self.flags = RllaFlags(**asdict(cfg.reward.rlla))
        self.episodes: EpisodeRunner | None = None
        others = sorted({t.task_type for t in self.tasks} - {"rlla"})
        if others and not r.multi_turn.enable:
            raise ConfigError(
                f"task types {', '.join(others)} are played in environments: set "
                "actor_rollout_ref.rollout.multi_turn.enable=true"
            )
        if r.multi_turn.enable and samples:  # environments wherever episodes are played
            router = make_router(cfg, self.flags)
            if self.pool is not None:
                self.episodes = self.pool.episode_runner(self.tokenizer, router)
            else:
                self.episodes = EpisodeRunner(cfg, self.generator, self.tokenizer, router)
            self.episodes.check(self.tasks)  # environments (and their snapshots, for rollback)
        # The budgeted tool router, off unless router.enable is set. With fsdp2 it lives on rank 0
        # (routes are planned there and sent to the ranks that play them; its λ·cost reaches
        # every rank's advantages with the batch).
        self.router: RouterRuntime | None = None
        if cfg.router.enable and main:
            envs = self.episodes.router if self.episodes is not None else None
            self.router = RouterRuntime(cfg, self.policy, self.tasks, envs, self.actor)
        if cfg.data.filter_overlong_prompts or self.router is not None:
            self._drop_overlong()  # judged on the opening the model sees, under every route
        self._val_tasks: list[Task] | None = None
        # τ of threshold routing, calibrated by the last validation; saved in router.pt
        self.router_calibration: Threshold | None = None
        self.rollouts = RolloutStage(
            cfg.data,
            cfg.reward,
            r.multi_turn,
            cfg.trainer.seed,
            self.tokenizer,
            sampling,
            self.flags,
            self.mixture,
            self.episodes,
            self.router,
            make_dumper(cfg.trainer),  # trainer.rollout_data_dir (verl's key)
            RolloutShare(self.ranks) if self.ranks.rollout_all else None,
        )
        self.step = 0
        self._resume()
        self._push_weights(self.step)

    def _load(self, files: list[str], max_samples: int = -1) -> list[Task]:
        d = self.cfg.data
        return load_tasks(files, d.bad_rows, max_samples, check_task).tasks

    def _drop_overlong(self) -> None:
        """verl's ``filter_overlong_prompts`` on the rendered opening: each environment's system
        prompt and tool specs (multi-turn), and every route's rewrite (router on). Without the
        filter, the router refuses tasks that only some of their routes would cut."""
        envs = self.episodes.router if self.episodes is not None else None
        routes = self.router.route_conditions() if self.router is not None else []
        d = self.cfg.data
        if not d.filter_overlong_prompts:
            refuse_split_routes(self.tokenizer, self.tasks, d.max_prompt_length, envs, routes)
            return
        self.tasks = filter_overlong(self.tokenizer, self.tasks, d.max_prompt_length, envs, routes)
        self.sampler = TaskSampler(
            len(self.tasks), d.train_batch_size, data_seed(self.cfg), d.shuffle
        )

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        t = self.cfg.trainer
        main = self.ranks.main
        lines = startup_lines(self) if main else ()  # with fsdp2 other ranks log nothing
        tracker = open_tracker(self.ranks, self.cfg, self.out, self.total_steps, self.step, lines)
        history = []
        watch = NoSignalWatch(t.warn_no_signal_steps, self.cfg.algorithm.adv_estimator != "gae")
        producer = self._start_async() if self.cfg.async_training.enable and main else None
        try:
            if t.val_before_train and self.step == 0 and main:
                tracker.begin_step(0)
                tracker.log(self.validate(0), 0)
            while self.step < self.total_steps:
                step = self.ranks.at_step(self.step + 1)  # what a rank's failure line names
                tracker.begin_step(step)
                metrics = self.train_step(step, producer)
                self.step = step
                if t.test_freq > 0 and step % t.test_freq == 0 and main:
                    metrics.update(self.validate(step))
                # Log before saving: a kill in between re-runs this step on resume (its line is
                # dropped then); the reverse order would lose the step's line for good.
                tracker.log(metrics, step)
                history.append(metrics)
                if (warning := watch.observe(metrics)) is not None:
                    log.warning("step %d: %s", step, warning)
                if (t.save_freq > 0 and step % t.save_freq == 0) or step == self.total_steps:
                    self.save_checkpoint()
        except Exception as e:  # fsdp2: every rank stops with one line (rank_failure.py)
            raise self.ranks.failed(e)  # noqa: B904 (it is e, or a RankFailed caused by e)
        finally:
            if producer is not None:
                producer.close()
            tracker.close()
        if main:  # where things are, what to open
            for line in summary_lines(self.out, history, t):
                tracker.console.print(line, soft_wrap=True, markup=False, highlight=False)
        return history

    def train_step(self, step: int, producer: AsyncRollout | None = None) -> dict[str, Any]:
        """One GRPO/PPO step: rollout → reward → advantage → update; returns its metrics."""
        t_step = time.time()
        asynchronous = self.cfg.async_training.enable  # producer: rank 0's rollout thread
        if not asynchronous:  # algorithm.filter_groups: as many batches as it takes
            fg, wanted = self.cfg.algorithm.filter_groups, self.cfg.data.train_batch_size
            pad = self.tokenizer.pad_token_id
            rolled = filter_groups.fill(lambda k: self._sample(step, k), fg, wanted, pad)
        else:
            self.sampler.next_batch()  # keep the checkpointed position in step with training
            rolled = self.ranks.broadcast(take_batch(producer) if self.ranks.main else None)
        batch, timing = rolled.batch, dict(rolled.timing)
        if batch is None:  # every episode failed in its environment
            return skipped_step(step, rolled, producer)

        rc = self.cfg.router
        lm = not (rc.enable and rc.freeze_lm)  # router-only runs skip the LM (on every rank)
        t0 = time.time()
        extra = self.prepare_old_and_ref(batch, behaviour=producer is not None) if lm else {}
        kl_metrics = self.compute_advantages(batch, rolled.price) if lm else {}
        timing["timing/logprob_s"] = time.time() - t0

        t0 = time.time()
        router_metrics = self.router.update() if self.router is not None else {}
        # multi_turn.mask_truncated: truncated episodes train no token (their scores are in)
        mask_truncated = self.cfg.actor_rollout_ref.rollout.multi_turn.mask_truncated
        full_mask = mask_truncated_rows(batch) if lm and mask_truncated else None
        if not lm:
            actor_metrics = {}
        elif not asynchronous:
            actor_metrics = self.actor.update(batch)
            t1 = time.time()  # backends with their own copy of the weights get the new ones
            self._push_weights(step)
            timing["timing/weight_sync_s"] = time.time() - t1
        else:  # the rollout thread copies weights only between updates
            with producer.lock if producer is not None else nullcontext():
                actor_metrics = self.actor.update(batch)
                self._push_weights(step)  # fsdp2: into rank 0's copy; Ray: to the workers
            if producer is not None:
                producer.updated()
        if full_mask is not None:  # the step's metrics describe what was sampled
            batch.response_mask_BR = full_mask
        timing["timing/train_s"] = time.time() - t0
        timing["timing/step_s"] = time.time() - t_step
        extra = {**extra, **kl_metrics, **actor_metrics, **router_metrics, **memory_metrics()}
        if self.pool is not None:
            extra.update(self.pool.metrics())
        extra["reward/nonfinite"] = rolled.nonfinite
        return {
            **batch_metrics(batch, timing, extra, self.sampler.state.epoch),
            **rolled.metrics,
        }

    def _start_async(self) -> AsyncRollout:
        sampler = copy.deepcopy(self.sampler)
        bs = self.cfg.actor_rollout_ref.rollout.generation_batch_size

        def produce(step: int, model: Any) -> Rolled:  # model None: the Ray pool's workers
            gen = HFGenerator(model, self.tokenizer, self.policy.dtype, bs) if model else None
            return self.produce(step, sampler.next_batch(), gen)

        model = None if self.pool is not None else self.policy.model
        stale = self.cfg.async_training.staleness_threshold
        producer = AsyncRollout(model, produce, self.step + 1, self.total_steps, stale)
        producer.start()
        return producer

    # ---- stages --------------------------------------------------------------------------------
    def _sample(self, step: int, k: int) -> Rolled:
        """The step's k-th batch of tasks rolled out; with fsdp2 it reaches every rank."""
        main, everyone = self.ranks.main, self.ranks.rollout_all
        indices = self.sampler.next_batch() if main else None
        if everyone:  # every rank plays its share of rank 0's tasks; rank 0 collates
            tasks = self.ranks.broadcast([self.tasks[i] for i in indices] if main else None)
            got = self.rollouts.produce(step, tasks, self.generator, self.step, k)
        else:  # rank 0 samples alone
            got = self.produce(step, indices, self.generator, k) if main else None
        return self.ranks.broadcast(got)  # a failure on any rank ends every rank

    def produce(self, step: int, indices: list[int], generator: Any = None, k: int = 0) -> Rolled:
        """Rollout and reward for the tasks at ``indices`` (trainer/rollout_stage.py)."""
        tasks = [self.tasks[i] for i in indices]
        gen = generator or self.generator
        rolled = self.rollouts.produce(step, tasks, gen, self.step, k)
        if self.pool is not None:  # this batch's share of the workers' time
            rolled.metrics.update(self.pool.rollout_times())
        return rolled

    def prepare_old_and_ref(self, batch: Batch, behaviour: bool = False) -> dict[str, float]:
        """Old and reference log-probs, values for GAE (trainer/advantage_stage.py)."""
        cfg, mixture = self.cfg, self.mixture
        return advantage_stage.prepare_old_and_ref(batch, cfg, self.actor, mixture, behaviour)

    def compute_advantages(self, batch: Batch, price: LmPrice | None = None) -> dict[str, float]:
        """Token rewards and advantages (trainer/advantage_stage.py); ``price``: the router's
        λ·cost of the batch's rows, sampled with it."""
        return advantage_stage.compute_advantages(batch, self.cfg.algorithm, self.kl_ctrl, price)

    def validate(self, step: int) -> dict[str, float]:
        """Same tasks and settings as ``toolgrpo eval`` (trainer/validation.py)."""
        if self._val_tasks is None:
            self._val_tasks = self._read_val()
        params, d, seed = val_sampling_params(self.cfg), self.cfg.data, self.cfg.trainer.seed
        on = ValSetup(self.generator, self.tokenizer, params, d, self.flags, seed, self.episodes)
        on = replace(on, router=self.router, offset=offset_plan(self.cfg, self.tasks))
        res = validate(on, self._val_tasks, step, self.step)
        if res.routed:  # τ for threshold routing, saved with the next checkpoint
            self.router_calibration = res.calibrated
        return res.metrics

    def _read_val(self) -> list[Task]:
        d = self.cfg.data
        return load_tasks(d.val_files, d.bad_rows, d.val_max_samples, check_task).tasks

    def close(self) -> None:
        """Stop what runs beside the trainer: Ray rollout workers, a vLLM engine, tool workers."""
        for part in (self.pool, self.generator, getattr(self, "mixture", None)):
            stop = getattr(part, "close", None)
            if stop is not None:
                stop()
        from toolgrpo.envs.pool import close_env_pools
        from toolgrpo.tools.shared_pool import shutdown_shared_pool

        shutdown_shared_pool()  # isolated tools' worker processes (also done at exit)
        close_env_pools()  # pooled MCP servers (also done at exit)
        self.ranks.close()  # the fsdp2 process group
        if getattr(self, "run_lock", None) is not None:
            self.run_lock.release()  # another process may write trainer.output_dir now
        if getattr(self, "run_log", None) is not None:
            self.run_log.close()

    # ---- checkpoints and weights -------------------------------------------------------------
    def _run_state(self) -> ckpt_state.RunState:
        return ckpt_state.RunState(
            self.cfg,
            self.out,
            self.ranks,
            self.policy,
            self.actor,
            self.kl_ctrl,
            self.sampler,
            self.router,
        )

    def save_checkpoint(self) -> Path | None:
        return ckpt_state.save(self._run_state(), self.step, self.router_calibration)

    def _resume(self) -> None:
        # The newest intact checkpoint, config changes checked; announced on the console.
        resumed = ckpt_state.resume(self._run_state())
        self.step, self.router_calibration = resumed.step, resumed.calibration

    def _push_weights(self, version: int) -> None:
        backend = self.pool or self.generator  # Ray workers or vLLM hold their own copy
        push_weights(self.actor, self.policy, self.ranks, backend, version)
