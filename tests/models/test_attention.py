"""The GQA-preserving SDPA attention must compute exactly what eager attention computes."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from toolgrpo.models.attention import register
from toolgrpo.models.logprobs import response_logprobs, shared_prefix_logprobs


def _pair(tiny_model_dir):
    name = register()
    eager = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    gqa = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32, attn_implementation=name
    )
    assert gqa.config.num_key_value_heads < gqa.config.num_attention_heads  # really grouped
    return eager, gqa


def test_padded_forward_matches_eager(tiny_model_dir):
    eager, gqa = _pair(tiny_model_dir)
    torch.manual_seed(0)
    ids = torch.randint(5, 300, (3, 12))
    attn = torch.ones_like(ids)
    attn[0, :4] = 0
    attn[1, :2] = 0
    a = response_logprobs(eager, ids, attn, 5)
    b = response_logprobs(gqa, ids, attn, 5)
    torch.testing.assert_close(a.logprobs_BR, b.logprobs_BR, atol=1e-5, rtol=0)


def test_cached_forward_and_gradients_match_eager(tiny_model_dir):
    eager, gqa = _pair(tiny_model_dir)
    torch.manual_seed(1)
    prompt, resp = torch.randint(5, 300, (7,)), torch.randint(5, 300, (3, 5))
    a = shared_prefix_logprobs(eager, prompt, resp)
    b = shared_prefix_logprobs(gqa, prompt, resp)
    torch.testing.assert_close(a.logprobs_BR, b.logprobs_BR, atol=1e-5, rtol=0)
    a.logprobs_BR.sum().backward()
    b.logprobs_BR.sum().backward()
    for pa, pb in zip(eager.parameters(), gqa.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-5, rtol=1e-4)


def test_left_padded_greedy_generation_matches_eager(tiny_model_dir):
    eager, gqa = _pair(tiny_model_dir)
    torch.manual_seed(2)
    ids = torch.randint(5, 300, (3, 10))
    attn = torch.ones_like(ids)
    attn[0, :3] = 0
    kw = {"attention_mask": attn, "max_new_tokens": 6, "do_sample": False}
    assert torch.equal(eager.generate(ids, **kw), gqa.generate(ids, **kw))
