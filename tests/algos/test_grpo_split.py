"""grpo_split (LUFFY's on-policy baseline) against its formula on hand-made mixed groups."""

from __future__ import annotations

import math

import pytest
import torch

from toolgrpo.algos import compute_advantages, compute_grpo_advantages
from toolgrpo.algos.grpo_split import compute_grpo_split_advantages

EPS = 1e-6


def _mask(n: int) -> torch.Tensor:
    return torch.ones(n, 3)


def _split(scores, uids, on, **kw) -> list[float]:
    adv, ret = compute_grpo_split_advantages(
        torch.tensor(scores), _mask(len(scores)), uids, on, **kw
    )
    assert torch.equal(adv, ret)
    return adv[:, 0].tolist()


def test_a_group_only_the_fixed_policy_solved_trains_the_success_alone():
    """Four actor failures and one fixed success: plain GRPO gives every failure −mean/std; the
    split baseline is the actor's own (mean 0, std 0 → 1), so they get 0 and the success +1."""
    scores, uids, on = [0.0, 0.0, 0.0, 0.0, 1.0], ["g"] * 5, [True] * 4 + [False]
    assert _split(scores, uids, on) == pytest.approx([0, 0, 0, 0, 1 / (1 + EPS)])
    assert _split(scores, uids, on, norm_adv_by_std_in_grpo=False) == [0, 0, 0, 0, 1.0]
    plain, _ = compute_grpo_advantages(torch.tensor(scores), _mask(5), uids)
    assert plain[0, 0] < 0  # what the split removes


def test_actor_rows_keep_their_own_grpo_and_fixed_rows_their_gain_over_the_actor_mean():
    scores = [1.0, 0.0, 0.0, 1.0, 0.5, 0.0]
    on = [True, True, True, True, False, False]
    s_on = torch.tensor(scores[:4], dtype=torch.float64)
    mean, std = float(s_on.mean()), float(s_on.std())  # unbiased, as GRPO
    want = [(s - mean) / (std + EPS) for s in scores]
    assert _split(scores, ["g"] * 6, on) == pytest.approx(want)
    actor_alone, _ = compute_grpo_advantages(torch.tensor(scores[:4]), _mask(4), ["g"] * 4)
    assert _split(scores, ["g"] * 6, on)[:4] == pytest.approx(actor_alone[:, 0].tolist())
    assert _split(scores, ["g"] * 6, on, norm_adv_by_std_in_grpo=False) == pytest.approx(
        [s - mean for s in scores]
    )


def test_without_mixture_labels_or_actor_rows_it_is_grpo():
    scores = torch.tensor([1.0, 0.0, 0.5, 2.0, 2.0, 3.0])
    uids = ["a", "a", "a", "b", "b", "c"]
    plain, _ = compute_grpo_advantages(scores, _mask(6), uids)
    for on in (None, [], [False] * 6):  # no labels; a group no actor sampled ranks itself
        got, _ = compute_grpo_split_advantages(scores, _mask(6), uids, on)
        torch.testing.assert_close(got, plain)


def test_a_single_actor_member_uses_grpos_singleton_rule():
    assert _split([1.0, 3.0], ["g", "g"], [True, False]) == pytest.approx(
        [1 / (1 + EPS), 3 / (1 + EPS)]
    )


def test_negatives_stay_out_of_the_baseline_and_are_never_positive():
    scores = [0.0, 0.0, 1.0, -1.0]
    got = _split(
        scores,
        ["g"] * 4,
        [True, True, False, True],
        norm_adv_by_std_in_grpo=False,
        is_negative_B=[False, False, False, True],
    )
    assert got == pytest.approx([0.0, 0.0, 1.0, -1.0])  # the negative: −1 below the actor's 0


def test_the_trainer_entry_point_passes_the_actor_rows():
    scores = torch.tensor([0.0, 0.0, 1.0])
    adv, _ = compute_advantages(
        "grpo_split", scores_B=scores, response_mask_BT=_mask(3), uids=["g"] * 3,
        on_policy_B=[True, True, False],
    )  # fmt: skip
    assert adv[:, 0].tolist() == pytest.approx([0.0, 0.0, 1 / (1 + EPS)])
    plain, _ = compute_advantages(
        "grpo", scores_B=scores, response_mask_BT=_mask(3), uids=["g"] * 3,
        on_policy_B=[True, True, False],
    )  # fmt: skip
    assert plain[0, 0] == pytest.approx(-1 / 3 / math.sqrt(1 / 3), rel=1e-4)  # GRPO ignores it


def test_bad_labels_are_refused():
    with pytest.raises(ValueError, match="on_policy_B"):
        compute_grpo_split_advantages(torch.zeros(3), _mask(3), ["g"] * 3, [True])
