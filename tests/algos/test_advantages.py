"""Advantage estimators against hand computations."""

import math
import statistics

import pytest
import torch

from toolgrpo.algos import advantages as adv_mod
from toolgrpo.algos.advantages import (
    apply_kl_in_reward,
    compute_advantages,
    compute_dr_grpo_advantages,
    compute_gae_advantages,
    compute_grpo_advantages,
    compute_rloo_advantages,
    get_adv_estimator,
    register_adv_estimator,
    token_level_rewards,
)

EPS = 1e-6
# two groups interleaved out of order: a = {1.0, 0.0, 0.5}, b = {2.0, 4.0}
SCORES = torch.tensor([1.0, 2.0, 0.0, 4.0, 0.5])
UIDS = ["a", "b", "a", "b", "a"]
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1], [1, 0, 0]], dtype=torch.float32)


def _rows(adv):
    """The per-sample scalar, read from the first valid token of each row."""
    return [adv[i, int(MASK[i].nonzero()[0])].item() for i in range(adv.shape[0])]


def test_grpo_two_interleaved_groups_unbiased_std():
    # group a: mean 0.5, unbiased var = (0.25 + 0.25 + 0) / 2 = 0.25 -> std 0.5
    # group b: mean 3, unbiased var = (1 + 1) / 1 = 2 -> std sqrt(2)
    sa, sb = 0.5, math.sqrt(2.0)
    expected = [0.5 / (sa + EPS), -1 / (sb + EPS), -0.5 / (sa + EPS), 1 / (sb + EPS), 0.0]
    adv, ret = compute_grpo_advantages(SCORES, MASK, UIDS)
    assert _rows(adv) == pytest.approx(expected, rel=1e-6)
    assert torch.equal(adv, ret)
    # broadcast over valid tokens only
    assert adv[0].tolist() == pytest.approx([expected[0], expected[0], 0.0], rel=1e-6)
    assert adv[3, 0].item() == 0.0 and adv[3, 2].item() == pytest.approx(expected[3], rel=1e-6)
    assert statistics.stdev([2.0, 4.0]) == pytest.approx(sb)  # sanity: n-1 std


def test_grpo_order_free():
    perm = [4, 3, 0, 2, 1]
    adv, _ = compute_grpo_advantages(SCORES, MASK, UIDS)
    adv_p, _ = compute_grpo_advantages(SCORES[perm], MASK[perm], [UIDS[i] for i in perm])
    assert torch.allclose(adv[perm], adv_p)


def test_grpo_all_equal_group_is_exactly_zero():
    scores = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7])
    adv, _ = compute_grpo_advantages(scores, torch.ones(5, 2), [1, 1, 1, 2, 2])
    assert torch.equal(adv, torch.zeros(5, 2))
    assert not torch.isnan(adv).any()


def test_grpo_singleton_group_gives_raw_score():
    scores = torch.tensor([0.8, 1.0, 0.0])
    adv, _ = compute_grpo_advantages(scores, torch.ones(3, 1), ["solo", "g", "g"])
    # solo: mean 0, std 1 -> 0.8 / (1 + eps); g: mean 0.5, std sqrt(0.5)
    s = math.sqrt(0.5)
    assert adv[:, 0].tolist() == pytest.approx([0.8 / (1 + EPS), 0.5 / (s + EPS), -0.5 / (s + EPS)])


def test_grpo_nan_score_raises_naming_uid():
    scores = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    with pytest.raises(ValueError, match="uid='bad'"):
        compute_grpo_advantages(scores, torch.ones(4, 1), ["ok", "bad", "ok", "bad"])


def test_dr_grpo_no_std():
    expected = [0.5, -1.0, -0.5, 1.0, 0.0]
    adv, _ = compute_dr_grpo_advantages(SCORES, MASK, UIDS)
    assert _rows(adv) == pytest.approx(expected)
    adv2, _ = compute_grpo_advantages(SCORES, MASK, UIDS, norm_adv_by_std_in_grpo=False)
    assert torch.equal(adv, adv2)


def test_rloo():
    # a: n=3, mean 0.5 -> 1.5 * (s - 0.5); b: n=2, mean 3 -> 2 * (s - 3); leave-one-out check
    expected = [0.75, -2.0, -0.75, 2.0, 0.0]
    assert expected[0] == pytest.approx(1.0 - (0.0 + 0.5) / 2)
    adv, _ = compute_rloo_advantages(SCORES, MASK, UIDS)
    assert _rows(adv) == pytest.approx(expected)
    solo, _ = compute_rloo_advantages(torch.tensor([0.3]), torch.ones(1, 2), ["x"])
    assert solo[0].tolist() == pytest.approx([0.3, 0.3])
    with pytest.raises(ValueError, match="uid='x'"):
        compute_rloo_advantages(torch.tensor([float("nan")]), torch.ones(1, 2), ["x"])


# GAE: one sequence, a tool-output token at t=2 (mask 0) and padding at t=4 (mask 0).
# Values at mask-0 positions are large to show they are never used.
G_REW = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
G_VAL = torch.tensor([[0.5, 0.4, 9.0, 0.6, 7.0]])
G_MASK = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0]])
# gamma = 0.9, lam = 0.8 (gamma * lam = 0.72), backwards over valid tokens 3, 1, 0:
# t=3: delta = 1 + 0.9*0 - 0.6 = 0.4                 A3 = 0.4
# t=1: delta = 0 + 0.9*0.6 - 0.4 = 0.14              A1 = 0.14 + 0.72*0.4 = 0.428
# t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14             A0 = -0.14 + 0.72*0.428 = 0.16816
G_ADV = [0.16816, 0.428, 0.0, 0.4, 0.0]
G_RET = [0.16816 + 0.5, 0.428 + 0.4, 0.0, 1.0, 0.0]


def test_gae_raw_skips_mask_zero_tokens():
    adv, ret = compute_gae_advantages(G_REW, G_VAL, G_MASK, gamma=0.9, lam=0.8, whiten=False)
    assert adv[0].tolist() == pytest.approx(G_ADV, abs=1e-6)
    assert ret[0].tolist() == pytest.approx(G_RET, abs=1e-6)


def test_gae_whitened():
    adv, ret = compute_gae_advantages(G_REW, G_VAL, G_MASK, gamma=0.9, lam=0.8)
    valid = [G_ADV[0], G_ADV[1], G_ADV[3]]
    mean, std = statistics.mean(valid), statistics.stdev(valid)
    expected = [(G_ADV[0] - mean) / std, (G_ADV[1] - mean) / std, 0.0, (G_ADV[3] - mean) / std, 0]
    assert adv[0].tolist() == pytest.approx(expected, abs=1e-5)
    assert ret[0].tolist() == pytest.approx(G_RET, abs=1e-6)  # returns are not whitened


def test_token_level_rewards_last_valid_token():
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    out = token_level_rewards(torch.tensor([1.0, 2.0, 3.0]), mask)
    assert out.tolist() == [[0, 0, 0, 1.0, 0], [2.0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]


def test_apply_kl_in_reward():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    new, mean_kl = apply_kl_in_reward(rewards, old, ref, mask, kl_coef=0.1, kl_penalty="kl")
    # k1 = old - ref = [0.5, -1.0, (masked)]; row 2 has no tokens and is left out of the mean
    assert new[0].tolist() == pytest.approx([-0.05, 1.1, 0.0])
    assert new[1].tolist() == [0.0, 0.0, 0.0]
    assert mean_kl == pytest.approx((0.5 - 1.0) / 2)


def test_registry_and_dispatch():
    assert get_adv_estimator("grpo") is compute_grpo_advantages
    with pytest.raises(ValueError, match="dr_grpo.*gae.*grpo.*rloo"):
        get_adv_estimator("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_adv_estimator("grpo")(lambda **kw: None)
    adv, _ = compute_advantages("grpo", scores_B=SCORES, response_mask_BT=MASK, uids=UIDS)
    assert torch.equal(adv, compute_grpo_advantages(SCORES, MASK, UIDS)[0])
    adv, _ = compute_advantages(
        "grpo", scores_B=SCORES, response_mask_BT=MASK, uids=UIDS, norm_adv_by_std_in_grpo=False
    )
    assert _rows(adv) == pytest.approx([0.5, -1.0, -0.5, 1.0, 0.0])
    adv, _ = compute_advantages("rloo", scores_B=SCORES, response_mask_BT=MASK, uids=UIDS)
    assert _rows(adv) == pytest.approx([0.75, -2.0, -0.75, 2.0, 0.0])


def test_dispatch_gae_builds_token_rewards_and_needs_values():
    adv, ret = compute_advantages(
        "gae",
        scores_B=torch.tensor([1.0]),
        response_mask_BT=G_MASK,
        uids=["u"],
        values_BT=G_VAL,
        gamma=0.9,
        lam=0.8,
    )
    assert ret[0].tolist() == pytest.approx(G_RET, abs=1e-6)
    with pytest.raises(ValueError, match="values_BT"):
        compute_advantages("gae", scores_B=torch.tensor([1.0]), response_mask_BT=G_MASK, uids=["u"])


def test_custom_estimator_gets_only_declared_args():
    @register_adv_estimator("_test_const")
    def const(scores_B, response_mask_BT):
        return response_mask_BT * 2.0, response_mask_BT

    try:
        adv, _ = compute_advantages(
            "_test_const", scores_B=SCORES, response_mask_BT=MASK, uids=UIDS
        )
        assert torch.equal(adv, MASK * 2.0)
    finally:
        adv_mod._ADV_ESTIMATORS.pop("_test_const")
