"""The trainer's hook into the router: plan routes before generation, condition each rollout's
prompt, observe rewards and tool costs after it, update the head and λ once per step.

The trainer calls, per step: ``plan`` (per rollout part), then either ``plan.conditions`` (one
per episode, for the episode loop) or ``rollout`` (single-turn), then ``observe`` with the
step's items and task rewards, then ``update``. Everything else stays inside this package.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from toolgrpo.algos.router import router_rewards
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvStart
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.generator import Completion, SamplingParams
from toolgrpo.rollout.prompts import render_prompt
from toolgrpo.router.budget import Budget
from toolgrpo.router.catalog import build_families, load_labels
from toolgrpo.router.families import FamilyMap
from toolgrpo.router.lm_price import LmPrice
from toolgrpo.router.metrics import observe_metrics
from toolgrpo.router.policy import RouterPolicy
from toolgrpo.router.prompts import condition_messages, condition_start
from toolgrpo.router.routes import ANSWER, CALCULATE, SEARCH
from toolgrpo.router.spec import SPEC_KEY, check_spec, prompt_spec
from toolgrpo.router.usage import CostModel, ToolUsage, usage_of_rollout
from toolgrpo.tools.types import ToolCall

Condition = Callable[[EnvStart], EnvStart]


@dataclass(frozen=True)
class RouteCondition:
    """Rewrites an episode's opening prompt for its route. A dataclass, not a closure, so it
    pickles: in Ray mode episodes (and their conditions) are played on rollout workers."""

    route: str
    families: FamilyMap
    family_tools_only: bool = False

    def __call__(self, start: EnvStart) -> EnvStart:
        return condition_start(start, self.route, self.families, self.family_tools_only)

    def refuse(self, call: ToolCall) -> str | None:
        """The error the model reads for a call its route does not offer, else None (the
        environment runs it). ANSWER offers no tool at all; with ``family_tools_only`` a
        SEARCH / CALCULATE route does not offer the other family's tools."""
        if self.route == ANSWER:
            return (
                "Error: no tools are available on this route; answer directly without calling any."
            )
        if self.family_tools_only and call.name:
            other = CALCULATE if self.route == SEARCH else SEARCH
            if self.families.family(call.name) == other:
                return (
                    f"Error: tool {call.name!r} is not offered on this route; use the tools listed."
                )
        return None


@dataclass
class RoutePlan:
    """Routes for ``n`` rollouts of each task (rows task-major), sampled from the original
    prompts' representations."""

    tasks: list[Task]
    n: int
    features_TH: torch.Tensor
    actions_B: torch.Tensor  # [T * n] route indices
    routes: list[str]  # [T * n] route names
    conditions: list[Condition] = field(default_factory=list)
    # The head and λ learn from these rollouts: False for a fixed policy's (the mixture), whose
    # outcomes are another LM's; they are routed and priced for the LM all the same.
    learn: bool = True


@dataclass
class _Step:
    """One step's router samples, kept between ``observe`` and ``update``."""

    features_BH: torch.Tensor
    actions_B: torch.Tensor
    advantages_B: torch.Tensor
    labels_B: torch.Tensor


class RouterRuntime:
    def __init__(
        self,
        cfg: Any,  # TrainConfig
        lm: Any,  # models.loading.Policy
        tasks: Sequence[Task],
        envs: EnvRouter | None,
        actor: Any = None,  # trainer.actor.Actor: its optimizer and schedule, for router.lr=null
    ) -> None:
        rc = cfg.router
        self.rc = rc
        self.tokenizer = lm.tokenizer
        self.max_prompt_length = cfg.data.max_prompt_length
        self.truncation = cfg.data.truncation
        self.labels = load_labels(rc, tasks, envs)
        label_tools = self.labels.tools if self.labels else None
        self.families = build_families(tasks, envs, rc.families_file, label_tools)
        self.cost = CostModel.from_config(rc.cost)
        self.budget = Budget.from_config(rc)
        self.policy = RouterPolicy(
            lm,
            rc.routes,
            rc.pooling,
            rc.head_hidden,
            rc.lr,
            rc.grad_clip,
            actor.optimizer if actor is not None else None,
            actor.scheduler if actor is not None else None,
            feature_layer=rc.feature_layer,
            inputs=rc.inputs,
            tool_format=cfg.actor_rollout_ref.rollout.multi_turn.format,
            feature_norm=rc.feature_norm,
            head_ema=rc.head_ema,
        )
        self.policy.read_tasks_with(envs, self.max_prompt_length)
        self.routes = self.policy.routes
        alg = cfg.algorithm
        # The LM's own group normalisation, for its cost advantages (lagrangian=advantage).
        self.lm_norm_by_std = alg.adv_estimator == "grpo" and alg.norm_adv_by_std_in_grpo
        self._plans: list[RoutePlan] = []
        self._step: _Step | None = None
        self._costs: list[float] = []  # this step's cost per rollout, in plan order
        self._lam = self.budget.lam  # the λ this step's rewards were shaped with
        self._spread = 1.0

    @property
    def freeze_lm(self) -> bool:
        return bool(self.rc.freeze_lm)

    # ---- before generation ------------------------------------------------------------------
    def plan(self, tasks: Sequence[Task], n: int, learn: bool = True) -> RoutePlan:
        """Sample a route for each of the ``n`` rollouts of every task. ``learn=False``: another
        policy than the actor plays them (a fixed policy of the mixture), so the head, λ and the
        price scale leave them out (a sequence IS weight over a whole episode would be their
        only correction); the LM still trains on them at the step's price."""
        feats = self.policy.features_of(tasks)
        self.policy.observe(feats)  # one row per task: the statistics of the prompts routed
        out = self.policy.act(feats.repeat_interleave(n, dim=0), sample=True)
        routes = [self.routes[int(a)] for a in out.router_action]
        plan = RoutePlan(list(tasks), n, feats, out.router_action, routes, learn=learn)
        plan.conditions = [self._condition(r) for r in routes]
        self._plans.append(plan)
        return plan

    def _condition(self, route: str) -> Condition:
        return RouteCondition(route, self.families, self.rc.family_tools_only)

    def route_conditions(self) -> list[RouteCondition]:
        """One condition per route, in ``routes`` order (to measure every route's prompt)."""
        return [RouteCondition(r, self.families, self.rc.family_tools_only) for r in self.routes]

    def rollout(
        self, plan: RoutePlan, generator: Any, params: SamplingParams
    ) -> list[tuple[Completion, str, Task]]:
        """Single-turn rollouts of a plan, as ``(completion, uid, task)`` in plan row order."""
        return routed_rollout(
            plan.tasks,
            plan.n,
            plan.conditions,
            generator,
            params,
            self.tokenizer,
            self.max_prompt_length,
            self.truncation,
        )

    # ---- after generation -------------------------------------------------------------------
    def observe(self, items: Sequence[Any], task_rewards: Sequence[float]) -> dict[str, float]:
        """Costs and router rewards of the step's rollouts (episodes, or single-turn
        ``(completion, uid, task)`` items, in plan order); advantages kept for ``update``."""
        plans, self._plans = self._plans, []
        rows = sum(len(p.routes) for p in plans)
        if rows != len(items) or len(items) != len(task_rewards):
            raise ValueError(f"{rows} planned routes, {len(items)} rollouts, {len(task_rewards)}")
        usages = [self._usage(it) for it in items]
        costs = [self.cost.cost(u) for u in usages]
        uids = [it.uid if isinstance(it, Episode) else it[1] for it in items]
        types = [it.task_type if isinstance(it, Episode) else it[2].task_type for it in items]
        lam = self.budget.lam
        task_B = torch.tensor(list(task_rewards), dtype=torch.float32)
        cost_B = torch.tensor(costs, dtype=torch.float32)
        reward_B = router_rewards(task_B, cost_B, lam)
        tasks = [t for p in plans for t in p.tasks for _ in range(p.n)]
        skip = [not p.learn for p in plans for _ in range(len(p.routes))]
        rc = self.rc
        adv_B = self.budget.advantages(
            task_B, cost_B, uids, rc.lagrangian, rc.norm_adv_by_std, skip
        )
        keep = torch.tensor([not x for x in skip], dtype=torch.bool)
        self._step = _Step(
            features_BH=torch.cat([p.features_TH.repeat_interleave(p.n, 0) for p in plans])[keep],
            actions_B=torch.cat([p.actions_B for p in plans])[keep],
            advantages_B=adv_B[keep],
            labels_B=torch.tensor([self._label(t) for t in tasks], dtype=torch.long)[keep],
        )
        self._costs, self._lam = costs, lam
        self._spread = self.budget.scale  # lagrangian=price: the LM's cost scale, the head's s
        self.budget.observe([c for c, x in zip(costs, skip, strict=True) if not x])
        routes = [r for p in plans for r in p.routes]
        metrics = observe_metrics(
            routes, types, usages, task_B, cost_B, reward_B, lam, self.budget.budget
        )
        metrics["router/price_scale"] = self._spread
        metrics["router/learned_frac"] = float(keep.float().mean()) if len(skip) else 0.0
        return metrics

    # ---- the LM's reward (router.lm_reward) --------------------------------------------------
    def bind_rows(self, rows: Sequence[int | None]) -> LmPrice:
        """The LM's λ·cost for a batch whose rows are these observed rollouts (``None``: a
        rolled-back negative, no rollout of its own); it travels with the batch."""
        cost_B = torch.tensor(
            [self._costs[i] if i is not None else float("nan") for i in rows], dtype=torch.float32
        )
        rc = self.rc
        return LmPrice(
            cost_B, self._lam, self._spread, rc.lm_reward, rc.lagrangian, self.lm_norm_by_std
        )

    def _usage(self, item: Any) -> ToolUsage:
        return usage_of_rollout(item, self.families, self.tokenizer)

    def _label(self, task: Task) -> int:
        label = self.labels.examples.get(task.task_id) if self.labels else None
        return self.routes.index(label) if label in self.routes else -1

    def update(self) -> dict[str, float]:
        """One step of the head on this step's rollouts, then the dual step when it is due."""
        if self._step is None:
            return {}
        s, self._step = self._step, None
        rc = self.rc
        if s.actions_B.numel():
            metrics = self.policy.update(
                s.features_BH,
                s.actions_B,
                s.advantages_B,
                rc.entropy_coeff,
                s.labels_B,
                rc.label_coeff,
            )
            metrics["router/labelled_frac"] = float((s.labels_B >= 0).float().mean())
        else:  # every rollout was a fixed policy's: the head has nothing of its own to learn
            metrics = {"router/pg_loss": 0.0, "router/loss": 0.0, "router/labelled_frac": 0.0}
        metrics["router/dual_step"] = float(self.budget.step())
        metrics["router/lambda_next"] = self.budget.lam
        return metrics

    # ---- checkpoints ------------------------------------------------------------------------
    def prompt_spec(self) -> dict[str, Any]:
        return prompt_spec(self.families, self.rc.family_tools_only, self.cost)

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.policy.state_dict(),
            "budget": self.budget.state_dict(),
            SPEC_KEY: self.prompt_spec(),
        }

    def load_state_dict(self, state: dict[str, Any], where: str = "router.pt") -> None:
        check_spec(state.get(SPEC_KEY), self.prompt_spec(), where)
        self.policy.load_state_dict(state)
        self.budget.load_state_dict(state.get("budget", {}))


def generate_counts(
    generator: Any, prompts: list[list[int]], counts: list[int], params: SamplingParams
) -> list[list[Completion]]:
    """``counts[i]`` completions of ``prompts[i]``: one generate call per distinct count, so
    prompts drawn several times still share their prefill."""
    out: list[list[Completion]] = [[] for _ in prompts]
    by_count: dict[int, list[int]] = {}
    for i, k in enumerate(counts):
        by_count.setdefault(k, []).append(i)
    for k, idx in sorted(by_count.items()):
        for c in generator.generate([prompts[i] for i in idx], replace(params, n=k)):
            out[idx[c.prompt_index]].append(c)
    return out


def routed_rollout(
    tasks: Sequence[Task],
    n: int,
    conditions: Sequence[Any],  # RouteCondition per row (tasks × n, task-major)
    generator: Any,
    params: SamplingParams,
    tokenizer: Any,
    max_prompt_length: int,
    truncation: str,
) -> list[tuple[Completion, str, Task]]:
    """Single-turn rollouts under planned routes, as ``(completion, uid, task)`` in row order:
    one prompt per (task, route), sampled as many times as that route was drawn. Needs no head,
    so every FSDP2 rank can sample its share of a plan made on rank 0."""
    rows_of: dict[tuple[int, str], list[int]] = {}  # (task, route) → its rows, first-seen order
    cond_of: dict[tuple[int, str], Any] = {}
    for row, cond in enumerate(conditions):
        key = (row // n, cond.route)
        rows_of.setdefault(key, []).append(row)
        cond_of.setdefault(key, cond)
    prompts = [
        render_prompt(
            tokenizer,
            condition_messages(tasks[t].messages, c.route, c.families, c.family_tools_only),
            max_prompt_length,
            truncation,
        )
        for (t, _), c in cond_of.items()
    ]
    counts = [len(rows) for rows in rows_of.values()]
    comps = generate_counts(generator, prompts, counts, params)
    uids = [uuid.uuid4().hex for _ in tasks]
    out: list[Any] = [None] * len(conditions)
    for ((t, _), rows), got in zip(rows_of.items(), comps, strict=True):
        for row, comp in zip(rows, got, strict=True):
            out[row] = (comp, uids[t], tasks[t])
    return out
