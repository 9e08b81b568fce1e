"""The episode loop when the environment fails (issue 14, items 1–2), ends the episode itself
(``ToolResult.done``, item 5), or runs out of turns with work pending (item 6)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

from tests.rollout.test_multi_turn import (
    CALL,
    LIMITS,
    TASK,
    AddEnv,
    ScriptedGenerator,
    _play,
    tok,  # noqa: F401 - fixture
)
from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.envs.wire import result_from_dict, result_to_dict
from toolgrpo.rollout.batcher import GenerationBatcher
from toolgrpo.rollout.generator import SamplingParams
from toolgrpo.rollout.multi_turn import EpisodeLimits, play_tasks
from toolgrpo.tools.schema import function_tool
from toolgrpo.tools.types import ToolResult
from toolgrpo.trainer.episode_metrics import episode_metrics

ANSWER = "<answer>5</answer>"


class Raising(AddEnv):
    """``AddEnv`` that raises in one method (``where``), or sets ``fatal_error`` in step."""

    def __init__(self, where: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.where = where

    async def reset(self):
        if self.where == "reset":
            raise ValueError("no such scenario")
        return await super().reset()

    async def step(self, calls):
        if self.where == "step":
            raise KeyError("state lost")
        if self.where == "timeout":  # the environment's own deadline, as a remote one reports it
            self.fatal_error = "env timed out after 30s"
        return await super().step(calls)

    async def reward(self, transcript):
        if self.where == "reward":
            raise ZeroDivisionError("scorer bug")
        return await super().reward(transcript)


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("reset", "reset raised ValueError: no such scenario"),
        ("step", "step raised KeyError: 'state lost'"),
        ("timeout", "env timed out after 30s"),
        ("reward", "reward raised ZeroDivisionError: scorer bug"),
    ],
)
def test_environment_failures_are_recorded_not_scored(tok, where, reason):  # noqa: F811
    """Item 2: before, a failed environment's episode was scored ``error_reward`` (-1) like a bad
    answer, with nothing on the episode saying why; now ``env_failure`` carries the reason."""
    ep, _ = _play(tok, [CALL, ANSWER], Raising(where))
    assert ep.env_failure == reason and ep.stop_reason == "env_error"


@register_env("test_fragile")
def _fragile(task: Task, options: Mapping[str, Any]) -> AddEnv:
    if task.task_id == "bad":
        raise FileNotFoundError("scenario file missing")
    return AddEnv()


def test_a_constructor_that_raises_fails_its_episodes_only(tok):  # noqa: F811
    """Item 1: ``router.make`` ran outside the loop's guard, so one bad row aborted the step."""
    gen = ScriptedGenerator(tok, [CALL, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    router = EnvRouter({"add": {"type": "test_fragile", "max_turns": 4}})
    tasks = [TASK, Task("bad", TASK.messages, "5", "test", "add")]
    eps = asyncio.run(play_tasks(tasks, 2, router, batcher, tok, LIMITS))
    batcher.close()
    assert [e.env_failure for e in eps[:2]] == [None, None]
    assert all(e.reward == 1.0 for e in eps[:2])
    assert [e.env_failure for e in eps[2:]] == [
        "construction raised FileNotFoundError: scenario file missing"
    ] * 2
    assert eps[2].uid == eps[3].uid != eps[0].uid


def test_last_turn_calls_run_and_the_episode_is_truncated(tok):  # noqa: F811
    """Item 6: the last allowed turn's calls were dropped unrun (3 written, 2 run) and the
    episode was not marked truncated."""
    ep, _ = _play(tok, [CALL], AddEnv(max_turns=3))
    assert ep.num_turns == 3 and ep.tool_calls == 3
    assert ep.stop_reason == "max_turns" and ep.truncated
    tool_msgs = [m for m in ep.messages if m["role"] == "tool"]
    assert len(tool_msgs) == 3 and tool_msgs[-1]["content"] == "RESULT=5"
    assert tok.decode(ep.response_ids).count("RESULT=5") == 3  # room left: tokens appended too
    m = episode_metrics([ep])
    assert m["response_length/clip_ratio"] == 1.0 and m["episode/truncated_frac"] == 1.0
    # No room for the last results' tokens: they still reach the messages the reward reads.
    last_len = len(ep.response_ids)
    tight, _ = _play(tok, [CALL], AddEnv(max_turns=3), EpisodeLimits(max_response_length=last_len))
    assert tight.tool_calls == 3 and tight.truncated
    assert sum(m["role"] == "tool" for m in tight.messages) == 3
    assert tok.decode(tight.response_ids).count("RESULT=5") == 2
    # An answer on the last turn is not truncation.
    ok, _ = _play(tok, [CALL, ANSWER], AddEnv(max_turns=2))
    assert ok.stop_reason == "answer" and not ok.truncated and ok.reward == 1.0


class Booking(AddEnv):
    """``add`` ends the episode (a submit-style tool)."""

    async def step(self, calls):
        return [
            ToolResult("booked", name=c.name, call_id=c.id, done=c.name == "add") for c in calls
        ]

    async def reward(self, transcript):
        return EnvReward(float(transcript.messages[-1]["content"] == "booked"))


def test_a_done_result_ends_the_episode_after_its_results(tok):  # noqa: F811
    """Item 5: environments could not end an episode; the model always got another turn."""
    ep, gen = _play(tok, [CALL, ANSWER], Booking())
    assert ep.stop_reason == "done" and not ep.truncated and ep.num_turns == 1
    assert len(gen.calls) == 1 and ep.reward == 1.0  # the reward saw the tool result
    assert ep.messages[-1] == {
        "role": "tool",
        "name": "add",
        "content": "booked",
        "tool_call_id": "call00000",  # the assistant turn's structured call it answers
    }


def test_a_tool_env_tool_can_end_the_episode(tok):  # noqa: F811
    def add(a: int, b: int) -> ToolResult:
        """Add and submit.

        Args:
            a: first
            b: second
        """
        return ToolResult(str(a + b), done=True)

    env = ToolEnv([{"role": "user", "content": "2+3?"}], [function_tool(add)], lambda t: 1.0)
    ep, gen = _play(tok, [CALL, ANSWER], env)
    assert ep.stop_reason == "done" and ep.num_turns == 1 and len(gen.calls) == 1
    assert ep.messages[-1]["content"] == "5"


def test_done_crosses_the_wire():
    """Item 5: the wire protocol had no ``done``; an older peer's result (no field) is not done."""
    r = ToolResult("ok", name="submit", call_id="c0", done=True)
    d = result_to_dict(r)
    assert d["done"] is True and result_from_dict(d) == r
    del d["done"]
    assert result_from_dict(d).done is False
    assert result_from_dict({**d, "done": "yes"}).done is False  # only a JSON true counts


SUBMIT = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'


@register_env("test_submit_served")
def _served(task: Task, options: Mapping[str, Any]) -> ToolEnv:
    def submit() -> ToolResult:
        """Submit the answer."""
        return ToolResult("submitted", done=True)

    return ToolEnv(list(task.messages), [function_tool(submit)], lambda t: 1.0, max_turns=4)


@contextmanager
def served(env_type: str) -> Iterator[str]:
    """``toolgrpo serve-env``'s app on a free loopback port in a thread; yields its ws:// URL."""
    from tests.envs.server_thread import serve_in_thread

    with serve_in_thread(env_type) as url:
        yield url


def test_a_remote_environment_ends_the_episode_through_the_server(tok):  # noqa: F811
    gen = ScriptedGenerator(tok, [SUBMIT, ANSWER])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    with served("test_submit_served") as url:
        router = EnvRouter({"add": {"type": "remote", "url": url, "max_turns": 4}})
        eps = asyncio.run(play_tasks([TASK], 1, router, batcher, tok, LIMITS))
    batcher.close()
    (ep,) = eps
    assert ep.env_failure is None and ep.stop_reason == "done" and ep.num_turns == 1
    assert ep.messages[-1]["content"] == "submitted"


def test_a_dead_server_is_an_environment_failure(tok):  # noqa: F811
    """Issue 15 item 3: an unreachable server's episodes were scored -1 as the model's."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gen = ScriptedGenerator(tok, [CALL])
    batcher = GenerationBatcher(gen, SamplingParams(max_new_tokens=64))
    url = f"ws://127.0.0.1:{port}/ws"
    router = EnvRouter({"add": {"type": "remote", "url": url, "connect_timeout_s": 2}})
    eps = asyncio.run(play_tasks([TASK], 2, router, batcher, tok, LIMITS))
    batcher.close()
    assert not gen.calls  # nothing generated for an episode that could not start
    for ep in eps:
        assert ep.stop_reason == "env_error" and "cannot connect" in (ep.env_failure or "")


def test_metrics_count_failures_and_leave_them_out_of_rewards(tok):  # noqa: F811
    """Item 2 (validation): failed episodes were averaged into reward/mean at -1."""
    good, _ = _play(tok, [CALL, ANSWER], AddEnv())
    bad, _ = _play(tok, [CALL, ANSWER], Raising("step"))
    bad2, _ = _play(tok, [CALL, ANSWER], Raising("reset"))
    bad2.task_type = "other"
    m = episode_metrics([good, bad, bad2])
    assert m["episode/reward/mean"] == 1.0 and m["episode/add/reward/mean"] == 1.0
    assert m["rollout/env_failures"] == 2.0
    assert m["rollout/env_failure_frac"] == pytest.approx(2 / 3)
    assert m["rollout/add/env_failures"] == 1.0 and m["rollout/other/env_failures"] == 1.0
    assert "episode/reward/env_error/mean" not in m
    assert m["episode/stop/env_error"] == pytest.approx(2 / 3)
    only_failed = episode_metrics([bad])
    assert only_failed["rollout/env_failures"] == 1.0 and "episode/reward/mean" not in only_failed


def test_model_caused_tool_errors_stay_the_models(tok):  # noqa: F811
    """Parse errors and a tool's own exception are messages to the model, not env failures."""
    ep, _ = _play(tok, ["<tool_call>{not json</tool_call>", CALL, ANSWER], AddEnv(fail=True))
    assert ep.env_failure is None and ep.reward == 1.0 and ep.tool_errors == 2
