"""Losses and aggregation against hand computations."""

import math

import pytest
import torch

from toolgrpo.algos.losses import (
    agg_loss,
    entropy_from_logits,
    get_policy_loss,
    kl_loss,
    ppo_policy_loss,
    register_policy_loss,
    value_loss,
)

# row 0: 2 tokens (1, 2); row 1: 3 tokens (3, 4, 5); row 2 fully masked (its 100s are ignored)
LOSS = torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 5.0], [100.0, 100.0, 100.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
AGG_EXPECTED = {
    "token-mean": 15 / 5,
    "seq-mean-token-sum": (3 + 12) / 2,
    "seq-mean-token-mean": (1.5 + 4) / 2,
    "seq-mean-token-sum-norm": (3 + 12) / 2 / 3,  # / T = mask.shape[-1] = 3
}


@pytest.mark.parametrize("mode", list(AGG_EXPECTED))
def test_agg_modes_with_fully_masked_row(mode):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(AGG_EXPECTED[mode])


def test_agg_sum_norm_custom_factor():
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=5).item() == 1.5


@pytest.mark.parametrize("mode", list(AGG_EXPECTED))
def test_agg_empty_mask_zero_with_grad(mode):
    x = torch.ones(2, 3, requires_grad=True)
    out = agg_loss(x, torch.zeros(2, 3), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))


def test_agg_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(LOSS, MASK, "seq-sum")


# PPO: clip_ratio_low = 0.2, clip_ratio_high = 0.28, clip_ratio_c = 3
# tok0 A=+1 r=1.5  (> 1.28): L = max(-1.5, -1.28) = -1.28          clipped
# tok1 A=-1 r=0.5  (< 0.8):  L = max(0.5, 0.8) = 0.8                clipped
# tok2 A=-1 r=5    dual:     max(5, 1.28) = 5 -> min(5, 3) = 3      dual (lower) clip
# tok3 A=+2 r=1.1  inside:   L = -2.2
# tok4 A=+1 r=1.25 inside only because high=0.28 (> 1.2): L = -1.25
# tok5 A=-1 r=0.85 inside only because low=0.2 (< 0.9 would be clipped with 0.1): L = 0.85
RATIOS = [1.5, 0.5, 5.0, 1.1, 1.25, 0.85]
ADVS = [1.0, -1.0, -1.0, 2.0, 1.0, -1.0]
PER_TOKEN = [-1.28, 0.8, 3.0, -2.2, -1.25, 0.85]


def _ppo_inputs():
    old = torch.tensor([[-1.0, -2.0, -3.0, -0.5, -1.5, -2.5]])
    logp = (old + torch.log(torch.tensor([RATIOS]))).requires_grad_(True)
    return old, logp, torch.tensor([ADVS]), torch.ones(1, 6)


def test_ppo_four_regions_value_grad_metrics():
    old, logp, adv, mask = _ppo_inputs()
    loss, m = ppo_policy_loss(old, logp, adv, mask, 0.2, 0.28, 3.0)
    assert loss.item() == pytest.approx(sum(PER_TOKEN) / 6, rel=1e-5)
    loss.backward()
    # d/dlogp (-A r) = -A r on unclipped tokens, 0 where a clip is active; / 6 tokens
    grad = [0.0, 0.0, 0.0, -2.2 / 6, -1.25 / 6, 0.85 / 6]
    assert logp.grad[0].tolist() == pytest.approx(grad, abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(2 / 6)
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 6)
    assert m["ppo_kl"] == pytest.approx(-sum(math.log(r) for r in RATIOS) / 6, rel=1e-5)
    assert all(isinstance(v, float) for v in m.values())


def test_ppo_symmetric_clip_changes_inside_tokens():
    old, logp, adv, mask = _ppo_inputs()
    loss, m = ppo_policy_loss(old, logp, adv, mask, 0.1, 0.2, 3.0)
    # tok4 now clipped at 1.2 -> -1.2; tok5 clipped at 0.9 -> 0.9; tok0 -> -1.2, tok1 -> 0.9
    expected = [-1.2, 0.9, 3.0, -2.2, -1.2, 0.9]
    assert loss.item() == pytest.approx(sum(expected) / 6, rel=1e-5)
    assert m["pg_clipfrac"] == pytest.approx(4 / 6)


def test_ppo_mask_and_agg_mode():
    old, logp, adv, _ = _ppo_inputs()
    mask = torch.tensor([[1, 1, 1, 0, 0, 0]])
    loss, m = ppo_policy_loss(old, logp, adv, mask, 0.2, 0.28, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(-1.28 + 0.8 + 3.0, rel=1e-5)
    assert m["pg_clipfrac_lower"] == pytest.approx(1 / 3)


def test_ppo_is_weights_scale_loss_and_are_detached():
    old, logp, adv, mask = _ppo_inputs()
    w = torch.tensor([[2.0, 0.5, 1.0, 0.0, 1.0, 1.0]], requires_grad=True)
    loss, _ = ppo_policy_loss(old, logp, adv, mask, 0.2, 0.28, is_weights_BT=w)
    weighted = [p * wi for p, wi in zip(PER_TOKEN, [2.0, 0.5, 1.0, 0.0, 1.0, 1.0], strict=True)]
    assert loss.item() == pytest.approx(sum(weighted) / 6, rel=1e-5)
    loss.backward()
    assert w.grad is None


def test_ppo_rejects_bad_clip_ratio_c():
    old, logp, adv, mask = _ppo_inputs()
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_policy_loss(old, logp, adv, mask, clip_ratio_c=1.0)


def test_policy_loss_registry():
    assert get_policy_loss("vanilla") is ppo_policy_loss
    with pytest.raises(ValueError, match="vanilla"):
        get_policy_loss("gspo_typo")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(lambda *a, **k: None)


def test_entropy_from_logits():
    logits = torch.tensor([[0.0, math.log(2.0), math.log(3.0)], [1000.0, 1000.0, -1000.0]])
    probs = [1 / 6, 2 / 6, 3 / 6]
    expected = [-sum(p * math.log(p) for p in probs), math.log(2.0)]
    assert entropy_from_logits(logits).tolist() == pytest.approx(expected, rel=1e-5)
    masked = torch.tensor([[0.0, 0.0, float("-inf")]], requires_grad=True)
    out = entropy_from_logits(masked)
    assert out.item() == pytest.approx(math.log(2.0))
    out.sum().backward()
    assert not torch.isnan(masked.grad).any()


def test_kl_loss():
    logp = torch.tensor([[-1.0, -2.0, -7.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    k3 = [math.exp(-0.5) - (-0.5) - 1, math.exp(1.0) - 1.0 - 1]
    assert kl_loss(logp, ref, mask, "low_var_kl").item() == pytest.approx(sum(k3) / 2, rel=1e-6)
    assert kl_loss(logp, ref, mask, "k2", "seq-mean-token-sum").item() == pytest.approx(0.625)


def test_value_loss_clipping():
    v = torch.tensor([[1.0, 0.0, 2.0, 5.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    ret = torch.tensor([[0.0, 1.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # c = 0.5: clip(v) = [0.5, 0, 0.5, 0.5]
    # tok0: (1-0)^2=1 vs (0.5-0)^2=0.25 -> 1
    # tok1: (0-1)^2=1 vs (0-1)^2=1      -> 1
    # tok2: (2-2)^2=0 vs (0.5-2)^2=2.25 -> 2.25 (clipped)
    loss, clipfrac = value_loss(v, old, ret, mask, cliprange_value=0.5)
    assert loss.item() == pytest.approx(0.5 * (1 + 1 + 2.25) / 3)
    assert clipfrac == pytest.approx(1 / 3)
    loss.backward()
    # grad 0.5 * 2 (v - R) / 3 on unclipped branch tokens, 0 on tok2 (clipped branch is constant)
    assert v.grad[0].tolist() == pytest.approx([1 / 3, -1 / 3, 0.0, 0.0])
