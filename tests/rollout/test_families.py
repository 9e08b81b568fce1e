"""Episodes under the real tokenizers and chat templates of Qwen3, Llama 3.1 and Gemma 3 (tiny
random models, scripted turns): each family's native calls parse, tool results come back in the
turn its template gives them, and the token stream stays exactly what was sampled plus the
template's rendering of what came between (``prefix_mismatches`` 0)."""

from __future__ import annotations

import asyncio
import copy

import pytest

from tests.fixtures.families import FAMILIES, FamilyScripted, family_tokenizer
from tests.rollout.test_multi_turn import TASK, AddEnv, AddEnvReal, _spans
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.hf import stop_token_ids
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task
from toolgrpo.rollout.render import (
    as_generated,
    chat_view,
    decode,
    render_text,
    stream_messages,
    with_tools,
)

HERMES = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
LLAMA = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
# Each family's native calls (Qwen3 thinks first), then the answer.
TURNS = {
    "qwen3": [
        f"<think>\nI add.\n</think>\n\n{HERMES}",
        "<think>\nDone.\n</think>\n\n<answer>5</answer>",
    ],
    "llama3_1": [LLAMA, "<answer>5</answer>"],
    "gemma3": [HERMES, "<answer>5</answer>"],
}
# A result as each template renders it: Qwen3's user turn of <tool_response> blocks, Llama 3.1's
# ipython turn, and a user turn for Gemma 3, whose template has no role for tools.
RESULT = {
    "qwen3": "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n",
    "llama3_1": "<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|>",
    "gemma3": "<start_of_turn>user\n<tool_response>\n5\n</tool_response><end_of_turn>\n",
}


@pytest.fixture(scope="module")
def fam_tok(tmp_path_factory):
    """``fam_tok(name)`` -> (family, tokenizer) of one family."""
    return lambda name: (FAMILIES[name], family_tokenizer(name, tmp_path_factory))


def _play(tok, family, turns, env, end=None):
    gen = FamilyScripted(tok, family, turns, end)
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    limits = EpisodeLimits(max_response_length=600, tool_format=family.tool_format)
    ep = asyncio.run(play_task(TASK, env, batcher, tok, limits, uid="u"))
    batcher.close()
    return ep, gen


def _sampled_exactly(ep, gen) -> bool:
    ones = [s for s in _spans(ep.response_mask) if s[0] == 1]
    return [ep.response_ids[a:b] for _, a, b in ones] == gen.sampled


def test_native_calls_parse_results_render_and_the_stream_is_exact(family):
    fam, _, tok = family
    ep, gen = _play(tok, fam, TURNS[fam.name], AddEnvReal())
    assert ep.stop_reason == "answer" and ep.reward == 1.0, ep.env_failure
    assert ep.tool_calls == 1 and ep.tool_errors == 0 and ep.prefix_mismatches == 0
    assert _sampled_exactly(ep, gen)
    text = decode(tok, ep.prompt_ids + ep.response_ids)
    assert RESULT[fam.name] in text
    # The template's rendering of the episode as sampled (and a turn after it) extends the
    # stream: each turn is there as sampled, and each delta is the template's own.
    _, tools = with_tools(tok, [], asyncio.run(AddEnv().reset()).tools, fam.tool_format)
    more = [*ep.messages, {"role": "user", "content": "next"}]
    assert render_text(tok, stream_messages(tok, more, fam.tool_format), tools, False).startswith(
        text
    )
    bos = tok.bos_token_id
    if bos is not None and fam.name != "qwen3":  # one <bos>, written by the template
        assert ep.prompt_ids[0] == bos and ep.prompt_ids.count(bos) == 1


def test_qwen3_keeps_earlier_thinking_as_sampled(fam_tok):
    """Qwen3's template drops the <think> blocks of turns before the last user query when it
    renders history again: after the environment's next user turn the re-rendered history no
    longer extends the sampled tokens. The stream keeps them, as sampled (as verl does)."""
    fam, tok = fam_tok("qwen3")
    turns = [
        f"<think>x</think>{HERMES}",  # not the template's own spacing
        "<think>\n\n</think>\n\n<answer>5</answer>",  # an empty think, which it drops
        "<think>\nsaid\n</think>\n\ndone",
    ]
    ep, gen = _play(tok, fam, turns, AddEnv(follow_up=True))
    assert ep.num_turns == 3 and ep.tool_calls == 1 and ep.prefix_mismatches == 0
    assert _sampled_exactly(ep, gen)
    text = decode(tok, ep.prompt_ids + ep.response_ids)
    assert "<think>x</think><tool_call>" in text and "<think>\n\n</think>\n\n<answer>" in text
    own = render_text(tok, as_generated(ep.messages), None, False)  # the template's own way
    assert "<think>x</think>" not in own


def test_llama3_1_python_tag_calls_and_several_results(fam_tok):
    fam, tok = fam_tok("llama3_1")
    assert tok.convert_tokens_to_ids("<|python_tag|>") == 128010
    two = f"<|python_tag|>{LLAMA}; {LLAMA.replace('2', '4')}"
    ep, gen = _play(tok, fam, [two, "<answer>5</answer>"], AddEnvReal())
    assert ep.tool_calls == 2 and ep.tool_errors == 0 and ep.prefix_mismatches == 0
    assert _sampled_exactly(ep, gen)
    text = decode(tok, ep.response_ids)
    assert text.count("<|start_header_id|>ipython<|end_header_id|>") == 2
    assert "<|start_header_id|>tool<|end_header_id|>" not in text


def test_gemma3_has_no_system_turn_and_results_share_one_user_turn(fam_tok):
    fam, tok = fam_tok("gemma3")
    ep, gen = _play(tok, fam, [f"{HERMES}\n{HERMES}", "<answer>5</answer>"], AddEnvReal())
    assert ep.tool_calls == 2 and ep.prefix_mismatches == 0 and _sampled_exactly(ep, gen)
    prompt = decode(tok, ep.prompt_ids)
    assert "system" not in prompt and prompt.startswith("<bos><start_of_turn>user\n")
    assert "<tools>" in prompt  # the specs reach the first user turn
    text = decode(tok, ep.response_ids)
    both = "<tool_response>\n5\n</tool_response>\n<tool_response>\n5\n</tool_response>"
    assert f"<start_of_turn>user\n{both}<end_of_turn>" in text
    gguf_like = copy.deepcopy(tok)  # Gemma's GGUF tokenizer ends text with <eos>, not turns
    gguf_like.eos_token = "<eos>"
    assert tok.convert_tokens_to_ids("<end_of_turn>") in stop_token_ids(gguf_like)


def test_sft_view_renders_tool_results_in_every_family(family):
    """SFT renders episodes through ``chat_view``: Gemma's template refused the tool role."""
    fam, _, tok = family
    ep, _ = _play(tok, fam, TURNS[fam.name], AddEnvReal())
    text = render_text(tok, chat_view(tok, ep.messages, fam.tool_format), None, False)
    assert RESULT[fam.name] in text


def test_recorded_logprobs_equal_recompute_past_the_sliding_window(family):
    """Generation (left-padded batch) and training (one row) agree on every family's
    architecture, Gemma 3's sliding-window layers included (the fixture's window is 64)."""
    import torch

    from toolgrpo.config.schema import ModelConfig
    from toolgrpo.models.loading import load_policy
    from toolgrpo.models.logprobs import response_logprobs
    from toolgrpo.rollout.hf import HFGenerator
    from toolgrpo.rollout.prompts import render_prompt

    fam, model_dir, _ = family
    policy = load_policy(ModelConfig(path=str(model_dir), dtype="float32"))
    texts = ["hi", "the quick brown fox jumps over the lazy dog, " * 12]
    prompts = [
        render_prompt(policy.tokenizer, [{"role": "user", "content": t}], 4096) for t in texts
    ]
    assert len(prompts[1]) > 100
    torch.manual_seed(0)
    gen = HFGenerator(policy.model, policy.tokenizer, policy.dtype)
    for c in gen.generate(prompts, SamplingParams(n=2, max_new_tokens=8)):
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            want = response_logprobs(policy.base, ids, torch.ones_like(ids), len(c.token_ids))
        torch.testing.assert_close(torch.tensor(c.logprobs), want.logprobs_BR[0], rtol=0, atol=1e-4)
