"""The rollout stage of a step: tasks → rollouts (actor or mixture policies, routed or not,
single- or multi-turn) → rewards → one collated batch with its rollout metrics.

``RolloutStage`` holds what it reads (the config sections, tokenizer, sampling params, mixture,
environments, router, dumper) and owns nothing else; the trainer builds one and passes each
step's tasks, generator and policy version.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from toolgrpo import progress
from toolgrpo.config.schema import DataConfig, MultiTurnConfig, RewardConfig
from toolgrpo.data.task import Task
from toolgrpo.distributed.rollout_share import RolloutShare
from toolgrpo.mixture import ACTOR, RolloutPart
from toolgrpo.rewards.scoring import Score, is_finite, score
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.single_turn import rollout_tasks, solution_text
from toolgrpo.router.families import FamilyMap
from toolgrpo.router.lm_price import LmPrice, call_price
from toolgrpo.router.runtime import routed_rollout
from toolgrpo.router.usage import usage_of_rollout
from toolgrpo.trainer.batch import Batch, collate, negative_parents
from toolgrpo.trainer.episodes import NonFiniteReward, stand_in_rewards
from toolgrpo.trainer.rollout_dump import RolloutDumper, completion_record
from toolgrpo.trainer.sample_metrics import Samples

if TYPE_CHECKING:
    from toolgrpo.mixture import Mixture
    from toolgrpo.router.runtime import RouterRuntime
    from toolgrpo.trainer.episodes import EpisodeRunner


log = logging.getLogger(__name__)


@dataclass
class Rolled:
    """One step's rollout, rewarded and collated, ready for the update. ``samples``: what its
    metrics were computed from, for dynamic sampling to count them again over the groups it
    trains; rank 0 alone logs metrics, so it is not sent to the other FSDP2 ranks."""

    batch: Batch | None  # None: every episode failed in its environment (the update is skipped)
    metrics: dict[str, float]
    timing: dict[str, float]
    nonfinite: float
    price: LmPrice | None = None  # the router's λ·cost per row, for the LM's advantages
    samples: Samples | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "samples": None}


@dataclass(frozen=True)
class RolloutStage:
    """What a step's rollout reads. ``episodes`` set: multi-turn episodes scored by their
    environments; else single-turn completions scored by the RLLA reward (``flags``)."""

    data: DataConfig  # max_prompt_length, truncation
    reward_cfg: RewardConfig  # nan_policy
    multi_turn: MultiTurnConfig  # mask_truncated
    seed: int  # trainer.seed: each step's sampling is seeded from it (resumable)
    tokenizer: Any
    sampling: SamplingParams
    flags: RllaFlags
    mixture: Mixture | None = None
    episodes: EpisodeRunner | None = None
    router: RouterRuntime | None = None
    dumper: RolloutDumper | None = None  # trainer.rollout_data_dir
    share: RolloutShare | None = None  # FSDP2, every rank samples: this rank's part

    def produce(
        self, step: int, tasks: list[Task], generator: Any, version: int, gen_batch: int = 0
    ) -> Rolled | None:
        """Rollout and reward for one step's tasks, sampled by ``generator`` with the weights of
        policy ``version``: the batch, its rollout metrics and timings. ``gen_batch``: which of
        the step's batches this is (dynamic sampling samples more than one). With ``share``,
        every rank calls it with the same tasks and plays its share; rank 0 gets the result, the
        other ranks None."""
        rank = self.share.ranks.rank if self.share is not None else 0
        # resumable sampling: one seed per step, batch and rank
        torch.manual_seed(self.seed * 1_000_003 + step + 7_919 * rank + 104_729 * gen_batch)
        timing: dict[str, float] = {}
        t0 = time.perf_counter()
        items, policies, routes = self._generate(step, tasks, generator, version)
        timing["timing/gen_s"] = time.perf_counter() - t0
        if self.share is None:
            return self._collate(step, items, policies, routes, timing, gen_batch)
        if not self.share.main:
            return None  # rank 0 rewards and collates every rank's samples
        rolled = self._collate(step, items, policies, routes, timing, gen_batch)
        rolled.metrics["rollout/sampling_ranks"] = float(self.share.take_sampling_ranks())
        return rolled

    def _collate(
        self,
        step: int,
        items: list[Any],
        policies: list[str],
        routes: list[str | None],
        timing: dict[str, float],
        gen_batch: int = 0,
    ) -> Rolled:
        """The step's samples rewarded (single-turn) and collated with their metrics; the dump of
        a step's later batches joins its first one's."""
        more = gen_batch > 0
        if self.episodes is not None:
            if self.dumper is not None:
                tok = self.tokenizer
                self.dumper.write_episodes(step, items, tok, policies, routes, append=more)
            return self._episode_batch(step, items, policies, timing)
        completions, uids, owners = (list(x) for x in zip(*items, strict=True))
        t0 = time.perf_counter()
        scores, nonfinite = self.reward(owners, completions, step)
        timing["timing/reward_s"] = time.perf_counter() - t0
        types = [t.task_type for t in owners]
        every = [True] * len(scores)
        samples = Samples(uids, types, every, nonfinite, completions=completions, scores=scores)
        if self.dumper is not None:
            rows = zip(completions, owners, uids, scores, policies, routes, strict=True)
            tok = self.tokenizer
            recs = [completion_record(*r[:4], tok, *r[4:]) for r in rows]
            self.dumper.write(step, recs, append=more)
        batch = collate(completions, uids, self.tokenizer.pad_token_id)
        batch.task_types = types
        batch.scores_B = torch.tensor([s.total for s in scores], dtype=torch.float32)
        batch.policies = policies
        metrics = samples.metrics()
        metrics.update(mixture_metrics(self.mixture, step, batch))
        price = None
        if self.router is not None:
            metrics.update(self.router.observe(items, [s.total for s in scores]))
            price = self.router.bind_rows(list(range(len(items))))  # one batch row per rollout
        elif self.reward_cfg.tool_call_cost > 0:
            price = self._call_price(items, list(range(len(items))), metrics)
        return Rolled(batch, metrics, timing, float(sum(nonfinite)), price, samples)

    def _call_price(
        self, items: list[Any], rows: list[int | None], metrics: dict[str, float]
    ) -> LmPrice:
        """``reward.tool_call_cost``: the LM's reward less that price per call, per batch row
        (``None``: a rolled-back negative, which keeps its fixed score)."""
        calls = [usage_of_rollout(it, FamilyMap(), self.tokenizer).num_calls for it in items]
        c = self.reward_cfg.tool_call_cost
        metrics["reward/call_penalty_mean"] = c * sum(calls) / max(len(calls), 1)
        return call_price([calls[i] if i is not None else None for i in rows], c, False)

    def _episode_batch(
        self, step: int, items: list[Episode], policies: list[str], timing: dict[str, float]
    ) -> Rolled:
        """Episodes → batch: those whose environment failed are reported and left out (the run
        stops past ``max_env_failure_ratio``); ``batch`` is None if none is left."""
        assert self.episodes is not None
        keep = self.episodes.trainable(items, step)
        kept = [items[i] for i in keep]
        rows = set(keep)
        trained = [i in rows for i in range(len(items))]
        bad = [t and not math.isfinite(e.reward) for t, e in zip(trained, items, strict=True)]
        batch, nonfinite = self.episodes.to_batch(kept) if kept else (None, 0)  # NaN → 0 first
        uids, types = [e.uid for e in items], [e.task_type for e in items]
        masking = self.multi_turn.mask_truncated
        samples = Samples(uids, types, trained, bad, episodes=items, mask_truncated=masking)
        metrics = samples.metrics()
        metrics["train/skipped_update"] = float(batch is None)
        price = None
        rows = list(keep) + [None] * (batch.size - len(kept)) if batch is not None else []
        if self.router is not None:  # failed episodes stand at their group's mean
            metrics.update(self.router.observe(items, stand_in_rewards(items)))
            if batch is not None:  # kept episodes' rows, then their negatives (no rollout)
                price = self.router.bind_rows(rows)
        elif self.reward_cfg.tool_call_cost > 0 and batch is not None:
            price = self._call_price(items, rows, metrics)
        if batch is not None:
            pols = [policies[i] for i in keep]
            batch.policies = pols + [pols[i] for i in negative_parents(kept)]
            metrics.update(mixture_metrics(self.mixture, step, batch))
        return Rolled(batch, metrics, timing, float(nonfinite), price, samples)

    def _generate(
        self, step: int, tasks: list[Task], generator: Any, version: int
    ) -> tuple[list, list[str], list[str | None]]:
        """Episodes, or (completion, uid, task) triples, of the step's tasks, each with the policy
        that sampled it (the actor, or a fixed policy of the mixture) and its route (the
        router's, None without it; for dumps)."""
        items: list = []
        policies: list[str] = []
        routes: list[str | None] = []
        unit = "episodes" if self.episodes is not None else "samples"
        with (
            progress.phase("generation", len(tasks) * self.sampling.n, unit),
            self._rollout_parts(step, tasks, generator) as parts,
        ):
            for p in parts:
                p.activate()  # a shared vLLM engine gets this policy's weights back
                # With the router, each rollout's route is sampled first and rewrites its prompt.
                # A fixed policy's rollouts are routed, but the head and λ do not learn from them.
                router, learn = self.router, p.policy == ACTOR
                plan = router.plan(p.tasks, p.params.n, learn) if router is not None else None
                conds = plan.conditions if plan is not None else None
                got = self._play(step, version, p, conds)
                if got is None:
                    continue  # an FSDP2 rank other than 0: its share went to rank 0
                if self.episodes is None:
                    progress.tick(len(got))  # episodes tick as each one ends
                items += got
                policies += [p.policy] * len(got)
                routes += plan.routes if plan is not None else [None] * len(got)
        if self.share is not None and not self.share.main:
            return items, policies, routes
        if self.mixture is not None:  # mixed groups: fixed samples join their task's actor group
            items = self.mixture.join_groups(parts, items)
        return items, policies, routes

    def _play(
        self, step: int, version: int, p: RolloutPart, conds: list[Any] | None
    ) -> list[Any] | None:
        """One part's samples (``n`` per task, task-major); with ``share``, this rank plays its
        share of the part's tasks under rank 0's routes, and rank 0 gets everyone's (None on
        the other ranks)."""
        tasks, share, n = p.tasks, self.share, p.params.n
        if share is not None:
            conds = share.broadcast(conds)  # the routes rank 0's router planned
            tasks = share.mine(p.tasks)
            conds = share.my_rows(conds, n) if conds is not None else None
        if self.episodes is not None:
            got = self.episodes.play(tasks, p.params, step, version, p.generator, conditions=conds)
        elif conds is not None:
            d = self.data
            tok, gen = self.tokenizer, p.generator
            got = routed_rollout(
                tasks, n, conds, gen, p.params, tok, d.max_prompt_length, d.truncation
            )
        else:
            got = list(zip(*self._single_turn(tasks, p.generator, p.params), strict=True))
        if share is None:
            return got
        merged = share.gather(got, len(p.tasks), n)
        if merged is not None and self.episodes is not None:
            progress.tick(len(merged) - len(got))  # the other ranks' episodes, now in
        return merged

    def _rollout_parts(
        self, step: int, tasks: list[Task], generator: Any
    ) -> AbstractContextManager[list[RolloutPart]]:
        """The tasks by the policy that samples them: all the actor's unless a mixture is on
        (whose draw rank 0 makes when every FSDP2 rank samples)."""
        if self.mixture is None:
            return nullcontext([RolloutPart(ACTOR, tasks, generator, self.sampling)])
        labels = None
        if self.share is not None:
            mine = self.mixture.allocation(step, len(tasks)) if self.share.main else None
            labels = self.share.broadcast(mine)
        return self.mixture.rollout_parts(step, tasks, generator, self.sampling, labels)

    def _single_turn(
        self, tasks: list[Task], generator: Any, params: SamplingParams
    ) -> tuple[list[Completion], list[str], list[Task]]:
        """n completions per task; every completion of a task shares one fresh group uid."""
        d = self.data
        comps = rollout_tasks(
            generator, self.tokenizer, tasks, params, d.max_prompt_length, d.truncation
        )
        group = [uuid.uuid4().hex for _ in tasks]
        return comps, [group[c.prompt_index] for c in comps], [tasks[c.prompt_index] for c in comps]

    def reward(
        self, owners: list[Task], completions: list[Completion], step: int
    ) -> tuple[list[Score], list[bool]]:
        """Each completion's score, and whether it was non-finite (scored 0 then)."""
        scores, bad = [], []
        for task, comp in zip(owners, completions, strict=True):
            s = score(task, solution_text(self.tokenizer, comp), step, self.flags)
            bad.append(not is_finite(s))
            if bad[-1]:
                if self.reward_cfg.nan_policy == "error":
                    raise NonFiniteReward(f"non-finite reward {s} for task {task.task_id}")
                s = Score(0.0, 0.0, 0.0, 0.0, s.format_ok, s.exact_call)
            scores.append(s)
        return scores, bad


def mixture_metrics(mixture: Mixture | None, step: int, batch: Batch) -> dict[str, float]:
    """rollout/policy_choice, using_actor/using_fixed and rewards by policy (mixture only),
    over real rows: rolled-back negatives are not samples of any policy's episodes."""
    if mixture is None:
        return {}
    real = [i for i in range(batch.size) if not (batch.is_negative and batch.is_negative[i])]
    scores = batch.scores_B.tolist()
    return mixture.rollout_metrics(
        step, [batch.policies[i] for i in real], [scores[i] for i in real]
    )


def skipped_step(step: int, rolled: Rolled, producer: Any = None) -> dict[str, float]:
    """The metrics of a step with nothing to train on (every episode failed in its
    environment, under ``max_env_failure_ratio=1``): no update, the run goes on."""
    log.warning("step %d: every episode failed in its environment; no update this step", step)
    if producer is not None:  # the producer counts updates to bound its staleness
        producer.updated()
    return {**rolled.metrics, **rolled.timing, "reward/nonfinite": rolled.nonfinite}
