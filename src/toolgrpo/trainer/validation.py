"""In-training validation (``trainer.test_freq``): the same tasks, settings and summaries as
``toolgrpo eval`` (long prompts truncated, not dropped). With the router on, routed evaluation
(``eval.routed``): the sampled, argmax and threshold policies and the fixed-route baselines. It
also calibrates τ on the validation tasks for the current head; the trainer keeps it
(``Trainer.router_calibration``) and the next checkpoint stores it in ``router.pt``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from toolgrpo.data.task import Task
from toolgrpo.eval.episodes import summarize_episodes, summary_metrics
from toolgrpo.eval.evaluate import evaluate, val_sampling_params
from toolgrpo.eval.routed import RoutedSetup, play_routed, routed_metrics
from toolgrpo.router.runtime import RouteCondition
from toolgrpo.trainer.episode_metrics import episode_metrics
from toolgrpo.trainer.episodes import warn_env_failures

if TYPE_CHECKING:
    from toolgrpo.router.runtime import RouterRuntime
    from toolgrpo.trainer.trainer import Trainer


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


def validate(trainer: Trainer, tasks: Sequence[Task], step: int) -> dict[str, float]:
    """``val/...`` metrics of one validation pass."""
    cfg, d = trainer.cfg, trainer.cfg.data
    if trainer.episodes is None:
        res = evaluate(
            trainer.generator,
            trainer.tokenizer,
            tasks,
            val_sampling_params(cfg),
            d.max_prompt_length,
            step,
            trainer.flags,
            batch_size=d.val_batch_size,
        )
        return res.metrics("val")
    runner = trainer.episodes
    params = val_sampling_params(cfg)

    def play(ts: Sequence[Task], conds: Any = None) -> list:
        return runner.play(ts, params, step, trainer.step, rollback=False, conditions=conds)

    routes, extra = None, {}
    if trainer.router is not None:  # routed, as toolgrpo eval plays it
        setup = runtime_setup(trainer.router, runner.router, cfg.trainer.seed, step)
        run = play_routed(setup, tasks, params.n, d.max_prompt_length, play)
        eps, routes, extra = run.episodes, run.routes, routed_metrics(run.report, "val")
        trainer.router_calibration = run.calibrated
    else:
        eps = play(tasks)
    warn_env_failures([e for e in eps if e.env_failure], runner.router, step)
    metrics = {f"val/{k}": v for k, v in episode_metrics(eps).items()}
    # Per task type, exactly as ``toolgrpo eval`` reports them (eval/episodes.py).
    metrics.update(summary_metrics(summarize_episodes(eps, routes=routes), "val"))
    metrics.update(extra)
    return metrics
