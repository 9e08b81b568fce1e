"""Negatives (rolled-back attempts) against their group's baseline, by hand (issue #14 item 3).

Pins the defect: a negative used to enter its group's mean and std, so G = 4 real episodes that
all failed (reward 0) plus one negative at -1 gave every failed episode +0.447. Now the mean and
std are the real members'; a negative gets min(0, (s - mean_real) / std_group) (GRPO),
min(0, s - mean_real) (Dr.GRPO, RLOO); docs/multi_turn.md carries the same numbers.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from toolgrpo.algos.advantages import (
    compute_advantages,
    compute_dr_grpo_advantages,
    compute_grpo_advantages,
    compute_rloo_advantages,
    register_adv_estimator,
)
from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config

EPS = 1e-6
NEG = [False, False, False, False, True]  # G = 4 real episodes, then one negative
MASK = torch.ones(5, 2)
UIDS = ["g"] * 5


def rows(fn, scores, flags=NEG, uids=UIDS):
    s = torch.tensor(scores, dtype=torch.float32)
    adv, _ = fn(s, torch.ones(len(scores), 2), uids, is_negative_B=flags)
    assert torch.equal(adv[:, 0], adv[:, 1])  # one value per row, on every trained token
    return adv[:, 0].tolist()


def test_all_failed_group_plus_a_negative():
    scores = [0.0, 0.0, 0.0, 0.0, -1.0]
    # The old behaviour, for the record: the negative in the baseline lifts the failures.
    old, _ = compute_grpo_advantages(torch.tensor(scores), MASK, UIDS)
    assert old[0, 0].item() == pytest.approx(0.4472, abs=1e-4)
    # Real members all equal: 0. The negative: (-1 - 0) / std(0, 0, 0, 0, -1) = -1 / 0.4472.
    std_group = statistics.stdev(scores)
    assert std_group == pytest.approx(1 / math.sqrt(5))
    assert rows(compute_grpo_advantages, scores) == pytest.approx([0, 0, 0, 0, -math.sqrt(5)])
    assert rows(compute_dr_grpo_advantages, scores) == [0, 0, 0, 0, -1.0]
    assert rows(compute_rloo_advantages, scores) == [0, 0, 0, 0, -1.0]


def test_all_succeeded_group_plus_a_negative():
    scores = [1.0, 1.0, 1.0, 1.0, -1.0]
    # (-1 - 1) / std(1, 1, 1, 1, -1) = -2 / 0.8944 = -sqrt(5): an all-equal group still trains
    # its negative, on the same scale whatever the gap.
    assert rows(compute_grpo_advantages, scores) == pytest.approx([0, 0, 0, 0, -math.sqrt(5)])
    assert rows(compute_dr_grpo_advantages, scores) == [0, 0, 0, 0, -2.0]
    assert rows(compute_rloo_advantages, scores) == [0, 0, 0, 0, -2.0]


def test_mixed_group_plus_a_negative():
    scores = [1.0, 0.0, 0.0, 0.0, -1.0]
    # Real: mean 0.25, std 0.5 -> 1.5, -0.5, -0.5, -0.5 (as without the negative).
    # Negative: (-1 - 0.25) / std(1, 0, 0, 0, -1) = -1.25 / 0.7071 = -1.7678.
    grpo = rows(compute_grpo_advantages, scores)
    assert grpo[:4] == pytest.approx([0.75 / (0.5 + EPS)] + [-0.25 / (0.5 + EPS)] * 3)
    assert grpo[4] == pytest.approx(-1.25 / math.sqrt(0.5))
    assert rows(compute_dr_grpo_advantages, scores) == [0.75, -0.25, -0.25, -0.25, -1.25]
    # RLOO: real i against the other real members, 4/3 (s - 0.25); the negative against all 4.
    rloo = rows(compute_rloo_advantages, scores)
    assert rloo == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3, -1.25])


def test_real_rewards_below_negative_reward_never_reward_the_negative():
    """When every real member scored below ``negative_reward`` (an environment without a
    declared range, so the startup check could not refuse it), the negative is clamped to 0:
    a failed attempt is never reinforced. The real members are untouched by it."""
    scores = [-2.0, -2.0, -2.0, -2.0, -1.0]
    for fn in (compute_grpo_advantages, compute_dr_grpo_advantages, compute_rloo_advantages):
        assert rows(fn, scores) == [0.0] * 5
    mixed = [-2.0, -3.0, -2.0, -3.0, -1.0]
    grpo = rows(compute_grpo_advantages, mixed)
    assert grpo[4] == 0.0 and grpo[:4] == pytest.approx([0.866, -0.866, 0.866, -0.866], abs=1e-3)


def test_real_members_never_move_whatever_the_negatives():
    rng = random.Random(0)
    for _ in range(30):
        g, k = rng.randint(1, 6), rng.randint(1, 3)
        real = [rng.choice([0.0, 0.5, 1.0]) for _ in range(g)]
        scores = real + [-1.0] * k
        flags = [False] * g + [True] * k
        uids = ["a"] * (g + k)
        for fn in (compute_grpo_advantages, compute_dr_grpo_advantages, compute_rloo_advantages):
            with_negs = rows(fn, scores, flags, uids)
            alone, _ = fn(torch.tensor(real), torch.ones(g, 2), ["a"] * g)
            assert with_negs[:g] == pytest.approx(alone[:, 0].tolist())
            assert all(a <= 0 for a in with_negs[g:])
            if fn is compute_grpo_advantages:  # the group std bounds a negative's |A|
                assert all(abs(a) <= math.sqrt(g + k) + 1e-9 for a in with_negs[g:])


def test_groups_stay_apart_and_a_group_without_real_members_gives_zero():
    scores = [1.0, 0.0, 0.0, -1.0, -1.0]
    flags = [False, True, False, True, True]
    uids = ["a", "a", "b", "b", "c"]  # "c" holds a negative alone (its episode was dropped)
    grpo = rows(compute_grpo_advantages, scores, flags, uids)
    # a: singleton real member -> raw score (verl's trap); its negative against mean 1 over
    # std(1, 0) = 0.7071. b: real 0 alone -> 0; its negative -1 / std(0, -1).
    assert grpo == pytest.approx([1.0 / (1 + EPS), -1 / math.sqrt(0.5), 0.0, -math.sqrt(2), 0.0])
    assert rows(compute_rloo_advantages, scores, flags, uids) == [1.0, -1.0, 0.0, -1.0, 0.0]


def test_no_flags_or_empty_flags_change_nothing():
    scores = torch.tensor([1.0, 0.0, 0.5, -1.0, 0.0])
    for flags in (None, [], [False] * 5, torch.zeros(5, dtype=torch.bool)):
        a, _ = compute_grpo_advantages(scores, MASK, UIDS, is_negative_B=flags)
        b, _ = compute_grpo_advantages(scores, MASK, UIDS)
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="3 is_negative_B flags for 5 scores"):
        compute_grpo_advantages(scores, MASK, UIDS, is_negative_B=[True, False, False])


def test_dispatch_passes_flags_and_refuses_an_estimator_that_cannot_take_them():
    scores = torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0])
    adv, _ = compute_advantages("grpo", scores_B=scores, response_mask_BT=MASK, uids=UIDS,
                                is_negative_B=NEG)  # fmt: skip
    assert adv[:4].abs().max().item() == 0.0 and adv[4, 0].item() < 0

    @register_adv_estimator("test_no_negatives")
    def plain(scores_B, response_mask_BT, uids):
        return torch.zeros_like(response_mask_BT), torch.zeros_like(response_mask_BT)

    with pytest.raises(ValueError, match="does not take is_negative_B.*save_negative_samples"):
        compute_advantages(
            "test_no_negatives", scores_B=scores, response_mask_BT=MASK, uids=UIDS,
            is_negative_B=NEG,
        )  # fmt: skip
    for flags in (None, [], [False] * 5):  # no negatives: any estimator runs
        compute_advantages(
            "test_no_negatives", scores_B=scores, response_mask_BT=MASK, uids=UIDS,
            is_negative_B=flags,
        )  # fmt: skip


def test_gae_with_negatives_is_refused_at_config_validation():
    key = "actor_rollout_ref.rollout.multi_turn."
    on = [f"{key}enable=true", f"{key}enable_tool_rollback=true", "algorithm.adv_estimator=gae"]
    with pytest.raises(ConfigError, match="gae cannot train on negative samples"):
        validate_train_config(load_config(TrainConfig, None, on))
    for off in (f"{key}save_negative_samples=false", f"{key}max_negative_samples_per_group=0"):
        validate_train_config(load_config(TrainConfig, None, [*on, off]))
