"""The trainer's view of a mixture: who samples which tasks this step, and the IS correction.

Three hooks: ``rollout_parts`` splits a step's tasks between the actor and the fixed policies
(whole prompt groups by default; with ``groups=mixed`` the actor samples every task and the
fixed policies add k samples to the groups the schedule gives them), ``join_groups`` moves those
samples into their actor group (``groups``), and ``correct`` rewrites the old log-probs (and
the IS weights, or the shaping mask) of the rows a fixed policy sampled, after the trainer chose
the actor's, and logs the support gap. Both feed their metrics to the schedule (``observe``), which
an adaptive schedule reads; on resume they are replayed from ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any

import torch

from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.task import Task
from toolgrpo.mixture.correction import correct_fixed_rows
from toolgrpo.mixture.groups import group_signal_metrics, join_groups
from toolgrpo.mixture.objective import guided_rows
from toolgrpo.mixture.policies import FixedPolicies, fixed_specs
from toolgrpo.mixture.schedule import ACTOR, allocate, build_schedule
from toolgrpo.mixture.support import support_gap
from toolgrpo.rollout.generator import SamplingParams

if TYPE_CHECKING:
    from toolgrpo.trainer.actor import Actor
    from toolgrpo.trainer.batch import Batch

log = logging.getLogger(__name__)


@dataclass
class RolloutPart:
    """Tasks one policy samples this step, with its generator and sampling settings."""

    policy: str  # "actor" or a fixed policy's label ("fixed", "fixed_1", ...)
    tasks: list[Task]
    generator: Any
    params: SamplingParams
    groups: list[int] | None = None  # mixed groups: each task's index among the step's tasks

    def activate(self) -> None:
        """Before this part plays: a vLLM engine shared by the actor and a fixed policy holds
        whichever weights were pushed last, so this part's generator re-pushes its own."""
        claim = getattr(self.generator, "claim_engine", None)
        if claim is not None:
            claim()


def fixed_groups_with_signal(batch: Batch) -> float:
    """Share of the fixed policy's prompt groups whose scores differ: the groups whose rows get
    non-zero GRPO advantages, i.e. teach the actor anything (negatives left out)."""
    groups: dict[str, set[float]] = {}
    scores = batch.scores_B.tolist()
    for i, (u, p) in enumerate(zip(batch.uids, batch.policies, strict=True)):
        if p != ACTOR and not (batch.is_negative and batch.is_negative[i]):
            groups.setdefault(u, set()).add(scores[i])
    return sum(len(v) > 1 for v in groups.values()) / len(groups) if groups else 0.0


class Mixture:
    def __init__(
        self,
        cfg: TrainConfig,
        tokenizer: Any,
        lm: Any = None,
        samples: bool = True,
        pool: Any = None,
    ) -> None:
        """``lm``: the whole actor policy the support gap is measured with (default: the
        actor's own; under FSDP2, rank 0's unsharded rollout copy). ``samples=False``: a rank
        that never samples (FSDP2 ranks other than 0) loads no fixed model; it only corrects
        the batch rank 0 sampled, and measures no support gap (a metric rank 0 logs).
        ``pool``: the Ray rollout pool, whose workers hold and sample the fixed policies (it
        checked their tokenizer and base before they loaded); the driver loads a fixed model
        only if the support gap of a top-k/top-p sampler needs it."""
        ro, sc = cfg.rollout_only, cfg.rollout_allocation_schedule
        self.schedule = build_schedule(sc, cfg.trainer.seed)
        self.per_sample = sc.per_sample
        self.bypass, self.level, self.threshold = (
            ro.bypass_mode,
            ro.rollout_is,
            ro.rollout_is_threshold,
        )
        self.objective, self.gamma, self.shaping_ratio, self.shaping_normalize = (
            ro.fixed_loss,
            ro.shaping_gamma,
            ro.shaping_ratio,
            ro.shaping_normalize,
        )
        self.mixed, self.k = sc.groups == "mixed", sc.fixed_per_group
        self.guided = ro.guided_min_score if ro.guided_coef > 0 else None  # objective.py
        self._metrics_file = Path(cfg.trainer.output_dir) / "metrics.jsonl"
        self._replayed = False
        specs = fixed_specs(cfg)
        self.labels = [s.label for s in specs]
        self.weights = [s.weight for s in specs]
        actor_path = cfg.actor_rollout_ref.model.path
        self.lm, self.samples = lm, samples
        self.specs = {s.label: s for s in specs}
        if not samples:
            return
        remote = pool.fixed_generators if pool is not None else None
        self.fixed = FixedPolicies(
            specs, tokenizer, actor_path, ro.offload, cfg, remote, check=remote is None
        )
        for spec in specs:
            if spec.params.truncated:
                log.warning(
                    "%s samples with top_k=%s, top_p=%s: tokens outside that support can never "
                    "be sampled on fixed rows and no importance weight repairs it; "
                    "actor/is_support_gap logs the actor's probability mass there",
                    spec.key,
                    spec.params.top_k,
                    spec.params.top_p,
                )

    @contextmanager
    def rollout_parts(
        self,
        step: int,
        tasks: Sequence[Task],
        actor_generator: Any,
        actor_params: SamplingParams,
        labels: Sequence[str] | None = None,
    ) -> Iterator[list[RolloutPart]]:
        """The step's tasks grouped by the policy the schedule gives them (or by ``labels``,
        rank 0's ``allocation`` when every FSDP2 rank samples its share); with offloading, the
        fixed models are loaded here and freed when the block ends."""
        if labels is None:
            labels = self.allocation(step, len(tasks))
        elif len(labels) != len(tasks):
            raise ValueError(f"{len(labels)} policy labels for {len(tasks)} tasks")
        parts = []
        try:
            if self.mixed:  # the actor samples every task; "fixed" adds k samples to its group
                every = list(range(len(tasks)))
                parts.append(RolloutPart(ACTOR, list(tasks), actor_generator, actor_params, every))
            for label in dict.fromkeys(labels):  # first-seen order, deterministic
                idx = [i for i, lab in enumerate(labels) if lab == label]
                sub = [tasks[i] for i in idx]
                if label == ACTOR:
                    if not self.mixed:
                        parts.append(RolloutPart(label, sub, actor_generator, actor_params))
                    continue
                gen, params = self.fixed.generator(label), self.fixed.specs[label].params
                if self.mixed:
                    parts.append(RolloutPart(label, sub, gen, replace(params, n=self.k), idx))
                else:
                    parts.append(RolloutPart(label, sub, gen, params))
            yield parts
        finally:
            self.fixed.release()

    def allocation(self, step: int, n_tasks: int) -> list[str]:
        """The policy label of each of the step's prompt groups (the schedule's draw)."""
        self._replay(step)
        return allocate(self.schedule, step, n_tasks, self.labels, self.weights, self.per_sample)

    def join_groups(self, parts: Sequence[RolloutPart], items: Sequence[Any]) -> list[Any]:
        """After generation: with mixed groups, each fixed sample takes the uid of its task's
        actor group (``groups.join_groups``); whole groups are returned as they are."""
        return join_groups(parts, items)

    def close(self) -> None:
        """Release the fixed policies' vLLM engines (HF models go with the process)."""
        if self.samples:
            self.fixed.close()

    def rollout_metrics(
        self, step: int, policies: Sequence[str], scores: Sequence[float]
    ) -> dict[str, float]:
        """``rollout/policy_choice``: 1 when the actor sampled the step, 0 when a fixed policy
        did (per-sample mixing: the actor's share of groups); ``using_*``: shares of samples."""
        n = max(len(policies), 1)
        actor = [s for p, s in zip(policies, scores, strict=True) if p == ACTOR]
        fixed = [s for p, s in zip(policies, scores, strict=True) if p != ACTOR]
        m = {
            "rollout/policy_choice": len(actor) / n,
            "rollout/using_actor": len(actor) / n,
            "rollout/using_fixed": len(fixed) / n,
        }
        alpha = self.schedule.actor_probability(step)
        if alpha is not None:  # a user schedule may only choose, without an α
            m["rollout/alpha"] = alpha
        if len(self.labels) > 1:
            for label in self.labels:
                m[f"rollout/using/{label}"] = sum(p == label for p in policies) / n
        if actor:
            m["rollout/reward_actor"] = fmean(actor)
        if fixed:
            m["rollout/reward_fixed"] = fmean(fixed)
        self.schedule.observe(m)
        return m

    def _replay(self, step: int) -> None:
        """Once, before the first rollout of a resumed run: feed an adaptive schedule the logged
        metrics of the steps before ``step``, so it continues as if never interrupted."""
        if self._replayed:
            return
        self._replayed = True
        if step <= 1 or not self._metrics_file.is_file():
            return
        for line in self._metrics_file.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] < step:
                self.schedule.observe(rec)

    def correct(self, batch: Batch, actor: Actor, recomputed: bool) -> dict[str, float]:
        """Set the old log-probs / IS weights of fixed-policy rows (see ``correction``).

        ``recomputed``: the trainer already holds the actor's log-probs of every row in
        ``old_logprobs_BR``; otherwise they are computed here, for the fixed rows only."""
        fixed_B = torch.tensor([p != ACTOR for p in batch.policies], dtype=torch.bool)
        metrics: dict[str, float] = {}
        if self.mixed and batch.scores_B is not None:
            scores = batch.scores_B.tolist()
            metrics.update(
                group_signal_metrics(batch.uids, batch.policies, scores, batch.is_negative)
            )
        if not batch.policies or not bool(fixed_B.any()):
            return {"actor/importance_sampling": 0.0, **metrics}
        if recomputed:  # the trainer's mismatch metrics already cover the actor's rows only
            current = batch.old_logprobs_BR
        else:
            rows = fixed_B.nonzero().flatten().tolist()
            lp, _ = actor.compute_logprobs(batch.select(rows))
            current = torch.zeros_like(batch.rollout_logprobs_BR)
            current[fixed_B] = lp
        c = correct_fixed_rows(
            batch.old_logprobs_BR,
            batch.rollout_logprobs_BR,
            current,
            batch.response_mask_BR,
            fixed_B,
            self.bypass,
            self.level,
            self.threshold,
            self.objective,
            self.gamma,
            self.shaping_ratio,
            self.shaping_normalize,
        )
        batch.old_logprobs_BR, batch.is_weights_BR = c.old_logprobs_BR, c.is_weights_BR
        batch.shaping_BR = c.shaping_BR
        self.schedule.observe(c.metrics)
        if self.samples:
            metrics["actor/is_support_gap"] = self._support_gap(batch, actor, fixed_B)
        metrics["rollout/fixed_groups_with_signal"] = fixed_groups_with_signal(batch)
        if self.guided is not None:  # the fixed rows the guided NLL trains on (their successes)
            rows = guided_rows(batch.policies, batch.scores_B, batch.is_negative, self.guided)
            metrics["mixture/guided_row_frac"] = float(rows.sum()) / int(fixed_B.sum())
        return {**c.metrics, **metrics}

    def _support_gap(self, batch: Batch, actor: Actor, fixed_B: torch.Tensor) -> float:
        """``actor/is_support_gap`` over the fixed rows (exactly 0 for samplers that keep every
        token, computed only for top-k/top-p ones: two extra forward passes over their rows)."""
        total, count = 0.0, float(batch.response_mask_BR[fixed_B].sum())
        for label in dict.fromkeys(p for p in batch.policies if p != ACTOR):
            spec = self.specs[label]
            if not spec.params.truncated:
                continue
            rows = [i for i, p in enumerate(batch.policies) if p == label]
            sub = batch.select(rows)
            gap, _ = support_gap(
                self.lm if self.lm is not None else actor.policy,
                actor.temperature,
                self.fixed.policy(label),
                spec.params,
                sub.input_ids_BT,
                sub.attention_mask_BT,
                sub.response_mask_BR,
            )
            total += gap
        return total / count if count else 0.0
