"""Playing training tasks under every route to fit the served head's budget offset
(``router/offset.py``): in-training validation does it before it validates, ``toolgrpo eval
--fit-offset`` for a checkpoint saved without one. The tasks are a seeded draw from the
training set (never the held-out tasks the eval scores), played at the rollout's sampling, as
training plays routes, so the cost the fit reads is the one the budget constrained."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from toolgrpo import progress
from toolgrpo.data.task import Task
from toolgrpo.eval.routed import PlayFn, RoutedSetup, episodes_played, play_routed
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.router.offset import OFFSET_KEY, AnswerOffset, fit_answer_offset, unshift_rows
from toolgrpo.router.routes import ANSWER


@dataclass(frozen=True)
class OffsetPlan:
    """What a fit plays: training tasks and the sampling to play them with (n per route)."""

    tasks: Sequence[Task]
    params: SamplingParams


def offset_plan(cfg: Any, train_tasks: Sequence[Task]) -> OffsetPlan | None:
    """``router.offset_tasks`` training tasks (a draw seeded by ``trainer.seed``, the same at
    every validation of a run) and the rollout's sampling with ``router.offset_n`` episodes;
    None when the router, the offset or multi-turn episodes are off."""
    rc, r = cfg.router, cfg.actor_rollout_ref.rollout
    if not (rc.enable and rc.offset_tasks > 0 and r.multi_turn.enable and train_tasks):
        return None
    k = min(int(rc.offset_tasks), len(train_tasks))
    picked = sorted(random.Random(cfg.trainer.seed).sample(range(len(train_tasks)), k))
    params = SamplingParams(
        n=int(rc.offset_n),
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_new_tokens=cfg.data.max_response_length,
        stop=tuple(r.stop),
    )
    return OffsetPlan([train_tasks[i] for i in picked], params)


def binds(budget_state: Mapping[str, Any] | None) -> bool:
    """Whether the budget binds at the end of the run: its dual (the integral, or λ for a state
    without one) is positive."""
    state = budget_state or {}
    dual = state.get("integral")
    return float(dual if dual is not None else state.get("lam", 0.0)) > 0.0


def fit_served_offset(
    setup: RoutedSetup,
    plan: OffsetPlan,
    max_prompt_length: int,
    play: PlayFn,
    binding: bool,
) -> AnswerOffset | None:
    """Play ``plan``'s tasks under every route with the head as it is served now and fit the
    offset from δ = 0 (the probabilities read are un-shifted by the head's current offset first,
    so a refit replaces it). None where no offset applies (no ANSWER route or budget)."""
    routes = setup.routes
    if ANSWER not in routes or setup.budget is None or not plan.tasks:
        return None
    every = replace(setup, baselines=True, threshold=None)

    def counted(ts: Sequence[Task], conds: Any) -> list:  # the fit's own progress phase
        with progress.phase("offset fit", episodes_played(ts, conds, plan.params.n), "episodes"):
            return play(ts, conds)

    run = play_routed(every, plan.tasks, plan.params.n, max_prompt_length, counted)
    current = setup.policy.offset.delta if setup.policy.offset is not None else 0.0
    rows = unshift_rows(run.report["per_task"], current)
    return fit_answer_offset(rows, routes, float(setup.budget), binding, setup.step)


def offset_metrics(fit: AnswerOffset | None, prefix: str = "val") -> dict[str, float]:
    if fit is None:
        return {}
    keys = ("delta", "spend_before", "spend", "binding", "feasible", "tasks")
    return {f"{prefix}/router_offset/{k}": float(getattr(fit, k)) for k in keys}


def save_offset(router_file: Path, fit: AnswerOffset) -> None:
    """Write ``fit`` into a checkpoint's ``router.pt`` (through a temporary file and a rename, so
    a failure leaves the old file whole)."""
    from toolgrpo.models.safe_load import load_torch_file

    state = load_torch_file(router_file)
    state[OFFSET_KEY] = fit.to_state()
    tmp = router_file.with_name(router_file.name + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
    os.replace(tmp, router_file)


def fit_checkpoint_offset(
    cfg: Any, setup: RoutedSetup, runner: Any, checkpoint: str
) -> RoutedSetup:
    """``toolgrpo eval --fit-offset``: fit the offset of a checkpoint's head on the config's
    training tasks (its budget binds where the saved dual is positive), route with it from now
    on and save it in the checkpoint's ``router.pt``. The checkpoint's τ was calibrated for the
    head without this offset, so the returned setup calibrates τ afresh (in-sample, and the
    eval report says so)."""
    from toolgrpo.config.loader import ConfigError
    from toolgrpo.data.loader import load_tasks
    from toolgrpo.models.safe_load import load_torch_file
    from toolgrpo.router.infer import ROUTER_FILE

    d = cfg.data
    plan = offset_plan(cfg, load_tasks(d.train_files, d.bad_rows).tasks)
    if plan is None:
        raise ConfigError(
            "--fit-offset plays the config's training tasks (data.train_files) under every route: "
            "it needs router.enable, router.offset_tasks > 0 and multi-turn episodes"
        )

    def play(ts: Sequence[Task], conds: Any = None) -> list:  # training tasks × every route
        return runner.play(ts, plan.params, 0, 0, rollback=False, conditions=conds)

    path = Path(checkpoint) / ROUTER_FILE
    binding = binds(load_torch_file(path).get("budget"))
    fit = fit_served_offset(setup, plan, d.max_prompt_length, play, binding)
    if fit is None:
        return setup
    setup.policy.serve_offset(fit)
    save_offset(path, fit)
    return replace(setup, threshold=None)
