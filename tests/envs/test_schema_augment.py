"""Schema augmentation: a training episode's tools under drawn names, calls translated back."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from toolgrpo.config.loader import ConfigError, load_config
from toolgrpo.config.schema import TrainConfig
from toolgrpo.config.validate import validate_train_config
from toolgrpo.data.task import Task
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.envs.schema_augment import (
    augment,
    draw_renaming,
    episode_rng,
    renamed_specs,
    rewrite_text,
)
from toolgrpo.tools.parser import parse_tool_calls
from toolgrpo.tools.types import ToolCall
from toolgrpo.trainer.episodes import EpisodeRunner

TASK = Task(
    "calculator:train#7",
    ({"role": "user", "content": "What is 4817 * 293 - 1205?"},),
    "1410176",
    "calculator",
    "calculator",
)


def _start(seed: int = 0):
    env = augment(EnvRouter().make(TASK), random.Random(seed))
    return env, asyncio.run(env.reset())


def _names(start) -> dict[str, list[str]]:
    return {
        t["function"]["name"]: list(t["function"]["parameters"]["properties"]) for t in start.tools
    }


def test_draws_are_seeded_and_vary():
    a, b = _start(0)[1], _start(0)[1]
    assert a.tools == b.tools and a.messages == b.messages
    seen = {json.dumps(_names(_start(s)[1]), sort_keys=True) for s in range(30)}
    assert len(seen) > 10  # names, argument names and styles vary across draws
    assert episode_rng(0, 3, "t#1").random() == episode_rng(0, 3, "t#1").random()
    assert episode_rng(0, 3, "t#1").random() != episode_rng(0, 4, "t#1").random()


def test_specs_keep_schemas_and_required_under_new_names():
    env, start = _start(3)
    plain = asyncio.run(EnvRouter().make(TASK).reset()).tools
    r = draw_renaming(plain, random.Random(3))
    for spec in start.tools:
        fn = spec["function"]
        env_name = r.tools[fn["name"]]
        orig = next(s["function"] for s in plain if s["function"]["name"] == env_name)
        assert fn["description"] == orig["description"]
        back = {r.params[fn["name"]][k]: v for k, v in fn["parameters"]["properties"].items()}
        assert back == orig["parameters"]["properties"]
        req = [r.params[fn["name"]][k] for k in fn["parameters"].get("required", [])]
        assert sorted(req) == sorted(orig["parameters"].get("required", []))


def test_example_call_in_the_system_prompt_uses_the_offered_names():
    for seed in range(20):
        _, start = _start(seed)
        system = start.messages[0]["content"]
        names = _names(start)
        calc = next(n for n, ps in names.items() if len(ps) == 1)  # calculate takes one argument
        example = system[system.index("{") : system.index("</tool_call>")]
        call = json.loads(example)
        assert call["name"] == calc and list(call["arguments"]) == names[calc]
        if calc != "calculate":
            assert '"calculate"' not in system
        assert start.messages[1]["content"] == TASK.messages[0]["content"]  # user text untouched


def test_offered_names_run_the_real_tool_and_old_names_are_errors():
    def renamed(s: int) -> bool:  # calculate and its argument both under other names
        return "calculate" not in (n := _names(_start(s)[1])) and "expression" not in str(n)

    env, start = _start(next(s for s in range(50) if renamed(s)))
    names = _names(start)
    calc = next(n for n, ps in names.items() if len(ps) == 1)
    arg = names[calc][0]
    turn = (
        f'<tool_call>{{"name": "{calc}", "arguments": {{"{arg}": "4817 * 293 - 1205"}}}}'
        '</tool_call>\n<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"}}'
        f'</tool_call>\n<tool_call>{{"name": "{calc}", "arguments": {{"expression": "1+1"}}}}'
        "</tool_call>\n<tool_call>not json</tool_call>"
    )
    ok, old_name, old_arg, unparsed = asyncio.run(env.step(parse_tool_calls(turn)))
    assert (ok.text, ok.is_error, ok.name) == ("1410176", False, calc)
    assert old_name.error_type == "unknown_tool" and calc in old_name.text
    assert old_arg.error_type == "invalid_arguments" and arg in old_arg.text
    assert unparsed.error_type == "parse"
    assert [r.call_id for r in (ok, old_name, old_arg)] == ["call_0", "call_1", "call_2"]


def test_an_error_from_the_tool_names_things_as_offered():
    seed = next(s for s in range(50) if "expression" not in json.dumps(_names(_start(s)[1])))
    env, start = _start(seed)
    calc = next(n for n, ps in _names(start).items() if len(ps) == 1)
    (res,) = asyncio.run(env.step([ToolCall(calc, {}, "", None, "call_0")]))
    assert res.error_type == "invalid_arguments" and "'expression'" not in res.text, res.text


def test_rewrite_is_one_pass_and_quoted_only():
    plain = asyncio.run(EnvRouter().make(TASK).reset()).tools
    r = draw_renaming(plain, random.Random(1))
    text = rewrite_text("calculate it: \"calculate\" 'expression'", r)
    assert text.startswith("calculate it: ")
    new = next(k for k, v in r.tools.items() if v == "calculate")
    assert f'"{new}"' in text
    assert renamed_specs(plain, r, random.Random(1))  # every offered tool has a spec


def test_direct_env_without_tools_plays_as_it_is():
    task = Task("direct:train#0", ({"role": "user", "content": "2+2?"},), "4", "direct", "direct")
    env = augment(EnvRouter().make(task), random.Random(0))
    start = asyncio.run(env.reset())
    assert start.tools == [] and "no tool" not in start.messages[0]["content"].lower()


def _runner(**aug) -> EpisodeRunner:
    key = "actor_rollout_ref.rollout.multi_turn.schema_augmentation"
    overrides = [f"{key}.{k}={v}" for k, v in aug.items()]
    cfg = load_config(
        TrainConfig, None, [*overrides, "actor_rollout_ref.rollout.multi_turn.enable=true"]
    )
    return EpisodeRunner(cfg, None, None, EnvRouter())  # type: ignore[arg-type]


def _offered(router: EnvRouter, task: Task) -> set[str]:
    return set(_names(asyncio.run(router.make(task).reset())))


def test_training_router_renames_a_share_of_tasks_and_validation_none():
    off = _runner()
    assert off.training_router(1) is off.router
    on = _runner(enable="true", prob=0.5)
    tasks = [
        Task(f"calculator:train#{i}", TASK.messages, "1", "calculator", "calculator")
        for i in range(40)
    ]
    renamed = [_offered(on.training_router(1), t) != {"calculate", "solve"} for t in tasks]
    assert 8 < sum(renamed) < 32  # about half
    # The same task and step: the same names (a GRPO group alike); the plain router: none.
    assert _offered(on.training_router(1), tasks[0]) == _offered(on.training_router(1), tasks[0])
    assert _offered(on.router, tasks[0]) == {"calculate", "solve"}
    only_search = _runner(enable="true", prob=1.0, task_types="[search]")
    assert _offered(only_search.training_router(1), tasks[0]) == {"calculate", "solve"}


def test_refused_without_tool_episodes_or_with_the_router():
    key = "actor_rollout_ref.rollout.multi_turn."
    on = f"{key}schema_augmentation.enable=true"
    with pytest.raises(ConfigError, match="needs .*multi_turn.enable=true"):
        validate_train_config(load_config(TrainConfig, None, [on]))
    with pytest.raises(ConfigError, match="router.enable=true"):
        cfg = load_config(TrainConfig, None, [on, f"{key}enable=true", "router.enable=true"])
        validate_train_config(cfg)
