"""vLLM generation keeps HFGenerator's contract: grouping, processed log-probs (checked against HF
fp32 teacher forcing), greedy decoding, EOS handling, seeded replay and clear input errors."""

from __future__ import annotations

import os

import pytest
import torch

from tests.vllm.conftest import USER_DISABLED_DYNAMO, recompute
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.hf import HFGenerator, stop_token_ids

pytestmark = pytest.mark.vllm

ATOL = 1e-3  # fp32 engine vs fp32 HF: measured ~1e-5


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, -1, 1.0), (0.7, 5, 1.0), (1.0, -1, 0.8)],
    ids=["t1", "t0.7-topk5", "topp0.8"],
)
def test_logprobs_are_those_of_the_sampling_distribution(
    vgen, hf_policy, prompts, temperature, top_k, top_p
):
    torch.manual_seed(0)
    params = SamplingParams(
        n=2, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=12
    )
    out = vgen.generate(prompts, params)
    assert [c.prompt_index for c in out] == [0, 0, 1, 1, 2, 2]
    truncated_differs = False
    for c in out:
        assert c.prompt_ids == prompts[c.prompt_index]
        assert len(c.logprobs) == len(c.token_ids) >= 1
        want, full = recompute(hf_policy.model, c, temperature, top_k, top_p)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, rtol=0, atol=ATOL)
        truncated_differs |= bool((want - full).abs().max() > 1e-2)
    assert truncated_differs == params.truncated  # truncation really changed the denominators


def test_greedy_equals_hf_greedy(vgen, hf_policy, prompts):
    params = SamplingParams(n=2, do_sample=False, max_new_tokens=16)  # vLLM itself refuses n>1
    got = vgen.generate(prompts, params)
    hf = HFGenerator(hf_policy.model, hf_policy.tokenizer, torch.float32).generate(prompts, params)
    assert [c.prompt_index for c in got] == [c.prompt_index for c in hf] == [0, 0, 1, 1, 2, 2]
    for v, h in zip(got, hf, strict=True):
        assert v.token_ids == h.token_ids
        assert v.finish_reason == h.finish_reason
        torch.testing.assert_close(
            torch.tensor(v.logprobs), torch.tensor(h.logprobs), atol=ATOL, rtol=0
        )


def test_stop_token_is_included_and_length_finishes(vgen, hf_policy, prompts):
    eos = set(stop_token_ids(hf_policy.tokenizer))
    assert set(vgen.eos_ids) == eos
    (done,) = vgen.generate(prompts[:1], SamplingParams(do_sample=False, max_new_tokens=32))
    assert done.finish_reason == "stop"
    assert done.token_ids[-1] in eos and not eos & set(done.token_ids[:-1])
    assert "Paris" in hf_policy.tokenizer.decode(done.token_ids)
    want = recompute(hf_policy.model, done)[0]  # the stop token's log-prob is recorded too
    torch.testing.assert_close(torch.tensor(done.logprobs), want, rtol=0, atol=ATOL)
    (cut,) = vgen.generate(prompts[:1], SamplingParams(do_sample=False, max_new_tokens=3))
    assert cut.finish_reason == "length"
    assert cut.token_ids == done.token_ids[:3]


def test_stop_string_ends_the_completion_as_in_hf(vgen, hf_policy, prompts):
    """Greedy "capital of France": the stop string "Paris" cuts the answer right after the token
    that completes it, in both backends; the logprobs are still the sampled tokens'."""
    tok = hf_policy.tokenizer
    greedy = SamplingParams(do_sample=False, max_new_tokens=32)
    (free,) = vgen.generate(prompts[:1], greedy)
    params = SamplingParams(do_sample=False, max_new_tokens=32, stop=("Paris",))
    (got,) = vgen.generate(prompts[:1], params)
    (hf,) = HFGenerator(hf_policy.model, tok, torch.float32).generate(prompts[:1], params)
    assert got.finish_reason == hf.finish_reason == "stop"
    assert got.token_ids == hf.token_ids == free.token_ids[: len(got.token_ids)]
    assert len(got.token_ids) < len(free.token_ids)
    assert tok.decode(got.token_ids).endswith("Paris")
    want = recompute(hf_policy.model, got)[0]
    torch.testing.assert_close(torch.tensor(got.logprobs), want, rtol=0, atol=ATOL)


def test_seeded_sampling_replays(vgen, prompts):
    params = SamplingParams(n=3, max_new_tokens=8)
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append([c.token_ids for c in vgen.generate(prompts[:2], params)])
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0][:3]}) > 1  # the n samples of a prompt differ


def test_prompt_over_max_model_len_is_a_clear_error(vgen, prompts):
    too_long = prompts[0] * (vgen.max_model_len // len(prompts[0]) + 1)
    with pytest.raises(ValueError, match=f"rollout.max_model_len={vgen.max_model_len}"):
        vgen.generate([prompts[1], too_long], SamplingParams(max_new_tokens=4))
    # nothing was queued: the engine still serves the next call
    assert len(vgen.generate(prompts[1:2], SamplingParams(max_new_tokens=4))) == 1


def test_room_left_under_max_model_len_caps_the_sample(vgen, prompts):
    long = (prompts[1] * (vgen.max_model_len // len(prompts[1]) + 1))[: vgen.max_model_len - 3]
    (c,) = vgen.generate([long], SamplingParams(do_sample=False, max_new_tokens=16))
    assert len(c.token_ids) <= 3
    if c.finish_reason == "length":
        assert len(c.token_ids) == 3


def test_long_seeded_batch_is_prefilled_whole(session_gen, hf_policy):
    """~6k prompt tokens in one call: with chunked prefill a partly prefilled seeded request made
    vLLM rewind a CPU generator's offset and the step crashed."""
    from toolgrpo.rollout.prompts import render_prompt

    text = "Tools help. " * 300
    long = [
        render_prompt(hf_policy.tokenizer, [{"role": "user", "content": f"{i} {text}"}], 1000)
        for i in range(6)
    ]
    assert sum(len(p) for p in long) > 5000
    torch.manual_seed(0)
    out = session_gen.generate(long, SamplingParams(n=1, max_new_tokens=2))
    assert [c.prompt_index for c in out] == list(range(6))
    assert all(len(c.token_ids) >= 1 and len(c.logprobs) == len(c.token_ids) for c in out)


@pytest.mark.skipif(USER_DISABLED_DYNAMO, reason="TORCHDYNAMO_DISABLE set by the user")
def test_an_eager_engine_leaves_torch_compile_working(session_gen):
    """The eager engine's start skips compiling vLLM's sampler helper, and only its start: the
    variable that does it, left set, turned the actor's ``use_torch_compile`` into eager."""
    from torch._dynamo.utils import counters
    from vllm.v1.sample.ops import logprobs as vllm_logprobs

    assert "TORCHDYNAMO_DISABLE" not in os.environ
    # torch.compile wraps what it compiles (``_torchdynamo_orig_callable``); the helper is plain
    assert not hasattr(vllm_logprobs.batched_count_greater_than, "_torchdynamo_orig_callable")
    before = counters["stats"]["unique_graphs"]
    fn = torch.compile(lambda x: x * 2 + 1, backend="eager")  # dynamo only: no C++ build
    assert torch.equal(fn(torch.ones(3)), torch.full((3,), 3.0))
    assert counters["stats"]["unique_graphs"] == before + 1
