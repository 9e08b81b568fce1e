"""``toolgrpo infer``: play one episode for a prompt and print its turns, tool calls and results."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel

from toolgrpo.config.loader import load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.data.loader import check_text
from toolgrpo.data.task import Task
from toolgrpo.distributed.fsdp import resolve_device
from toolgrpo.envs.plugins import load_run_plugins
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.errors import DataError
from toolgrpo.eval.cli import apply_checkpoint
from toolgrpo.eval.evaluate import val_sampling_params
from toolgrpo.models.loading import load_policy
from toolgrpo.rewards.types import RllaFlags
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.hf import HFGenerator
from toolgrpo.rollout.multi_turn import play_task
from toolgrpo.router.infer import describe, route_for_infer
from toolgrpo.run_log import RunLog
from toolgrpo.trainer.episodes import episode_limits, make_router

_STYLE = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "yellow"}


def run_infer(
    config_path: str | None,
    overrides: list[str],
    prompt: str,
    task_type: str,
    checkpoint: str | None = None,
    ground_truth: str = "",
    system: str | None = None,
    sample: bool = False,
    console: Console | None = None,
    route: str | None = None,
    imports: Sequence[str] = (),
) -> Episode:
    """One episode of ``prompt`` in the environment of ``task_type``; printed and returned.
    With a router (a checkpoint's ``router.pt``, or ``router.enable``), the route is chosen
    first and conditions the prompt; ``route`` forces one."""
    for text, what in ((prompt, "the prompt"), (system or "", "--system")):
        try:
            check_text(text, what)  # a lone surrogate (argv bytes that are not UTF-8)
        except ValueError as e:
            raise DataError(str(e)) from None
    cfg = load_config(TrainConfig, config_path, overrides)
    load_run_plugins(cfg, imports)  # --import and trainer.imports: users' env types
    if checkpoint:
        apply_checkpoint(cfg, checkpoint)
    router = make_router(cfg, RllaFlags(**vars(cfg.reward.rlla)))
    router.check({task_type})
    # then the model: the libraries' start-up lines go to run.log, as train's and eval's do
    run_log = RunLog(Path(cfg.trainer.output_dir), cfg.trainer.verbose)
    try:
        return _play(
            cfg, router, prompt, task_type, checkpoint, ground_truth, system, sample, console, route
        )
    finally:
        run_log.close()


def _play(
    cfg: TrainConfig,
    router: EnvRouter,
    prompt: str,
    task_type: str,
    checkpoint: str | None,
    ground_truth: str,
    system: str | None,
    sample: bool,
    console: Console | None,
    route: str | None,
) -> Episode:
    policy = load_policy(
        cfg.actor_rollout_ref.model, trainable=False, device=resolve_device(cfg.trainer.device)
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    task = Task("infer", tuple(messages), ground_truth, task_type, task_type)
    r = cfg.actor_rollout_ref.rollout
    params = val_sampling_params(cfg)
    if sample:
        params = replace(params, do_sample=True, temperature=r.temperature, top_p=r.top_p)
    console = console or Console()
    choice, condition = route_for_infer(cfg, policy, task, checkpoint, sample, route, router)
    if choice is not None:
        console.print(describe(choice))
    gen = HFGenerator(policy.model, policy.tokenizer, policy.dtype, 1)
    batcher = GenerationBatcher(gen, params)
    try:
        env, limits = router.make(task), episode_limits(cfg)
        ep = asyncio.run(
            play_task(task, env, batcher, policy.tokenizer, limits, condition=condition)
        )
    finally:
        batcher.close()
    print_episode(ep, console, scored=bool(ground_truth))
    return ep


def print_episode(ep: Episode, console: Console, scored: bool = True) -> None:
    for m in ep.messages:
        role = m.get("role", "?")
        title = role if role != "tool" else f"tool · {m.get('name') or '?'}"
        console.print(Panel(str(m.get("content", "")), title=title, style=_STYLE.get(role, "")))
    parts = ", ".join(f"{k}={v:.3g}" for k, v in ep.reward_parts.items())
    reward = f"reward={ep.reward:.3f}" + (f" ({parts})" if parts else "")
    console.print(
        f"turns={ep.num_turns} tool_calls={ep.tool_calls} tool_errors={ep.tool_errors} "
        f"stop={ep.stop_reason} " + (reward if scored else "reward=n/a (no --ground-truth)")
    )
