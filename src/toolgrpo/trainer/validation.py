"""In-training validation (``trainer.test_freq``): the same tasks, settings and summaries as
``toolgrpo eval`` (long prompts truncated, not dropped). With the router on, routed evaluation
(``eval.routed``): the sampled, argmax and threshold policies and the fixed-route baselines. It
also calibrates τ on the validation tasks for the current head (``Validated.calibrated``); the
trainer keeps it and the next checkpoint stores it in ``router.pt``. Before that it fits the
served head's budget offset on training tasks (``eval.offset_fit``), kept by the head itself
(``router.pt`` again), so validation scores the head as eval and infer will route with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolgrpo import progress
from toolgrpo.config.schema import DataConfig
from toolgrpo.data.task import Task
from toolgrpo.eval.episodes import summarize_episodes, summary_metrics
from toolgrpo.eval.evaluate import evaluate
from toolgrpo.eval.offset_fit import OffsetPlan, binds, fit_served_offset, offset_metrics
from toolgrpo.eval.routed import RoutedSetup, episodes_played, play_routed, routed_metrics
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.router.calibrate import Threshold
from toolgrpo.router.runtime import RouteCondition
from toolgrpo.trainer.episode_metrics import episode_metrics
from toolgrpo.trainer.episodes import warn_env_failures

if TYPE_CHECKING:
    from toolgrpo.router.runtime import RouterRuntime
    from toolgrpo.trainer.episodes import EpisodeRunner


def runtime_setup(rt: RouterRuntime, envs: Any, seed: int = 0, step: int = -1) -> RoutedSetup:
    """The training run's head, families, cost model and budget, as evaluation plays them (τ is
    calibrated afresh on the validation tasks: the head has moved since the last one)."""
    return RoutedSetup(
        rt.policy,
        lambda r: RouteCondition(r, rt.families, rt.rc.family_tools_only),
        rt.families,
        rt.cost,
        rt.budget.budget,
        rt.rc.eval_baselines,
        envs,
        seed=seed,
        step=step,
    )


@dataclass(frozen=True)
class ValSetup:
    """What a validation pass plays with: the trainer's generator (single-turn) or environments
    (``episodes``), its router, and the config's validation settings."""

    generator: Any
    tokenizer: Any
    params: SamplingParams  # val_sampling_params: actor_rollout_ref.rollout.val_kwargs
    data: DataConfig  # max_prompt_length, val_batch_size
    flags: RllaFlags
    seed: int  # trainer.seed: the routed evaluation's route draws
    episodes: EpisodeRunner | None = None
    router: RouterRuntime | None = None
    offset: OffsetPlan | None = None  # training tasks to fit the served head's budget offset on


@dataclass
class Validated:
    """One validation pass: its ``val/...`` metrics and, when it was a routed evaluation
    (router and environments on), the τ of threshold routing calibrated for the current head
    (None where it could not be: no ANSWER route or budget)."""

    metrics: dict[str, float]
    routed: bool = False
    calibrated: Threshold | None = None


def validate(val: ValSetup, tasks: Sequence[Task], step: int, version: int) -> Validated:
    """``val/...`` metrics of one validation pass at ``step``, played by policy ``version``."""
    d = val.data
    if val.episodes is None:
        with progress.phase("validation", len(tasks) * val.params.n, "samples"):
            res = evaluate(
                val.generator,
                val.tokenizer,
                tasks,
                val.params,
                d.max_prompt_length,
                step,
                val.flags,
                batch_size=d.val_batch_size,
            )
        return Validated(res.metrics("val"))
    runner, params = val.episodes, val.params

    def play(ts: Sequence[Task], conds: Any = None) -> list:
        with progress.phase("validation", episodes_played(ts, conds, params.n), "episodes"):
            return runner.play(ts, params, step, version, rollback=False, conditions=conds)

    routes, extra, run = None, {}, None
    if val.router is not None:  # routed, as toolgrpo eval plays it (router.head_ema's head)
        setup = runtime_setup(val.router, runner.router, val.seed, step)
        if val.offset is not None:  # the offset first: validation scores the head as served
            plan = val.offset

            def play_train(ts: Sequence[Task], conds: Any = None) -> list:
                return runner.play(ts, plan.params, step, version, rollback=False, conditions=conds)

            binding = binds(val.router.budget.state_dict())
            with val.router.policy.averaged():
                fit = fit_served_offset(setup, plan, d.max_prompt_length, play_train, binding)
            if fit is not None:
                val.router.policy.offset = fit
            extra = offset_metrics(fit)
        with val.router.policy.averaged():
            run = play_routed(setup, tasks, params.n, d.max_prompt_length, play)
        eps, routes = run.episodes, run.routes
        extra = {**extra, **routed_metrics(run.report, "val")}
    else:
        eps = play(tasks)
    warn_env_failures([e for e in eps if e.env_failure], runner.router, step)
    metrics = {f"val/{k}": v for k, v in episode_metrics(eps).items()}
    # Per task type, exactly as ``toolgrpo eval`` reports them (eval/episodes.py).
    metrics.update(summary_metrics(summarize_episodes(eps, routes=routes), "val"))
    metrics.update(extra)
    if run is None:
        return Validated(metrics)
    return Validated(metrics, routed=True, calibrated=run.calibrated)
