"""``use_torch_compile``: compiled norms, MLPs and LM-head statistics compute what eager does."""

from __future__ import annotations

import pytest
import torch

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.schema import ModelConfig, TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.models.compiled import compile_training_blocks
from toolgrpo.models.loading import load_policy
from toolgrpo.models.logprobs import shared_prefix_logprobs


def _policy(path, compiled: bool):
    torch.manual_seed(0)  # the same LoRA initialisation for both copies
    cfg = ModelConfig(path=str(path), dtype="float32", lora_rank=4, lora_alpha=8)
    policy = load_policy(cfg)
    n = compile_training_blocks(policy.model) if compiled else 0
    return policy, n


def _pass(policy, compile_head: bool):
    """Entropy-weighted log-probs of three responses sharing a prompt, and the LoRA gradients."""
    g = torch.Generator().manual_seed(1)
    vocab = policy.base.config.vocab_size
    prompt = torch.randint(3, vocab, (9,), generator=g)
    responses = torch.randint(3, vocab, (3, 7), generator=g)
    mask = torch.ones(3, 7)
    mask[1, 2:4] = 0  # tool output inside a response: the head skips it
    policy.model.zero_grad()
    res = shared_prefix_logprobs(
        policy.base,
        prompt,
        responses,
        temperature=0.7,
        chunk_size=4,
        with_entropy=True,
        response_lengths=[7, 5, 3],
        target_mask=mask,
        compile_head=compile_head,
    )
    (res.logprobs_BR.sum() + 0.1 * res.entropy_BR.sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return res.logprobs_BR.detach(), res.entropy_BR.detach(), grads


def test_compiled_blocks_and_head_match_eager(tiny_model_dir):
    eager, _ = _policy(tiny_model_dir, compiled=False)
    comp, n = _policy(tiny_model_dir, compiled=True)
    layers = eager.base.config.num_hidden_layers
    # Two norms and one MLP a layer, the final norm, and attention's four LoRA projections (the
    # MLP's are traced inside it).
    assert n == 2 * layers + 1 + layers + 4 * layers
    lp, ent, grads = _pass(eager, compile_head=False)
    torch._dynamo.reset()
    for _ in range(2):  # the second pass runs the cached graphs
        lp_c, ent_c, grads_c = _pass(comp, compile_head=True)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0
        torch.testing.assert_close(lp_c, lp, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ent_c, ent, rtol=1e-4, atol=1e-5)
        assert grads_c.keys() == grads.keys() and len(grads) > 0
        for name, grad in grads.items():
            torch.testing.assert_close(grads_c[name], grad, rtol=1e-3, atol=1e-5, msg=name)
    # Compiled in place: parameter names (checkpoints, weight pushes) are unchanged.
    assert [n for n, _ in comp.model.named_parameters()] == [
        n for n, _ in eager.model.named_parameters()
    ]


def test_compile_with_fsdp2_is_refused():
    cfg = TrainConfig()
    cfg.actor_rollout_ref.actor.use_torch_compile = True
    cfg.trainer.distributed.strategy = "fsdp2"
    with pytest.raises(ConfigError, match="use_torch_compile"):
        validate_train_config(cfg)
