"""Truncation at a turn's token cap (``multi_turn.max_tokens_per_turn``): a turn that wrote a
complete ``<tool_call>...</tool_call>`` before the cap still runs it and the episode goes on;
one cut inside its call ends as ``length`` (truncated) without running anything. Before, every
turn that hit the cap ended the episode, complete call or not."""

from __future__ import annotations

import asyncio

from tests.rollout.test_multi_turn import (
    CALL,
    TASK,
    AddEnv,
    ScriptedGenerator,
    _spans,
    tok,  # noqa: F401 - fixture
)
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task
from toolgrpo.rollout.turns import turn_calls

ANSWER = "<answer>5</answer>"


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _play(tokenizer, turns: list[str], cap: int):
    gen = ScriptedGenerator(tokenizer, turns)
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    limits = EpisodeLimits(max_response_length=600, max_tokens_per_turn=cap)
    ep = asyncio.run(play_task(TASK, AddEnv(), batcher, tokenizer, limits, uid="u"))
    batcher.close()
    return ep, gen


def test_a_complete_call_at_the_turn_cap_still_runs(tok):  # noqa: F811
    rambling = CALL + " and then I keep on writing words"
    cap = len(_ids(tok, CALL)) + 3  # the call and three more tokens: no stop token sampled
    ep, gen = _play(tok, [rambling, ANSWER], cap)
    assert ep.tool_calls == 1 and ep.tool_errors == 0
    assert ep.stop_reason == "answer" and not ep.truncated and ep.reward == 1.0
    assert ep.num_turns == 2 and ep.prefix_mismatches == 0
    first = [ep.response_ids[a:b] for m, a, b in _spans(ep.response_mask) if m][0]
    assert len(first) == cap  # the cut turn stands as sampled (mask 1) ...
    text = tok.decode(ep.response_ids, skip_special_tokens=False)
    assert "RESULT=5" in text and text.count("<|im_end|>") >= 2  # ... closed by the template


def test_a_call_cut_by_the_cap_ends_the_episode_unrun(tok):  # noqa: F811
    cap = len(_ids(tok, CALL)) - 3  # inside the call's JSON
    ep, _ = _play(tok, [CALL, ANSWER], cap)
    assert ep.stop_reason == "length" and ep.truncated
    assert ep.tool_calls == 0 and ep.num_turns == 1


def test_only_blocks_closed_before_the_cut_run():
    two = CALL + "\n" + CALL
    assert [c.name for c in turn_calls(two, cut=False)] == ["add", "add"]
    assert [c.name for c in turn_calls(two[:-5], cut=True)] == ["add"]  # the second was cut
    assert len(turn_calls(two[:-5], cut=False)) > 1  # not cut: an unclosed block counts too
    assert turn_calls(CALL[:-5], cut=True) == []
    assert turn_calls("no call at all", cut=True) == []
