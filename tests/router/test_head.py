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
