"""Greedy routing for evaluation: the router head's argmax route (and its route probabilities)
per task, and the episodes' prompt conditions for it. Shared by ``toolgrpo eval`` and
in-training validation, so both play the same routes for the same head and tasks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from toolgrpo.data.task import Task
from toolgrpo.rollout.multi_turn import Condition
from toolgrpo.rollout.prompts import render_prompt

ROUTE_BATCH = 16  # prompts per feature forward


def greedy_routes(
    policy: Any, tasks: Sequence[Task], max_prompt_length: int
) -> tuple[list[str], list[list[float]]]:
    """The argmax route of each task's original prompt (rendered as the trainer's plan renders
    it) under ``policy`` (a ``router.policy.RouterPolicy``), and the head's probability of
    every route (``policy.routes`` order) for that prompt."""
    routes: list[str] = []
    probs: list[list[float]] = []
    for s in range(0, len(tasks), ROUTE_BATCH):
        prompts = [
            render_prompt(policy.lm.tokenizer, t.messages, max_prompt_length, "left")
            for t in tasks[s : s + ROUTE_BATCH]
        ]
        with torch.no_grad():
            out = policy.act(policy.features(prompts), sample=False)
        routes.extend(policy.routes[int(a)] for a in out.router_action)
        probs.extend(out.probs.tolist())
    return routes, probs


def route_conditions(
    routes: Sequence[str], n: int, condition: Callable[[str], Condition]
) -> tuple[list[Condition], list[str]]:
    """One condition and one route name per episode (task-major, ``n`` per task)."""
    per_episode = [r for r in routes for _ in range(n)]
    return [condition(r) for r in per_episode], per_episode
