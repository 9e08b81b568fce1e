"""The router head, pooling and prompt features on the tiny model; the shared-optimizer path."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from toolgrpo.config.schema import ModelConfig
from toolgrpo.models.loading import load_policy
from toolgrpo.router.head import RouterHead, pool, prompt_features
from toolgrpo.router.policy import RouterPolicy


def test_fresh_head_is_uniform_and_actions_carry_their_log_prob():
    head = RouterHead(8, 3)
    feats = torch.randn(5, 8)
    out = head.act(feats, sample=True)
    assert out.router_logits.shape == (5, 3) and out.router_action.shape == (5,)
    assert torch.allclose(out.probs, torch.full((5, 3), 1 / 3))
    assert torch.allclose(out.router_log_prob, torch.full((5,), -math.log(3)))
    with torch.no_grad():
        head.net[-1].bias.copy_(torch.tensor([0.0, 2.0, 1.0]))
    greedy = head.act(feats, sample=False)
    assert greedy.router_action.tolist() == [1] * 5
    logp = torch.log_softmax(greedy.router_logits, -1)[:, 1]
    assert torch.allclose(greedy.router_log_prob, logp)


def test_pooling_skips_left_padding():
    h = torch.arange(12.0).view(1, 4, 3).repeat(2, 1, 1)
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert pool(h, mask, "last").tolist() == [[9.0, 10.0, 11.0]] * 2
    assert pool(h, mask, "mean")[0].tolist() == [7.5, 8.5, 9.5]
    with pytest.raises(ValueError, match="unknown router pooling"):
        pool(h, mask, "max")


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_features_do_not_depend_on_batch_padding(tiny_model_dir, pooling):
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"), trainable=False)
    a, b = [5, 6, 7, 8, 9, 10], [11, 12]
    pad = policy.tokenizer.pad_token_id
    both = prompt_features(policy.base, [a, b], pad, pooling)
    alone = prompt_features(policy.base, [b], pad, pooling)
    assert both.shape == (2, policy.base.config.hidden_size)
    assert torch.allclose(both[1], alone[0], atol=1e-5)


def test_shared_optimizer_steps_only_the_head():
    lm_weight = torch.nn.Parameter(torch.ones(3))
    actor_opt = torch.optim.AdamW([lm_weight], lr=0.1)
    lm_weight.grad = torch.ones(3)  # a stale gradient from the actor's last mini-batch
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=4)))
    router = RouterPolicy(lm, ["ANSWER", "SEARCH"], lr=None, actor_optimizer=actor_opt)
    assert len(actor_opt.param_groups) == 2
    before = [p.detach().clone() for p in router.head.parameters()]
    m = router.update(torch.randn(6, 4), torch.tensor([0, 1] * 3), torch.randn(6), 0.0)
    assert m["router/grad_norm"] > 0
    assert torch.equal(lm_weight.detach(), torch.ones(3))
    after = list(router.head.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, after, strict=True))
    with pytest.raises(ValueError, match="shares the actor's optimizer"):
        RouterPolicy(lm, ["ANSWER", "SEARCH"], lr=None)


def test_a_middle_layer_is_read_when_asked(tiny_model_dir):
    policy = load_policy(ModelConfig(path=str(tiny_model_dir), dtype="float32"), trainable=False)
    pad = policy.tokenizer.pad_token_id
    ids = [[5, 6, 7, 8], [9, 10]]
    final = prompt_features(policy.base, ids, pad, "last")
    assert torch.allclose(final, prompt_features(policy.base, ids, pad, "last", layer=-1))
    first = prompt_features(policy.base, ids, pad, "last", layer=1)
    with torch.no_grad():
        ref = policy.base.get_decoder()(
            input_ids=torch.tensor([ids[0]]), output_hidden_states=True
        ).hidden_states[1][0, -1]
    assert torch.allclose(first[0], ref.float(), atol=1e-5)
    assert not torch.allclose(first, final)


def test_a_head_trained_on_other_inputs_is_refused():
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=4)))
    saved = RouterPolicy(lm, ["ANSWER", "SEARCH"], feature_layer=2).state_dict()
    with pytest.raises(ValueError, match="feature_layer=2"):
        RouterPolicy(lm, ["ANSWER", "SEARCH"]).load_state_dict(saved)
    saved = RouterPolicy(lm, ["ANSWER", "SEARCH"], inputs="question").state_dict()
    with pytest.raises(ValueError, match="inputs='question'"):
        RouterPolicy(lm, ["ANSWER", "SEARCH"]).load_state_dict(saved)


def test_a_head_of_another_pooling_is_refused_in_one_line():
    """A ``mean`` head read ``last``-token features no better than random ones: loading it into
    a ``last`` run (resume, eval, infer) is refused, naming the setting that fits it."""
    from toolgrpo.errors import UserError

    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=4)))
    saved = RouterPolicy(lm, ["ANSWER", "SEARCH"], pooling="mean").state_dict()
    with pytest.raises(UserError) as err:
        RouterPolicy(lm, ["ANSWER", "SEARCH"], pooling="last").load_state_dict(saved)
    assert "pooling='mean'" in str(err.value) and "router.pooling=mean" in str(err.value)
    assert "\n" not in str(err.value)
    RouterPolicy(lm, ["ANSWER", "SEARCH"], pooling="mean").load_state_dict(saved)


def test_running_statistics_pool_batches_exactly_then_forget_slowly():
    head = RouterHead(6, 3)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(b, 6, generator=g) * 3 + 5 for b in (4, 7, 1, 12)]
    for b in batches:
        head.observe(b)
    seen = torch.cat(batches)
    assert float(head.feature_count) == len(seen)
    assert torch.allclose(head.feature_mean, seen.mean(0), atol=1e-5)
    assert torch.allclose(head.feature_var, seen.var(0, unbiased=False), atol=1e-4)
    # past the window the old prompts fade: a shifted stream pulls the mean to it
    from toolgrpo.router.head import FEATURE_WINDOW

    for _ in range(4):
        head.observe(torch.randn(FEATURE_WINDOW, 6, generator=g) - 5)
    assert torch.allclose(head.feature_mean, torch.full((6,), -5.0), atol=0.2)


def test_a_standardized_head_ignores_what_every_prompt_shares():
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(32, 8, generator=g)
    shared = 40 * torch.randn(8, generator=g)  # one dominant direction, as in an LM's states
    plain, shifted = RouterHead(8, 3), RouterHead(8, 3)
    plain.observe(feats)
    shifted.observe(feats + shared)
    for head in (plain, shifted):
        torch.nn.init.normal_(head.net[-1].weight, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(plain(feats), shifted(feats + shared), atol=1e-4)
    z = plain.normalize(feats)
    assert z.norm(dim=-1).pow(2).mean() == pytest.approx(1.0, rel=1e-2)  # unit size on average
    # layer normalisation keeps it: the shifted prompts all look alike
    layer = RouterHead(8, 3, feature_norm="layer")
    cos = torch.nn.functional.cosine_similarity(
        layer.normalize(feats + shared)[:1], layer.normalize(feats + shared)[1:]
    )
    assert float(cos.min()) > 0.9
    with pytest.raises(ValueError, match="feature_norm"):
        RouterHead(8, 3, feature_norm="batch")


def test_statistics_travel_with_the_head_and_old_heads_stay_layer_normed():
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=4)))
    saved = RouterPolicy(lm, ["ANSWER", "SEARCH"])
    saved.observe(torch.randn(10, 4) + 3)
    loaded = RouterPolicy(lm, ["ANSWER", "SEARCH"])
    loaded.load_state_dict(saved.state_dict())
    assert torch.equal(loaded.head.feature_mean, saved.head.feature_mean)
    assert float(loaded.head.feature_count) == 10
    # a head saved before router.feature_norm existed was layer-normed: its meta has no key
    old = RouterPolicy(lm, ["ANSWER", "SEARCH"], feature_norm="layer").state_dict()
    old["meta"].pop("feature_norm")
    with pytest.raises(ValueError, match="feature_norm='layer'"):
        RouterPolicy(lm, ["ANSWER", "SEARCH"]).load_state_dict(old)
    RouterPolicy(lm, ["ANSWER", "SEARCH"], feature_norm="layer").load_state_dict(old)


def test_the_averaged_head_is_the_bias_corrected_mean_and_training_resumes_from_the_last():
    lm = SimpleNamespace(base=SimpleNamespace(config=SimpleNamespace(hidden_size=4)))
    router = RouterPolicy(lm, ["ANSWER", "SEARCH"], head_ema=0.5)
    feats = torch.randn(6, 4)
    router.observe(feats)
    seen = []
    for _ in range(3):
        router.update(feats, torch.tensor([0, 1] * 3), torch.randn(6), entropy_coeff=0.0)
        seen.append({k: v.clone() for k, v in router.head.net.state_dict().items()})
    # weights 1/7, 2/7, 4/7 for the three iterates: the zero start carries none
    want = {k: (seen[0][k] + 2 * seen[1][k] + 4 * seen[2][k]) / 7 for k in seen[0]}
    last = {k: v.clone() for k, v in router.head.net.state_dict().items()}
    with router.averaged():
        for k, v in router.head.net.state_dict().items():
            torch.testing.assert_close(v, want[k])
    for k, v in router.head.net.state_dict().items():
        assert torch.equal(v, last[k])  # training goes on from the last iterate
    # a checkpoint keeps both; inference routes with the average, a resume trains the last
    state = router.state_dict()
    resumed = RouterPolicy(lm, ["ANSWER", "SEARCH"], head_ema=0.5)
    resumed.load_state_dict(state)
    assert resumed.average.steps == 3
    for k, v in resumed.head.net.state_dict().items():
        assert torch.equal(v, last[k])
    served = RouterPolicy(lm, ["ANSWER", "SEARCH"])
    served.load_state_dict(state)
    served.adopt_average(state)
    for k, v in served.head.net.state_dict().items():
        torch.testing.assert_close(v, want[k])
    plain = RouterPolicy(lm, ["ANSWER", "SEARCH"])  # head_ema = 0: no average, nothing swapped
    with plain.averaged():
        pass
    assert "head_average" not in plain.state_dict()
