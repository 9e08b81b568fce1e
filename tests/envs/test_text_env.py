"""Environments that own their turn, as SkyRL-gym's do (``step(action: str)``): the environment
parses the model's text itself and returns the next message, a reward for the step and whether
the episode ended. The episode's return is the environment's final score plus the sum of its
kept steps' rewards (``ToolResult.reward`` for tool environments)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.rollout.test_multi_turn import (
    CALL,
    TASK,
    AddEnv,
    ScriptedGenerator,
    tok,  # noqa: F401 - fixture
)
from tests.rollout.test_rollback import AttemptGenerator
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, EnvStart, TextEnv, TextStep, Transcript
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_task, play_tasks
from toolgrpo.rollout.rollback import RollbackPolicy
from toolgrpo.tools.types import ToolResult

LIMITS = EpisodeLimits(max_response_length=600)


class GuessNumber(TextEnv):
    """Guess a number in ``<guess>N</guess>``: each well-formed guess earns 0.1, a right one
    1.0 and ends the episode; anything else is told the expected form (no reward)."""

    max_turns = 4

    def __init__(self, target: int = 7) -> None:
        self.target = target
        self.actions: list[str] = []

    async def reset(self) -> EnvStart:
        return EnvStart([{"role": "user", "content": "Guess my number (1-9)."}])

    async def step(self, action: str) -> TextStep:  # type: ignore[override]
        self.actions.append(action)
        m = re.search(r"<guess>(\d+)</guess>", action)
        if m is None:
            return TextStep([{"role": "user", "content": "Write <guess>N</guess>."}])
        n = int(m.group(1))
        if n == self.target:
            return TextStep([{"role": "user", "content": "Right!"}], reward=1.0, done=True)
        hint = "higher" if n < self.target else "lower"
        return TextStep([{"role": "user", "content": f"No, {hint}."}], reward=0.1)


register_env("test_guess")(lambda task, options: GuessNumber(int(task.ground_truth)))


def _play(tok, turns, env, limits=LIMITS):  # noqa: F811
    gen = ScriptedGenerator(tok, turns)
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    ep = asyncio.run(play_task(TASK, env, batcher, tok, limits, uid="u"))
    batcher.close()
    return ep, gen


def test_a_text_env_parses_its_own_actions_and_its_steps_rewards_sum(tok):  # noqa: F811
    env = GuessNumber(7)
    ep, _ = _play(tok, ["I think <guess>3</guess>", "hmm", "<guess>7</guess>"], env)
    # The environment got the text as written (its end-of-turn token removed), not parsed calls.
    assert env.actions == ["I think <guess>3</guess>", "hmm", "<guess>7</guess>"]
    assert ep.stop_reason == "done" and ep.num_turns == 3 and ep.tool_calls == 0
    assert ep.step_rewards == [0.1, 0.0, 1.0]
    assert ep.reward == pytest.approx(1.1) and ep.reward_parts["step_return"] == pytest.approx(1.1)
    roles = [m["role"] for m in ep.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert ep.messages[-1]["content"] == "Right!"
    text = tok.decode(ep.prompt_ids + ep.response_ids, skip_special_tokens=False)
    assert text.endswith("Right!<|im_end|>\n")  # the last observation, no turn opened after it


def test_a_text_env_runs_out_of_turns_and_through_play_tasks(tok):  # noqa: F811
    ep, _ = _play(tok, ["<guess>1</guess>"], GuessNumber(7))
    assert ep.stop_reason == "max_turns" and ep.truncated and ep.num_turns == 4
    assert ep.reward == pytest.approx(0.4)
    gen = ScriptedGenerator(tok, ["<guess>5</guess>"])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    router = EnvRouter({"guess": {"type": "test_guess", "max_turns": 2}})
    task = Task("g", TASK.messages, "5", "test", "guess")
    # Rollback leaves a text environment alone: it has no tool results to judge.
    run = play_tasks([task], 2, router, batcher, tok, LIMITS, rollback=RollbackPolicy())
    eps = asyncio.run(run)
    batcher.close()
    assert [e.reward for e in eps] == [1.0, 1.0] and all(e.stop_reason == "done" for e in eps)


class ScoredText(GuessNumber):
    """Also scores the transcript: its final score adds to the steps' sum."""

    async def reward(self, transcript: Transcript) -> EnvReward:
        return EnvReward(10.0, {"final": 10.0})


class BadStep(GuessNumber):
    async def step(self, action: str) -> Any:  # type: ignore[override]
        return "not a TextStep"


def test_the_final_score_and_a_broken_step(tok):  # noqa: F811
    ep, _ = _play(tok, ["<guess>7</guess>"], ScoredText(7))
    assert ep.reward == pytest.approx(11.0) and ep.reward_parts["final"] == 10.0
    ep, _ = _play(tok, ["<guess>7</guess>"], BadStep(7))
    assert ep.env_failure and "TextStep" in ep.env_failure


class PaidAdd(AddEnv):
    """A tool environment whose calls each earn a reward (verl's per-call tool rewards); a call
    with b = 0 fails and costs 0.5."""

    supports_snapshot = True

    async def step(self, calls):
        out = []
        for c in calls:
            if c.arguments.get("b") == 0:
                err = ToolResult("Error: ZeroDivisionError", True, "exception", c.name, reward=-0.5)
                out.append(err)
            else:
                out.append(ToolResult("RESULT=5", name=c.name, call_id=c.id, reward=0.25))
        return out

    def snapshot(self) -> None:
        return None

    def restore(self, state: Any) -> None:
        pass


def test_tool_results_rewards_sum_and_a_rolled_back_step_takes_its_reward_along(tok):  # noqa: F811
    ep, _ = _play(tok, [CALL, CALL, "<answer>5</answer>"], PaidAdd())
    assert ep.step_rewards == [0.25, 0.25] and ep.reward == pytest.approx(1.5)
    bad = CALL.replace('"b": 3', '"b": 0')
    gen = AttemptGenerator(tok, {0: [bad, CALL], 1: ["<answer>5</answer>"]})
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    ep = asyncio.run(play_task(TASK, PaidAdd(), batcher, tok, LIMITS, "u", 0, 0, RollbackPolicy()))
    batcher.close()
    assert ep.rollback.rollbacks == 1 and ep.step_rewards == [0.25]  # the undone step: gone
    assert ep.reward == pytest.approx(1.25)
