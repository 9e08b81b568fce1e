"""Exact bias of the fixed-row estimators (issue #17, item 4), by enumerating every response of a
tiny 4-token-vocabulary model: no sampling noise, so equality is tested to float64 precision.

Pins two defects of the old default (``ppo_clip``: π_fixed as the PPO old log-probs): its clip
band centred on π_fixed and its per-token ratios bias the gradient on 2–3-token responses, while
the new default family (decoupled, sequence-level weights) is exact before truncation. The old
test (``test_unbiased.py``) used 1-token responses with clipping off and could not see either.
"""

from __future__ import annotations

import pytest
import torch

from toolgrpo.mixture.bias import ESTIMATORS, Estimator, all_responses, sampler_logprobs, scenario

SEQ_UNTRUNCATED = Estimator("seq", threshold=None)
TOKEN_UNTRUNCATED = Estimator("token", level="token", threshold=None)
BYPASS = Estimator("bypass", bypass_mode=True)
DEFAULT = ESTIMATORS[0]


@pytest.mark.parametrize("length", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_untruncated_sequence_estimator_is_the_on_policy_gradient(length, seed):
    r = scenario(seed, length, estimators=(SEQ_UNTRUNCATED,))
    assert r.on_policy.norm() > 1e-3  # a real gradient, not 0 = 0
    assert r.relative_error("seq") < 1e-9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_level_weights_are_exact_for_one_token_but_biased_beyond(seed):
    """Per-token weights ignore the shift of the prefix distribution: exact on 1-token
    responses, biased on 2 and 3 (the test has power against the old per-token estimators)."""
    assert scenario(seed, 1, estimators=(TOKEN_UNTRUNCATED,)).relative_error("token") < 1e-9
    for length in (2, 3):
        assert scenario(seed, length, estimators=(TOKEN_UNTRUNCATED,)).relative_error("token") > 0.1


@pytest.mark.parametrize("length", [1, 2, 3])
def test_design_literal_method_is_biased_and_worse_than_the_default(length):
    """bypass_mode=true (the old default ``ppo_clip``): clip band around π_fixed. Averaged over
    seeds its error exceeds the default's (decoupled, sequence weights truncated at 2)."""
    bypass, default = [], []
    for seed in range(4):
        r = scenario(seed, length, estimators=(BYPASS, DEFAULT))
        bypass.append(r.relative_error("bypass"))
        default.append(r.relative_error(DEFAULT.name))
    assert min(bypass) > 0.2, bypass
    assert sum(default) < sum(bypass), (default, bypass)


def test_truncation_is_the_default_estimators_only_bias():
    """With C large enough that no weight reaches it, the default equals the on-policy gradient."""
    wide = Estimator("wide", threshold=1e6)
    r = scenario(0, 3, estimators=(wide, DEFAULT))
    assert r.relative_error("wide") < 1e-9
    assert r.relative_error(DEFAULT.name) > 1e-3  # some weight of this scenario exceeds 2


def test_support_gap_is_not_repaired_by_any_weight():
    """A top-k fixed sampler never draws some responses: the untruncated sequence estimator is
    then exactly the gradient of the on-policy objective restricted to the sampler's support,
    and differs from the full one by the missing mass (what actor/is_support_gap measures)."""
    from toolgrpo.mixture.bias import tiny_lm

    r = scenario(0, 2, fixed_top_k=2, estimators=(SEQ_UNTRUNCATED,))
    assert r.relative_error("seq") > 0.1
    actor, fixed = tiny_lm(4, seed=0), tiny_lm(4, seed=1)
    ys = all_responses(4, 2)
    rewards = torch.rand(16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lp = sampler_logprobs(actor, [0, 1], ys)
    with torch.no_grad():
        q = sampler_logprobs(fixed, [0, 1], ys, 0.8, 2).sum(-1).exp()
    pi = lp.sum(-1).exp()
    adv = rewards - (pi.detach() * rewards).sum()
    actor.zero_grad()
    (-(pi * adv)[q > 0].sum()).backward()
    restricted = torch.cat([p.grad.flatten() for p in actor.parameters() if p.grad is not None])
    torch.testing.assert_close(r.estimates["seq"], restricted, rtol=1e-9, atol=1e-12)
