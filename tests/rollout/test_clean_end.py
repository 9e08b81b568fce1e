"""An episode ends where its conversation does: after the last turn's tool results (``done``, or
``max_turns`` with calls under way) no generation prompt is appended, so the training row, the
text the reward sees and the rollout dump do not end in an opened assistant turn."""

from __future__ import annotations

import pytest

from tests.rollout.test_env_failures import Booking
from tests.rollout.test_multi_turn import (
    CALL,
    AddEnv,
    _play,
    tok,  # noqa: F401 - fixture
)
from toolgrpo.envs.base import EnvReward
from toolgrpo.rollout.render import render_text
from toolgrpo.trainer.rollout_dump import episode_records

GEN_PROMPT = "<|im_start|>assistant\n"


class Recording(AddEnv):
    """Keeps the transcript its reward saw."""

    seen: list[str] = []

    async def reward(self, transcript):
        Recording.seen.append(transcript.text)
        return EnvReward(0.0)


class RecordingBooking(Booking):
    async def reward(self, transcript):
        Recording.seen.append(transcript.text)
        return EnvReward(0.0)


@pytest.mark.parametrize(
    ("env", "stop"),
    [(Recording(max_turns=2), "max_turns"), (RecordingBooking(), "done")],
)
def test_the_last_results_end_the_row_the_transcript_and_the_dump(tok, env, stop):  # noqa: F811
    Recording.seen.clear()
    ep, _ = _play(tok, [CALL], env)
    assert ep.stop_reason == stop and ep.messages[-1]["role"] == "tool"
    row = tok.decode(ep.prompt_ids + ep.response_ids, skip_special_tokens=False)
    assert not row.endswith(GEN_PROMPT) and row.endswith(
        ep.messages[-1]["content"] + "<|im_end|>\n"
    )
    # The row is the conversation as the template renders it, with no turn opened after it.
    messages = [{k: v for k, v in m.items() if k != "tool_calls"} for m in ep.messages]
    assert row == render_text(tok, messages, None, False)
    (text,) = Recording.seen
    assert text == row  # what the reward read
    (dumped,) = episode_records(ep, tok)
    assert not dumped["spans"][-1]["text"].endswith(GEN_PROMPT)
    # The tokens after the last sampled turn are all tool output and turn markers (mask 0).
    assert ep.response_mask[-1] == 0


def test_a_continuing_episode_still_opens_the_next_turn(tok):  # noqa: F811
    """Only the last delta drops the generation prompt: between turns it is still there."""
    ep, gen = _play(tok, [CALL, "<answer>5</answer>"], AddEnv(max_turns=3))
    assert ep.stop_reason == "answer" and len(gen.calls) == 2
    second_prompt = tok.decode(gen.calls[1][0], skip_special_tokens=False)
    assert second_prompt.endswith(GEN_PROMPT)
