"""``toolgrpo eval`` for tasks played in environments: episodes with the trainer's own runner and
environments (greedy by default), routed by a checkpoint's router head when it has one (argmax,
``eval.routes``), scored by ``eval.episodes`` exactly as validation scores them.

The command's episode branch, so it sits beside the CLI: it reuses ``trainer.episodes`` on purpose
(the same runner as ``Trainer.validate``); nothing below the CLI imports this module."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from toolgrpo import progress
from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.eval.episodes import (
    ALL,
    sample_transcripts,
    summarize_episodes,
    summary_metrics,
)
from toolgrpo.eval.evaluate import val_sampling_params
from toolgrpo.eval.routes import greedy_routes, route_conditions
from toolgrpo.models.loading import load_policy
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.backends import backend_name, make_generator
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.multi_turn import Condition
from toolgrpo.router.catalog import build_families
from toolgrpo.router.infer import ROUTER_FILE, load_router
from toolgrpo.router.runtime import RouteCondition
from toolgrpo.trainer.episodes import EpisodeRunner, make_router
from toolgrpo.trainer.rollout_dump import make_dumper


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


def evaluate_episodes(
    cfg: TrainConfig,
    policy: Any,
    tasks: Sequence[Task],
    keep_samples: int,
    checkpoint: str | None = None,
) -> dict[str, Any]:
    """Play every task (``val_kwargs.n`` episodes each), routed by the checkpoint's router head
    when it has one, and summarise per task type."""
    envs = check_episode_eval(cfg, tasks, checkpoint)
    conditions, routes = None, None
    if router_head(cfg, checkpoint):
        head, _ = load_router(cfg, policy, checkpoint)
        rc = cfg.router
        families = build_families(tasks, envs, rc.families_file)
        picked = greedy_routes(head, tasks, cfg.data.max_prompt_length)
        n = val_sampling_params(cfg).n
        conditions, routes = route_conditions(
            picked, n, lambda r: RouteCondition(r, families, rc.family_tools_only)
        )
    generator = make_generator(cfg, policy)
    t0 = time.time()
    try:
        runner = EpisodeRunner(cfg, generator, policy.tokenizer, envs)
        with progress.phase("episodes", len(tasks) * val_sampling_params(cfg).n, "episodes"):
            episodes = play_validation(runner, cfg, tasks, 0, 0, conditions)
    finally:
        close = getattr(generator, "close", None)
        if close is not None:
            close()
    if (dumper := make_dumper(cfg.trainer)) is not None:
        dumper.write_episodes(0, episodes, policy.tokenizer, routes=routes)
    summary = summarize_episodes(episodes, routes=routes)
    return {
        "mode": "episodes",
        "backend": backend_name(cfg),
        "routed": routes is not None,
        "sampling": asdict(val_sampling_params(cfg)),
        "num_tasks": len(tasks),
        "num_episodes": len(episodes),
        "seconds": time.time() - t0,
        "summary": summary,
        "metrics": summary_metrics(summary, "val"),
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


def run_episode_eval(
    cfg: TrainConfig,
    tasks: Sequence[Task],
    label: str,
    out: Path,
    keep_samples: int,
    checkpoint: str | None = None,
    policy: Any = None,
) -> int:
    """``toolgrpo eval``'s episode branch: check, load the policy (unless given), play, write
    the JSON, print the table."""
    check_episode_eval(cfg, tasks, checkpoint)
    if policy is None:
        policy = load_policy(cfg.actor_rollout_ref.model, trainable=False)
    if router_head(cfg, checkpoint):
        print(f"routing each task with {checkpoint}'s router head (argmax)")
    record = {
        "model": label,
        "val_files": list(cfg.data.val_files),
        **evaluate_episodes(cfg, policy, tasks, keep_samples, checkpoint),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print_episode_table(label, cfg.data.val_files, record)
    print(f"wrote {out}")
    return 0
