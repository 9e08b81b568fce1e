"""router/metrics.py's pure functions on hand-made numbers: AUROC with ties, the need-a-tool
label (per task, or per type), and the per-step route shares and reward per call."""

from __future__ import annotations

import random

import pytest
import torch

from toolgrpo.router.metrics import auroc, need_tool_labels, observe_metrics
from toolgrpo.router.usage import ToolUsage


def _pairs(scores, labels):
    """AUROC by its definition: over every (positive, negative) pair, 1 if the positive scores
    higher, 1/2 on a tie."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    won = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return won / (len(pos) * len(neg))


def test_auroc_hand_computed():
    # positives 0.9, 0.7; negatives 0.8, 0.6: 0.9 beats both, 0.7 beats 0.6 only → 3/4
    assert auroc([0.9, 0.8, 0.7, 0.6], [True, False, True, False]) == 0.75
    # a tie between a positive and a negative counts one half: (1 + 1 + 0.5 + 1) / 4
    assert auroc([0.8, 0.5, 0.5, 0.2], [1, 1, 0, 0]) == 0.875
    assert auroc([0.5, 0.5, 0.5], [True, False, False]) == 0.5  # all tied: chance
    assert auroc([0.1, 0.2, 0.9], [0, 0, 1]) == 1.0
    assert auroc([0.9, 0.2, 0.1], [0, 1, 1]) == 0.0
    assert auroc([0.3, 0.4], [True, True]) is None  # one class: undefined
    assert auroc([], []) is None
    with pytest.raises(ValueError):
        auroc([0.1], [True, False])


def test_auroc_matches_its_definition_with_many_ties():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(2, 30)
        scores = [rng.choice([0.1, 0.2, 0.5, 0.7, 0.9]) for _ in range(n)]
        labels = [rng.random() < 0.5 for _ in range(n)]
        if 0 < sum(labels) < n:
            assert auroc(scores, labels) == pytest.approx(_pairs(scores, labels))


def test_need_a_tool_per_task_when_every_route_was_played():
    rewards = {
        "ANSWER": [0.0, 1.0, 0.5, 0.0],
        "SEARCH": [1.0, 1.0, 0.0, 0.0],
        "CALCULATE": [0.0, 0.0, 0.75, 0.0],
    }
    labels, rule = need_tool_labels(rewards, ["s", "d", "c", "c"])
    # task 1 ties ANSWER (no need), task 3 fails everywhere (no need)
    assert rule == "task" and labels == [True, False, True, False]


def test_need_a_tool_per_type_when_some_routes_were_not_played():
    # Without the baselines, tasks are played under ANSWER and their own tool route only.
    rewards = {
        "ANSWER": [0.0, 0.0, 1.0, 1.0, 0.5],
        "SEARCH": [1.0, None, 1.0, None, None],
        "CALCULATE": [None, 0.5, None, 1.0, 0.0],
    }
    types = ["calc", "calc", "direct", "direct", "odd"]
    labels, rule = need_tool_labels(rewards, types)
    # calc: SEARCH 1.0 (one task) beats ANSWER 0.0; direct: ties at 1.0; odd: 0.0 < 0.5
    assert rule == "type" and labels == [True, True, False, False, False]


def test_step_metrics_route_shares_and_reward_per_call():
    usages = [ToolUsage({"SEARCH": 2}), ToolUsage(), ToolUsage({"CALCULATE": 1}), ToolUsage()]
    m = observe_metrics(
        ["SEARCH", "ANSWER", "CALCULATE", "ANSWER"],
        ["s", "s", "c", "c"],
        usages,
        torch.tensor([1.0, 0.0, 1.0, 1.0]),
        torch.tensor([1.0, 0.0, 1.0, 0.0]),
        torch.tensor([0.7, 0.0, 0.7, 1.0]),
        lam=0.3,
        budget=0.3,
    )
    assert m["router/route_share/s/SEARCH"] == 0.5 and m["router/route_share/s/ANSWER"] == 0.5
    assert m["router/route_share/c/CALCULATE"] == 0.5 and m["router/route_share/c/SEARCH"] == 0
    assert m["router/task_reward_per_call"] == pytest.approx(3.0 / 3)
    one = observe_metrics(["ANSWER"], ["d"], [ToolUsage()], *[torch.zeros(1)] * 3, 0.0, 0.3)
    assert one["router/route_share/d/ANSWER"] == 1.0  # one task type: still per type
    assert "router/task_reward_per_call" not in one  # no call: undefined
