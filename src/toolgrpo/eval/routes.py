"""Routing for evaluation: the router head's argmax route (and its route probabilities) per task,
a seeded draw from those probabilities, and the episodes' prompt conditions. Shared by
``toolgrpo eval`` and in-training validation, so both play the same routes for the same head."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from toolgrpo.data.task import Task
from toolgrpo.rollout.multi_turn import Condition

ROUTE_BATCH = 16  # prompts per feature forward


def greedy_routes(
    policy: Any, tasks: Sequence[Task], max_prompt_length: int
) -> tuple[list[str], list[list[float]]]:
    """The argmax route of each task under ``policy`` (a ``router.policy.RouterPolicy``), read
    as the trainer's plan reads it (``router.inputs``), and the head's probability of every
    route (``policy.routes`` order) for that task."""
    routes: list[str] = []
    probs: list[list[float]] = []
    for s in range(0, len(tasks), ROUTE_BATCH):
        with torch.no_grad():
            feats = policy.features_of(tasks[s : s + ROUTE_BATCH], max_prompt_length)
            out = policy.act(feats, sample=False)
        routes.extend(policy.routes[int(a)] for a in out.router_action)
        probs.extend(out.probs.tolist())
    return routes, probs


def sampled_routes(
    probs: Sequence[Sequence[float]], routes: Sequence[str], seed: int = 0
) -> list[str]:
    """One route per task drawn from its probabilities (``routes`` order), by a generator seeded
    with ``seed``: the same head, tasks and seed draw the same routes (eval agrees with
    validation, and successive validations share their random numbers)."""
    rng = random.Random(seed)
    out = []
    for p in probs:
        u, acc, pick = rng.random(), 0.0, routes[-1]
        for r, q in zip(routes, p, strict=True):
            acc += float(q)
            if u < acc:
                pick = r
                break
        out.append(pick)
    return out


def route_conditions(
    routes: Sequence[str], n: int, condition: Callable[[str], Condition]
) -> tuple[list[Condition], list[str]]:
    """One condition and one route name per episode (task-major, ``n`` per task)."""
    per_episode = [r for r in routes for _ in range(n)]
    return [condition(r) for r in per_episode], per_episode
