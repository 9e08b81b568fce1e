"""A PEFT LoRA actor is pushed as merged weights: the engine then samples the adapted model (not
the base), and the trainer's module is left exactly as it was."""

from __future__ import annotations

import pytest
import torch

from tests.vllm.conftest import recompute
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.vllm_weights import actor_weights

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def lora_policy(vllm_ready):
    """SmolLM2 with a rank-8 all-linear LoRA whose B matrices are non-zero (a trained adapter)."""
    from toolgrpo.config.schema import ModelConfig
    from toolgrpo.models.loading import load_policy

    policy = load_policy(ModelConfig(path="smollm2-135m", dtype="float32", lora_rank=8))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return policy


def test_merged_names_are_the_base_checkpoint_names(lora_policy, hf_policy):
    merged = dict(actor_weights(lora_policy.model))
    assert merged.keys() == hf_policy.model.state_dict().keys()
    q = "model.layers.0.self_attn.q_proj.weight"
    layer = lora_policy.base.model.layers[0].self_attn.q_proj
    want = layer.base_layer.weight + layer.get_delta_weight("default")
    torch.testing.assert_close(merged[q], want, rtol=0, atol=0)
    assert not torch.equal(merged[q], layer.base_layer.weight)


def test_lora_push_samples_the_adapted_model(vgen, lora_policy, hf_policy, prompts):
    model = lora_policy.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    training = model.training
    vgen.sync_weights(model, 21)
    for k, v in model.state_dict().items():  # the trainer's module is untouched
        assert torch.equal(v, before[k]), k
    assert model.training == training
    assert not any(getattr(m, "merged", False) for m in model.modules())
    torch.manual_seed(5)
    out = vgen.generate(prompts, SamplingParams(n=2, max_new_tokens=8))
    moved = 0.0
    for c in out:
        want = recompute(lora_policy.base, c)[0]
        torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=1e-3)
        moved = max(moved, float((want - recompute(hf_policy.model, c)[0]).abs().max()))
    assert moved > 0.05, "the adapter should change the model's log-probs"
