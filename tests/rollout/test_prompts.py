"""``filter_overlong`` judges the opening the model sees (issue 14 item 7): the environment's
system prompt and tool specs, and the router's longest route note, not only the dataset prompt."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import pytest
from transformers import AutoTokenizer

from toolgrpo.data.loader import DataError
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart, Transcript
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.rollout.prompts import filter_overlong, opening_length, render_prompt
from toolgrpo.rollout.render import encode, render_text, with_tools
from toolgrpo.tools.types import ToolCall, ToolResult

LONG_ENV = "long_opening_test"
BROKEN_ENV = "broken_reset_test"
WORDS = " ".join(f"rule{i}" for i in range(120))


def _spec(name: str) -> dict[str, Any]:
    desc = f"{name}: " + " ".join(f"detail{i}" for i in range(60))
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {}}}


class _Counted(Env):
    closed = 0

    async def step(self, calls: list[ToolCall]) -> list[ToolResult]:
        return []

    async def reward(self, transcript: Transcript) -> EnvReward:
        return EnvReward(0.0)

    async def close(self) -> None:
        type(self).closed += 1


@register_env(LONG_ENV)
class LongOpeningEnv(_Counted):
    """A long system prompt and two wordy tools in front of the task's short question."""

    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        self.task = task

    async def reset(self) -> EnvStart:
        system = {"role": "system", "content": f"Follow these rules: {WORDS}"}
        return EnvStart([system, *self.task.messages], [_spec("lookup"), _spec("compute")])


@register_env(BROKEN_ENV)
class BrokenResetEnv(_Counted):
    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        self.task = task

    async def reset(self) -> EnvStart:
        raise RuntimeError("reset exploded")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def task(i: int, task_type: str) -> Task:
    return Task(f"{task_type}-{i}", ({"role": "user", "content": f"q{i}"},), "1", "x", task_type)


def test_env_system_prompt_and_tools_count_toward_the_limit(tokenizer, caplog) -> None:
    """Defect: filter_overlong measured only the dataset prompt, so a task whose environment
    opens with a long system prompt and tool specs passed the filter and was then cut off as
    ``prompt_too_long`` in every episode."""
    envs = EnvRouter({"long": {"type": LONG_ENV}, "broken": {"type": BROKEN_ENV}})
    tasks = [task(i, "long") for i in range(3)] + [task(0, "rlla"), task(0, "broken")]
    dataset_only = max(len(render_prompt(tokenizer, t.messages, 10**9)) for t in tasks)
    start = EnvStart(
        [{"role": "system", "content": f"Follow these rules: {WORDS}"}, *tasks[0].messages],
        [_spec("lookup"), _spec("compute")],
    )
    messages, tools = with_tools(tokenizer, start.messages, start.tools)
    seen = len(encode(tokenizer, render_text(tokenizer, messages, tools, True)))
    assert opening_length(tokenizer, start) == seen  # as the episode loop renders it
    limit = dataset_only + 10
    assert seen > limit  # the env's opening is what overflows, not the dataset prompt
    assert filter_overlong(tokenizer, tasks, limit) == tasks  # the old, dataset-only judgement

    LongOpeningEnv.closed = BrokenResetEnv.closed = 0
    with caplog.at_level(logging.WARNING, logger="toolgrpo.rollout.prompts"):
        kept = filter_overlong(tokenizer, tasks, limit, envs)
    assert [t.task_type for t in kept] == ["rlla", "broken"]  # a failed reset is not judged
    assert LongOpeningEnv.closed == 3 and BrokenResetEnv.closed == 1  # every env closed
    text = caplog.text
    assert "dropped 3 of 5 prompts" in text and "long: 3" in text
    assert "kept 1 tasks unmeasured" in text and "broken: 1" in text
    assert filter_overlong(tokenizer, tasks, seen, envs) == tasks  # exactly at the limit fits
    with pytest.raises(DataError, match="every prompt exceeds"):
        filter_overlong(tokenizer, tasks[:3], limit, envs)


def test_longest_route_note_counts(tokenizer) -> None:
    """With the router on, the opening the model sees carries a route note: the longest route
    decides, for environment openings and for single-turn dataset prompts alike."""
    note = " ".join(f"note{i}" for i in range(80))

    def short_route(s: EnvStart) -> EnvStart:
        return EnvStart([{"role": "system", "content": "answer directly"}, *s.messages[-1:]], [])

    def long_route(s: EnvStart) -> EnvStart:
        return EnvStart([{"role": "system", "content": note}, *s.messages], list(s.tools))

    tasks = [task(0, "rlla"), task(1, "rlla")]
    limit = max(len(render_prompt(tokenizer, t.messages, 10**9)) for t in tasks) + 10
    assert filter_overlong(tokenizer, tasks, limit, None, [short_route]) == tasks
    with pytest.raises(DataError):
        filter_overlong(tokenizer, tasks, limit, None, [short_route, long_route])
    envs = EnvRouter()
    with pytest.raises(DataError):
        filter_overlong(tokenizer, tasks, limit, envs, [long_route, short_route])
    assert filter_overlong(tokenizer, tasks, limit, envs, [short_route]) == tasks


def test_trainer_filters_on_the_calculator_opening(make_train_config, tmp_path) -> None:
    """The trainer hands its environments to the filter: a calculator task with a short
    question but the calculator's system prompt and tool specs over the limit is dropped."""
    from tests.conftest import rlla_row, write_jsonl
    from toolgrpo.trainer.trainer import Trainer

    rows = [rlla_row(i) for i in range(4)]
    calc = {
        "data_source": "calc",
        "task_type": "calculator",
        "prompt": [{"role": "user", "content": "2+2?"}],
        "reward_model": {"ground_truth": "4"},
    }
    rows += [{**calc, "extra_info": {"index": 10 + i}} for i in range(3)]
    data = write_jsonl(tmp_path / "mixed.jsonl", rows)
    cfg = make_train_config(
        data=data,
        **{
            "actor_rollout_ref.rollout.multi_turn.enable": "true",
            "data.filter_overlong_prompts": "true",
            "data.max_prompt_length": "120",
        },
    )
    trainer = Trainer(cfg)
    try:
        assert sorted({t.task_type for t in trainer.tasks}) == ["rlla"]
        assert len(trainer.tasks) == 4 and trainer.sampler.num_tasks == 4
    finally:
        trainer.close()


def test_router_routes_on_a_calculator_opening(tokenizer) -> None:
    """The router's own route rewrites: the CALCULATE note makes the calculator's opening longer
    than the plain one, ANSWER (no tools) shorter; the filter goes by the longest route."""
    from toolgrpo.router.families import FamilyMap
    from toolgrpo.router.runtime import RouteCondition

    envs = EnvRouter()
    tasks = [task(0, "calculator"), task(1, "calculator")]
    routes = [RouteCondition(r, FamilyMap()) for r in ("ANSWER", "CALCULATE")]
    env = envs.make(tasks[0])
    start = asyncio.run(env.reset())
    plain = opening_length(tokenizer, start)
    answer, calc = (opening_length(tokenizer, start, [r]) for r in routes)
    assert answer < plain < calc
    assert filter_overlong(tokenizer, tasks, plain, envs) == tasks
    assert filter_overlong(tokenizer, tasks, calc, envs, routes) == tasks
    with pytest.raises(DataError):
        filter_overlong(tokenizer, tasks, calc - 1, envs, routes)
    assert filter_overlong(tokenizer, tasks, calc - 1, envs, routes[:1]) == tasks
