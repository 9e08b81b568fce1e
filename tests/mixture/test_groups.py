"""Mixed groups on hand-made parts: fixed samples join their task's actor group, the schedule
still decides which groups get them, and GRPO ranks the mixed group as one."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from toolgrpo.algos import compute_advantages
from toolgrpo.config.schema import RolloutAllocationScheduleConfig
from toolgrpo.mixture import allocate, build_schedule
from toolgrpo.mixture.correction import correct_fixed_rows
from toolgrpo.mixture.groups import group_signal_metrics, join_groups
from toolgrpo.rollout.rollback import NegativeSample


def _part(policy, tasks, n, groups):
    return SimpleNamespace(policy=policy, tasks=tasks, params=SimpleNamespace(n=n), groups=groups)


def _triples(tasks, n, prefix):
    return [(f"{prefix}{t}#{j}", f"{prefix}-uid-{t}", t) for t in tasks for j in range(n)]


def test_fixed_triples_take_the_actor_uid_of_their_task():
    tasks = ["t0", "t1", "t2"]
    parts = [_part("actor", tasks, 3, [0, 1, 2]), _part("fixed", ["t0", "t2"], 1, [0, 2])]
    items = _triples(tasks, 3, "a") + _triples(["t0", "t2"], 1, "f")
    out = join_groups(parts, items)
    assert out[:9] == items[:9]  # the actor's samples as they were
    assert [x[1] for x in out[9:]] == ["a-uid-t0", "a-uid-t2"]
    assert [x[0] for x in out[9:]] == ["ft0#0", "ft2#0"] and [x[2] for x in out[9:]] == ["t0", "t2"]


def test_whole_groups_are_left_alone():
    parts = [_part("actor", ["t0"], 2, None), _part("fixed", ["t1"], 2, None)]
    items = _triples(["t0"], 2, "a") + _triples(["t1"], 2, "f")
    assert join_groups(parts, items) == items


@dataclass
class _Episode:
    uid: str
    negatives: list = field(default_factory=list)


def _negative(uid: str) -> NegativeSample:
    return NegativeSample(
        "t", "calculator", uid, [1], [2], [1], [0.0], [], [], "turn_1", 1, 1, [], 0
    )


def test_episodes_and_their_negatives_move_into_the_actor_group():
    parts = [_part("actor", ["t0", "t1"], 2, [0, 1]), _part("fixed", ["t1"], 2, [1])]
    actor = [_Episode("A0"), _Episode("A0"), _Episode("A1"), _Episode("A1")]
    fixed = [_Episode("F1", [_negative("F1")]), _Episode("F1")]
    out = join_groups(parts, actor + fixed)
    assert [e.uid for e in out] == ["A0", "A0", "A1", "A1", "A1", "A1"]
    assert out[4].negatives[0].uid == "A1"  # rolled-back attempts rank in the parent's group


def test_a_layout_that_does_not_match_the_parts_is_refused():
    parts = [_part("actor", ["t0"], 2, [0]), _part("fixed", ["t0"], 1, [0])]
    with pytest.raises(ValueError, match="samples for parts"):
        join_groups(parts, _triples(["t0"], 2, "a"))
    bad = [("c0", "u1", "t0"), ("c1", "u2", "t0"), ("c2", "f", "t0")]  # one task, two uids
    with pytest.raises(ValueError, match="span groups"):
        join_groups(parts, bad)


def test_the_schedule_picks_the_groups_that_get_fixed_samples():
    """α = 0.5 per group: about half the groups are mixed, drawn as whole-group allocation
    draws them (same seeds, so switching ``groups`` keeps the schedule's choices)."""
    cfg = RolloutAllocationScheduleConfig(alpha=0.5, per_sample=True, groups="mixed")
    labels = allocate(build_schedule(cfg, 0), 3, 200, ["fixed"], [1.0], per_sample=True)
    whole = RolloutAllocationScheduleConfig(alpha=0.5, per_sample=True)
    assert labels == allocate(build_schedule(whole, 0), 3, 200, ["fixed"], [1.0], True)
    assert 70 < labels.count("fixed") < 130


def test_an_all_fail_actor_group_gets_negative_advantages_from_one_fixed_success():
    """Through join_groups and the trainer's advantage call: n = 3 actor failures, k = 1 fixed
    success in one group; another all-fail group without a fixed sample stays at 0."""
    parts = [_part("actor", ["t0", "t1"], 3, [0, 1]), _part("fixed", ["t0"], 1, [0])]
    items = join_groups(parts, _triples(["t0", "t1"], 3, "a") + _triples(["t0"], 1, "f"))
    uids = [x[1] for x in items]
    policies = ["actor"] * 6 + ["fixed"]
    scores = torch.tensor([0.0] * 6 + [1.0])
    adv, _ = compute_advantages(
        "grpo", scores_B=scores, response_mask_BT=torch.ones(7, 2), uids=uids
    )
    assert bool((adv[:3] < 0).all()) and float(adv[6, 0]) > 0
    assert bool((adv[3:6] == 0).all())
    m = group_signal_metrics(uids, policies, scores.tolist())
    assert m == {"mixture/mixed_group_frac": 0.5, "mixture/rescued_group_frac": 0.5}


def test_group_signal_metrics_leave_out_negatives():
    m = group_signal_metrics(
        ["a", "a", "a", "b", "b"],
        ["actor", "actor", "fixed", "actor", "actor"],
        [0.0, 0.0, 0.0, 0.0, 1.0],
        [False, False, False, False, True],
    )
    assert m == {"mixture/mixed_group_frac": 0.5, "mixture/rescued_group_frac": 0.0}


MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -1.0], [-2.0, 0.0]])
CURRENT = torch.tensor([[-1.2, -0.8], [-1.0, 0.0]])
FIXED_B = torch.tensor([False, True])


def test_shaped_objective_turns_the_ppo_term_off_on_fixed_rows_and_marks_them():
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED_B, objective="shaped")
    assert torch.equal(c.is_weights_BR, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    assert torch.equal(c.shaping_BR, torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    assert torch.equal(c.old_logprobs_BR[1], CURRENT[1])  # the actor's own, as decoupled
    r = torch.exp(torch.tensor(1.0))  # π_old/π_fixed of the fixed row's one token
    assert c.metrics["mixture/shaping_grad_weight_mean"] == pytest.approx(
        float(0.1 * r / (r + 0.1) ** 2)
    )
    assert c.metrics["mixture/is_weight_raw_max"] == pytest.approx(float(r))
    assert c.metrics["mixture/is_truncated_frac"] == 1.0  # e > 2
    assert "actor/importance_weight_mean" not in c.metrics  # no IS weight is in effect
    prob = correct_fixed_rows(
        ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED_B, objective="shaped", shaping_ratio="prob"
    )
    p = torch.exp(torch.tensor(-1.0))  # π_old of that token
    assert prob.metrics["mixture/shaping_grad_weight_mean"] == pytest.approx(
        float(0.1 * p / (p + 0.1) ** 2)
    )


def test_is_objective_also_reports_the_raw_weights():
    c = correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED_B)
    assert c.shaping_BR is None
    assert c.metrics["mixture/is_weight_raw_mean"] == pytest.approx(
        float(torch.exp(torch.tensor(1.0)))
    )
    assert c.metrics["actor/importance_weight_mean"] == pytest.approx(2.0)  # truncated at C


def test_shaping_cannot_bypass():
    with pytest.raises(ValueError, match="bypass"):
        correct_fixed_rows(ROLLOUT, ROLLOUT, CURRENT, MASK, FIXED_B, True, objective="shaped")
