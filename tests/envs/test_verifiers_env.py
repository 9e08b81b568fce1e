"""verifiers environments (``toolgrpo.envs.verifiers_env``): a small one built here, loaded as
a data source, played as episodes with its tools and scored by its rubric."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap

import pytest

from tests.conftest import read_metrics, train_overrides
from toolgrpo.data.loader import DataError, load_tasks
from toolgrpo.envs import verifiers_env
from toolgrpo.envs.base import Transcript
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.tools.types import ToolCall

MT = "actor_rollout_ref.rollout.multi_turn.enable"

ENV_MODULE = '''
import verifiers as vf
from datasets import Dataset

SYSTEM = "Add the numbers with the add tool, then answer as <answer>N</answer>."


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def rows(n):
    return [{"question": f"What is {i} + {i + 3}?", "answer": str(2 * i + 3)} for i in range(n)]


def load_environment(num_examples: int = 4, kind: str = "tool", system: bool = True):
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct(completion, answer, parser) -> float:
        return float((parser.parse_answer(completion) or "").strip() == answer)

    rubric = vf.Rubric(funcs=[correct, parser.get_format_reward_func()], weights=[1.0, 0.0],
                       parser=parser)
    data = Dataset.from_list(rows(num_examples))
    if kind == "single":
        return vf.SingleTurnEnv(dataset=data, system_prompt=SYSTEM, parser=parser, rubric=rubric)
    if kind == "game":
        class Game(vf.MultiTurnEnv):
            async def env_response(self, messages, state, **kwargs):
                return [{"role": "user", "content": "again"}]

        return Game(dataset=data, parser=parser, rubric=rubric)
    if kind == "broken":
        def crash(completion) -> float:
            raise KeyError("no such field")

        rubric = vf.Rubric(funcs=[crash], parser=parser)
    if kind == "group":
        def rank(completions) -> list[float]:
            return [0.0] * len(completions)

        rubric = vf.Rubric(funcs=[rank], parser=parser)
    return vf.ToolEnv(dataset=data, tools=[add], system_prompt=SYSTEM if system else None,
                      parser=parser,
                      rubric=rubric, max_turns=3)
'''


@pytest.fixture
def env_file(tmp_path, monkeypatch):
    """The environment module a user would ``pip install`` (here: a file on sys.path)."""
    path = tmp_path / "vf_tiny_add.py"
    path.write_text(textwrap.dedent(ENV_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    sys.modules.pop("vf_tiny_add", None)
    verifiers_env._ENVS.clear()
    verifiers_env._tools.cache_clear()


def transcript(task, *turns) -> Transcript:
    return Transcript([*task.messages, *turns], "", "answer", len(turns))


def test_rows_become_tasks_with_the_envs_prompt(env_file):
    tasks = load_tasks(["verifiers:vf-tiny-add?num_examples=3"]).tasks
    assert len(tasks) == 3
    t = tasks[1]
    assert t.task_type == "verifiers" and t.task_id == "verifiers:vf-tiny-add:train#1"
    assert t.messages[0]["role"] == "system" and "add tool" in t.messages[0]["content"]
    assert t.messages[1] == {"role": "user", "content": "What is 1 + 4?"}
    assert t.ground_truth == "5" and t.data_source == "verifiers:vf-tiny-add"


def test_an_episode_uses_its_tools_and_its_rubric(env_file):
    task = load_tasks(["verifiers:vf_tiny_add"]).tasks[2]  # 2 + 5
    env = EnvRouter().make(task)
    start = asyncio.run(env.reset())
    assert start.messages == list(task.messages) and not env.single_turn
    (spec,) = start.tools
    assert spec["function"]["name"] == "add"
    assert set(spec["function"]["parameters"]["properties"]) == {"a", "b"}
    ok, bad = asyncio.run(env.step([ToolCall("add", {"a": 2, "b": 5}), ToolCall("add", {"a": 2})]))
    assert (ok.text, ok.is_error) == ("7", False)
    assert bad.is_error and bad.error_type == "invalid_arguments"
    call = {"id": "call_0", "type": "function"}
    call["function"] = {"name": "add", "arguments": '{"a": 2, "b": 5}'}
    turns = (
        {"role": "assistant", "content": "<tool_call>...</tool_call>", "tool_calls": [call]},
        {"role": "tool", "name": "add", "content": "7", "tool_call_id": "call_0"},
        {"role": "assistant", "content": "<answer>7</answer>"},
    )
    right = asyncio.run(env.reward(transcript(task, *turns)))
    assert right.score == 1.0
    assert right.parts["correct"] == 1.0 and right.parts["num_turns"] == 2.0
    assert right.parts["total_tool_calls"] == 1.0 and right.parts["add_calls"] == 1.0
    wrong = asyncio.run(env.reward(transcript(task, {"role": "assistant", "content": "8"})))
    assert wrong.score == 0.0 and wrong.parts["total_tool_calls"] == 0.0


def test_a_single_turn_env_plays_one_turn_without_tools(env_file):
    task = load_tasks(["verifiers:vf_tiny_add:eval?kind=single"]).tasks[0]  # eval: falls back
    env = EnvRouter().make(task)
    assert env.single_turn and asyncio.run(env.reset()).tools == []
    reply = {"role": "assistant", "content": "<answer>3</answer>"}
    assert asyncio.run(env.reward(transcript(task, reply))).score == 1.0


def test_a_tools_block_put_before_the_prompt_is_not_scored_as_a_turn(env_file):
    """Without a system message of the row's own, the episode puts the tool specs in one of its
    own (templates without tools=): the rubric still sees the row's prompt and the turns."""
    task = load_tasks(["verifiers:vf_tiny_add?system=false"]).tasks[0]  # 0 + 3
    assert task.messages[0]["role"] == "user"
    env = EnvRouter().make(task)
    block = {"role": "system", "content": "# Tools ..."}
    reply = {"role": "assistant", "content": "<answer>3</answer>"}
    scored = asyncio.run(env.reward(Transcript([block, *task.messages, reply], "", "answer", 1)))
    assert scored.score == 1.0 and scored.parts["num_turns"] == 1.0


def test_loading_keeps_toolgrpos_signal_handlers(env_file):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    load_tasks(["verifiers:vf_tiny_add?num_examples=1"])
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("verifiers:vf_tiny_add?kind=game", "answers the model with its own env_response"),
        ("verifiers:vf_tiny_add?kind=group", "group reward functions"),
        ("verifiers:vf_tiny_add?colour=1", "unexpected keyword argument 'colour'"),
        ("verifiers:no_such_vf_env", "'no_such_vf_env'.*ModuleNotFoundError.*--import"),
        ("verifiers:vf_tiny_add:test", "split 'test'"),
    ],
)
def test_what_cannot_be_played_is_refused_at_load(env_file, spec, needle):
    with pytest.raises(DataError, match=needle):
        load_tasks([spec])


def test_a_failing_reward_function_is_logged_not_hidden(env_file, caplog):
    """verifiers scores a raising reward function 0 and logs it: the record reaches toolgrpo's
    logging (verifiers alone drops it unless VF_LOG_LEVEL is set)."""
    task = load_tasks(["verifiers:vf_tiny_add?num_examples=1&kind=broken"]).tasks[0]
    env = EnvRouter().make(task)
    with caplog.at_level("ERROR"):
        scored = asyncio.run(env.reward(transcript(task, {"role": "assistant", "content": "3"})))
    assert scored.score == 0.0
    assert any(
        "crash" in r.getMessage() and "no such field" in r.getMessage() for r in caplog.records
    )


def test_bad_options_and_foreign_tasks_are_refused(env_file):
    with pytest.raises(EnvConfigError, match="unknown verifiers option"):
        EnvRouter({"verifiers": {"timeout": 3}})
    with pytest.raises(EnvConfigError, match="timeout_s must be a number > 0"):
        EnvRouter({"verifiers": {"timeout_s": 0}})
    (calc,) = load_tasks(["calculator:test"], max_samples=1).tasks
    stray = type(calc)(calc.task_id, calc.messages, calc.ground_truth, task_type="verifiers")
    with pytest.raises(EnvConfigError, match="no verifiers source"):
        EnvRouter().make(stray)


def test_a_verifiers_env_trains_two_steps(env_file, tiny_model_dir, tmp_path):
    from toolgrpo.cli import main

    out = tmp_path / "out"
    over = train_overrides(tiny_model_dir, "verifiers:vf_tiny_add", out, 2, **{MT: "true"})
    assert main(["train", *over, "--import", str(env_file)]) == 0
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["rollout/env_failures"] == 0.0 for r in recs)
    assert all("episode/verifiers/turns/mean" in r for r in recs)
    # the rubric scored every episode: its reward functions and metrics are logged as parts
    assert all("episode/verifiers/reward/correct/mean" in r for r in recs)
    assert all(r["episode/verifiers/reward/num_turns/mean"] >= 1.0 for r in recs)
