"""``toolgrpo eval`` for tasks played in environments: episodes with the trainer's own runner and
environments (greedy by default), routed by a checkpoint's router head when it has one
(``eval.routed``: its sampled, argmax and threshold policies), scored by ``eval.episodes`` exactly
as validation scores them.

The command's episode branch, so it sits beside the CLI: it reuses ``trainer.episodes`` on purpose
(the same runner as ``Trainer.validate``); nothing below the CLI imports this module."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from toolgrpo import progress, safe_io
from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.task import Task
from toolgrpo.distributed.fsdp import resolve_device
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.eval.episodes import (
    ALL,
    sample_transcripts,
    summarize_episodes,
    summary_metrics,
)
from toolgrpo.eval.evaluate import val_sampling_params
from toolgrpo.eval.offset_fit import fit_checkpoint_offset
from toolgrpo.eval.routed import (
    RoutedSetup,
    episodes_played,
    play_routed,
    report_lines,
    routed_metrics,
)
from toolgrpo.models.loading import load_policy
from toolgrpo.models.safe_load import load_torch_file
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.backends import backend_name, make_generator
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.multi_turn import Condition
from toolgrpo.router.calibrate import THRESHOLD_KEY, Threshold
from toolgrpo.router.catalog import build_families
from toolgrpo.router.infer import ROUTER_FILE, load_router
from toolgrpo.router.runtime import RouteCondition
from toolgrpo.router.spec import SPEC_KEY, families_from_spec
from toolgrpo.router.usage import CostModel
from toolgrpo.trainer.episodes import EpisodeRunner, make_router
from toolgrpo.trainer.rollout_dump import make_dumper

log = logging.getLogger(__name__)


def plays_episodes(cfg: TrainConfig, tasks: Sequence[Task]) -> bool:
    """Episodes whenever validation would play them: multi-turn on, or any environment task."""
    return cfg.actor_rollout_ref.rollout.multi_turn.enable or any(
        t.task_type != "rlla" for t in tasks
    )


def play_validation(
    runner: EpisodeRunner,
    cfg: TrainConfig,
    tasks: Sequence[Task],
    step: int,
    version: int,
    conditions: Sequence[Condition] | None = None,
) -> list[Episode]:
    """Validation episodes: ``val_kwargs`` sampling, the policy as is (no tool rollback), the
    same call as ``Trainer.validate``; ``conditions`` are the router's greedy routes."""
    return runner.play(
        tasks, val_sampling_params(cfg), step, version, rollback=False, conditions=conditions
    )


def router_head(cfg: TrainConfig, checkpoint: str | None) -> bool:
    """Whether eval plays routes: the checkpoint has a router head (as ``toolgrpo infer``
    decides). ``router.enable`` without one is refused: an untrained head routes at random."""
    has_head = bool(checkpoint) and (Path(str(checkpoint)) / ROUTER_FILE).is_file()
    if cfg.router.enable and not has_head:
        where = f"{checkpoint} has no {ROUTER_FILE}" if checkpoint else "no --checkpoint given"
        raise ConfigError(
            f"router.enable=true but {where}: evaluate a checkpoint trained with the router, or "
            "set router.enable=false to score the LM on the environments' own prompts"
        )
    return has_head


def check_episode_eval(
    cfg: TrainConfig, tasks: Sequence[Task], checkpoint: str | None = None
) -> EnvRouter:
    """Before any model is loaded: a router head if one is asked for, an environment for every
    task type."""
    router_head(cfg, checkpoint)
    router = make_router(cfg, RllaFlags(**asdict(cfg.reward.rlla)))
    router.check({t.task_type for t in tasks})
    return router


def checkpoint_setup(
    cfg: TrainConfig, policy: Any, checkpoint: str, tasks: Sequence[Task], envs: EnvRouter
) -> RoutedSetup:
    """The checkpoint's head with the prompts it was trained with (``router.pt``'s saved
    families, ``family_tools_only`` and cost model; the config's for an older ``router.pt``)."""
    head, _ = load_router(cfg, policy, checkpoint)
    head.read_tasks_with(envs, cfg.data.max_prompt_length)
    state = load_torch_file(Path(checkpoint) / ROUTER_FILE)
    spec = state.get(SPEC_KEY)
    rc = cfg.router
    families = build_families(tasks, envs, "" if spec else rc.families_file)
    tools_only = rc.family_tools_only
    cost = CostModel.from_config(rc.cost)
    if spec:  # the training run's families win; tools it never saw keep the heuristic
        families.overrides.update(families_from_spec(spec).overrides)
        tools_only = bool(spec["family_tools_only"])
        cost = CostModel(**spec["cost"])
    budget = (state.get("budget") or {}).get("budget", rc.budget)
    setup = RoutedSetup(
        head,
        lambda r: RouteCondition(r, families, tools_only),
        families,
        cost,
        float(budget),
        rc.eval_baselines,
        envs,
        seed=cfg.trainer.seed,
        threshold=Threshold.from_state(state.get(THRESHOLD_KEY)),
        step=checkpoint_step(checkpoint),
    )
    check_threshold(setup, checkpoint)
    return setup


def checkpoint_step(checkpoint: str) -> int:
    """The training step a checkpoint was saved at (-1 when it does not say)."""
    try:
        state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
        return int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


def check_threshold(setup: RoutedSetup, checkpoint: str) -> None:
    """Warn when the checkpoint's τ is missing (eval then calibrates one on its own tasks, which
    makes the threshold policy's numbers in-sample) or was fit to an earlier head."""
    thr = setup.threshold
    if thr is None:
        log.warning(
            "%s/%s has no calibrated threshold (saved before any validation, or by an older "
            "toolgrpo): router_threshold uses a τ calibrated on these eval tasks (in-sample)",
            checkpoint,
            ROUTER_FILE,
        )
    elif thr.step >= 0 and setup.step >= 0 and thr.step != setup.step:
        log.warning(
            "%s: τ was calibrated at step %d's validation, the head is step %d's: save "
            "checkpoints at validation steps (trainer.save_freq a multiple of test_freq)",
            checkpoint,
            thr.step,
            setup.step,
        )


def evaluate_episodes(
    cfg: TrainConfig,
    policy: Any,
    tasks: Sequence[Task],
    keep_samples: int,
    checkpoint: str | None = None,
    fit_offset: bool = False,
) -> dict[str, Any]:
    """Play every task (``val_kwargs.n`` episodes each), routed by the checkpoint's router head
    when it has one (with the fixed-route baselines, ``router.eval_baselines``; ``fit_offset``:
    with a budget offset fit first on training tasks, ``eval.offset_fit``), and summarise per
    task type."""
    envs = check_episode_eval(cfg, tasks, checkpoint)
    generator = make_generator(cfg, policy)
    t0 = time.time()
    routes, routing = None, None
    try:
        runner = EpisodeRunner(cfg, generator, policy.tokenizer, envs)
        n = val_sampling_params(cfg).n

        def play(ts: Sequence[Task], conds: Any = None) -> list[Episode]:
            with progress.phase("episodes", episodes_played(ts, conds, n), "episodes"):
                return play_validation(runner, cfg, ts, 0, 0, conds)

        if checkpoint and router_head(cfg, checkpoint):
            setup = checkpoint_setup(cfg, policy, checkpoint, tasks, envs)
            if fit_offset:
                setup = fit_checkpoint_offset(cfg, setup, runner, checkpoint)
            run = play_routed(setup, tasks, n, cfg.data.max_prompt_length, play)
            episodes, routes, routing = run.episodes, run.routes, run.report
            offset = setup.policy.offset
            routing["offset"] = offset.to_state() if offset is not None else None
        else:
            episodes = play(tasks)
    finally:
        close = getattr(generator, "close", None)
        if close is not None:
            close()
    if (dumper := make_dumper(cfg.trainer)) is not None:
        dumper.write_episodes(0, episodes, policy.tokenizer, routes=routes)
    summary = summarize_episodes(episodes, routes=routes)
    metrics = summary_metrics(summary, "val")
    if routing is not None:
        metrics.update(routed_metrics(routing, "val"))
    return {
        "mode": "episodes",
        "backend": backend_name(cfg, policy.base.config),
        "routed": routes is not None,
        "sampling": asdict(val_sampling_params(cfg)),
        "num_tasks": len(tasks),
        "num_episodes": len(episodes),
        "seconds": time.time() - t0,
        "summary": summary,
        "routing": routing,
        "metrics": metrics,
        "samples": sample_transcripts(episodes, tasks, keep_samples, routes),
    }


def episode_table(title: str, summary: dict[str, dict[str, Any]]) -> Table:
    """One row per task type (and ``all``)."""
    table = Table(title=title)
    cols = ("type", "n", "accuracy ± SE", "reward", "call rate", "calls/ep", "error rate")
    for col in (*cols, "turns", "tokens"):
        table.add_column(col)
    for t, s in summary.items():
        table.add_row(
            t,
            str(s["episodes"]),
            f"{s['accuracy']:.1%} ± {s['accuracy_se']:.1%}",
            f"{s['reward_mean']:.3f}",
            f"{s['tool_call_rate']:.0%}",
            f"{s['calls_per_episode']:.2f}",
            f"{s['tool_error_rate']:.0%}",
            f"{s['turns_mean']:.1f}",
            f"{s['sampled_tokens_mean']:.0f}",
        )
    return table


def detail_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Per task type: tool errors by type and stop reasons (too wide for the table)."""
    lines = []
    for t, s in summary.items():
        errors = ", ".join(f"{k} {d['count']}" for k, d in s["tool_errors"].items()) or "none"
        stops = ", ".join(f"{k} {v:.0%}" for k, v in sorted(s["stop_reasons"].items()))
        line = f"{t}: tool errors {errors}; stops {stops}"
        if "routes" in s:
            line += "; routes " + ", ".join(f"{k} {v:.0%}" for k, v in s["routes"].items())
        lines.append(line)
    if ALL in summary and len(summary) > 2:
        a = summary[ALL]
        lines.append(
            f"mean accuracy over task types: {a['type_mean_accuracy']:.1%} "
            f"± {a['type_mean_accuracy_se']:.1%}"
        )
    return lines


def print_episode_table(label: str, val_files: Sequence[str], record: dict[str, Any]) -> None:
    title = f"toolgrpo eval: {label} on {', '.join(val_files)} ({record['backend']})"
    console = Console()
    if not console.is_terminal:  # logs: wide enough for the table instead of rich's 80 columns
        console = Console(width=110)
    console.print(episode_table(title, record["summary"]))
    for line in detail_lines(record["summary"]):
        console.print(line, highlight=False)
    if record.get("routing"):
        for line in report_lines(record["routing"]):
            console.print(line, highlight=False)


def run_episode_eval(
    cfg: TrainConfig,
    tasks: Sequence[Task],
    label: str,
    out: Path,
    keep_samples: int,
    checkpoint: str | None = None,
    policy: Any = None,
    logs: Path | None = None,
    fit_offset: bool = False,
) -> int:
    """``toolgrpo eval``'s episode branch: check, load the policy (unless given), play, write
    the JSON, print the table (and where the library logs went: ``logs``)."""
    check_episode_eval(cfg, tasks, checkpoint)
    if fit_offset and not router_head(cfg, checkpoint):
        raise ConfigError(
            "--fit-offset fits a router head's budget offset: give --checkpoint a checkpoint "
            "with a router.pt"
        )
    if policy is None:
        policy = load_policy(
            cfg.actor_rollout_ref.model,
            trainable=False,
            device=resolve_device(cfg.trainer.device),
        )
    if router_head(cfg, checkpoint):
        print(
            f"routing each task with {checkpoint}'s router head (sampled, argmax and threshold "
            "policies; the headline is the sampled one when the budget binds)"
        )
    record = {
        "model": label,
        "val_files": list(cfg.data.val_files),
        **evaluate_episodes(cfg, policy, tasks, keep_samples, checkpoint, fit_offset),
    }
    safe_io.write_text(out, json.dumps(record, indent=1))  # never through a link
    print_episode_table(label, cfg.data.val_files, record)
    print(f"wrote {out}" + (f"  (library logs: {logs})" if logs else ""))
    return 0
