"""BFCL multi-turn environment: tasks from the installed bfcl-eval package, its simulators behind
``step``, the ground-truth replay behind ``reward``, and snapshot/restore."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from typing import Any

import pytest

pytest.importorskip("bfcl_eval")

from toolgrpo.data.loader import DataError, load_tasks  # noqa: E402
from toolgrpo.envs._bfcl_calls import make_instances, parse_call, run_ground_truth  # noqa: E402
from toolgrpo.envs._bfcl_data import (  # noqa: E402
    CATEGORIES,
    TASK_TYPE,
    bfcl_tasks,
    entry_by_id,
    entry_to_task,
    load_entries,
)
from toolgrpo.envs.base import EnvReward, Transcript  # noqa: E402
from toolgrpo.envs.bfcl import BfclEnv, BfclOptions  # noqa: E402
from toolgrpo.envs.registry import EnvConfigError, EnvRouter  # noqa: E402
from toolgrpo.tools.types import ToolCall  # noqa: E402

DONE = Transcript(messages=[], text="", stop_reason="answer", num_turns=1)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make_env(bfcl_id: str, **options: Any) -> BfclEnv:
    env = BfclEnv(entry_to_task(entry_by_id(bfcl_id), "test"), BfclOptions(**options))
    run(env.reset())
    return env


def as_calls(env: BfclEnv, sources: list[str]) -> list[ToolCall]:
    """BFCL's python-syntax ground truth as the JSON calls a model would make."""
    calls = []
    for i, source in enumerate(sources):
        name, args, kwargs = parse_call(source)
        if args:  # a positional argument: name it from the simulator's signature
            owner = env._state.instances[env._owners[name]]
            kwargs = dict(inspect.signature(getattr(owner, name)).bind(*args, **kwargs).arguments)
        calls.append(ToolCall(name=name, arguments=kwargs, id=f"call_{i}"))
    return calls


def play(env: BfclEnv, turns: list[list[str]]) -> EnvReward:
    """Make each turn's calls, then answer (ending the turn); score the episode."""
    for sources in turns:
        if sources:
            results = run(env.step(as_calls(env, sources)))
            assert len(results) == len(sources)
        run(env.next_user_turn([]))
    return run(env.reward(DONE))


def call(env: BfclEnv, name: str, **arguments: Any):
    return run(env.step([ToolCall(name=name, arguments=arguments, id="call_0")]))[0]


# ---- tasks -------------------------------------------------------------------------------------


def test_tasks_load_from_the_package():
    train = load_tasks(["bfcl_multi_turn:train"]).tasks
    test = load_tasks("bfcl_multi_turn:test").tasks
    assert len(train) + len(test) == 4 * 200 - 1  # miss_func_49's ground truth is unplayable
    assert 0.15 < len(test) / (len(train) + len(test)) < 0.25
    for task in train + test:
        assert task.task_type == TASK_TYPE and task.data_source == TASK_TYPE
        assert task.meta["bfcl_id"].startswith("multi_turn_")  # never a single-turn category
        assert task.meta["category"] in CATEGORIES
        assert [m["role"] for m in task.messages] == ["system", "user"]
        assert task.tools and task.meta["involved_classes"] and "initial_config" in task.meta
        truth = json.loads(task.ground_truth)
        assert len(truth) == len(task.meta["user_turns"]) + 1
    assert {t.meta["category"] for t in train} == set(CATEGORIES)


def test_split_is_deterministic_and_disjoint_by_scenario():
    train, test = bfcl_tasks("bfcl_multi_turn:train"), bfcl_tasks("bfcl_multi_turn:test")
    assert [t.task_id for t in train] == [t.task_id for t in bfcl_tasks("bfcl_multi_turn:train")]
    assert not {t.task_id for t in train} & {t.task_id for t in test}

    def scenarios(tasks):
        return {int(t.meta["bfcl_id"].rsplit("_", 1)[1]) for t in tasks}

    # every variant of a scenario (base, miss_func, ...) is on the same side
    assert not scenarios(train) & scenarios(test)
    assert all(t.meta["split"] == "test" for t in test)


def test_category_filter_and_bad_names():
    base = bfcl_tasks("bfcl_multi_turn:test:base")
    assert base and {t.meta["category"] for t in base} == {"base"}
    both = bfcl_tasks("bfcl_multi_turn:test:base,miss_param")
    assert {t.meta["category"] for t in both} == {"base", "miss_param"}
    for bad in ("bfcl_multi_turn:dev", "bfcl_multi_turn:test:simple", "bfcl_multi_turn:train:live"):
        with pytest.raises(DataError):
            load_tasks(bad)


# ---- reset and tools ---------------------------------------------------------------------------


def test_reset_gives_messages_and_valid_tool_specs():
    env = BfclEnv(entry_to_task(entry_by_id("multi_turn_base_0"), "test"))
    start = run(env.reset())
    assert [m["role"] for m in start.messages] == ["system", "user"]
    assert "<tool_call>" in start.messages[0]["content"]
    assert "final_report.pdf" in start.messages[1]["content"]
    names = {t["function"]["name"] for t in start.tools}
    assert {"cd", "mkdir", "mv", "post_tweet"} <= names
    json_types = {"object", "string", "number", "integer", "array", "boolean", "null"}

    def types(node: Any) -> set[str]:
        if isinstance(node, dict):
            found = {node["type"]} if isinstance(node.get("type"), str) else set()
            return found.union(*(types(v) for k, v in node.items() if k != "type"))
        if isinstance(node, list):
            return set().union(*(types(v) for v in node))
        return set()

    for spec in start.tools:
        assert spec["type"] == "function"
        assert spec["function"]["parameters"]["type"] == "object"
        assert types(spec) <= json_types | {"function"}


# ---- reward ------------------------------------------------------------------------------------


@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_through_step_scores_one(category):
    for entry in load_entries(category)[::20]:
        env = make_env(entry.id)
        reward = play(env, entry.ground_truth)
        assert reward.score == 1.0, entry.id
        assert reward.parts == {"turns_passed": 1.0, "state_match": 1.0, "turns_completed": 1.0}


def test_wrong_or_missing_calls_score_less():
    truth = entry_by_id("multi_turn_base_0").ground_truth  # four turns
    assert play(make_env("multi_turn_base_0"), [[] for _ in truth]).score == 0.0
    wrong = [["cd(folder='document')", "mkdir(dir_name='tmp')"], *truth[1:]]
    reward = play(make_env("multi_turn_base_0"), wrong)
    assert reward.score == 0.0 and reward.parts["state_match"] == 0.0
    # the first two turns right, then a wrong file sorted: credit for the passing prefix only
    partial = [*truth[:2], ["sort(file_name='budget.txt')"], truth[3]]
    assert play(make_env("multi_turn_base_0"), partial).score == pytest.approx(2 / 4)


def test_episode_cut_off_early_fails_the_unreached_turns():
    entry = entry_by_id("multi_turn_base_0")
    env = make_env(entry.id)
    run(env.step(as_calls(env, entry.ground_truth[0])))  # no answer: max_turns hit mid-turn
    reward = run(env.reward(DONE))
    assert reward.score == pytest.approx(1 / 4)
    assert reward.parts["turns_completed"] == 0.0 and reward.parts["state_match"] == 0.0
    assert run(env.reward(DONE)) == reward  # scoring leaves the episode as it was


def test_ground_truth_replay_matches_bfcl_executor():
    utils = pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    checker = pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    for entry in load_entries("base")[:5]:
        ours = make_instances(entry)
        for turn in entry.ground_truth:
            theirs, instances = utils.execute_multi_turn_func_call(
                turn, entry.initial_config, entry.involved_classes, "toolgrpo_test", entry.id
            )
            assert run_ground_truth(ours, turn) == theirs
            assert checker.state_checker(ours, instances)["valid"]


# ---- bad calls ---------------------------------------------------------------------------------


def test_bad_calls_become_error_results():
    env = make_env("multi_turn_base_0")
    assert call(env, "rm_rf").error_type == "unknown_tool"
    assert call(env, "cd").error_type == "invalid_arguments"  # missing required folder
    assert call(env, "cd", folder="document", force=True).error_type == "invalid_arguments"
    crashed = call(env, "cd", folder=123)  # the simulator itself raises
    assert crashed.is_error and crashed.error_type == "exception"
    assert crashed.text.startswith("Error during execution")
    broken = ToolCall(name="", raw="{oops", parse_error="not JSON", id="call_0")
    assert run(env.step([broken]))[0].error_type == "parse"
    odd = ToolCall(name="cd", arguments=["document"], id="call_0")  # type: ignore[arg-type]
    assert run(env.step([odd]))[0].error_type == "invalid_arguments"
    ok = call(env, "cd", folder="document")  # the env still works afterwards
    assert not ok.is_error and "document" in ok.text


def test_a_hanging_call_times_out():
    env = make_env("multi_turn_base_0", call_timeout=0.05)
    env._state.instances["GorillaFileSystem"].pwd = lambda: time.sleep(0.5)
    result = call(env, "pwd")
    assert result.is_error and result.error_type == "timeout"


def test_a_hanging_call_does_not_hold_up_asyncio_run():
    """Issue 15: a timed-out call ran on in the loop's default executor, which `asyncio.run`
    joins at exit: the step lasted as long as the call, not its timeout."""
    env = make_env("multi_turn_base_0", call_timeout=0.1)
    env._state.instances["GorillaFileSystem"].pwd = lambda: time.sleep(3)
    start = time.monotonic()
    result = call(env, "pwd")
    assert result.error_type == "timeout" and time.monotonic() - start < 2


def test_unknown_options_are_refused_and_router_builds_the_env():
    task = entry_to_task(entry_by_id("multi_turn_base_0"), "test")
    env = EnvRouter().make(task)
    assert isinstance(env, BfclEnv) and env.max_turns >= 1
    router = EnvRouter({TASK_TYPE: {"max_turns": 12, "call_timeout": 5}})
    assert router.make(task).max_turns == 12
    with pytest.raises(EnvConfigError):
        EnvRouter({TASK_TYPE: {"nonsense": 1}}).make(task)


# ---- turns -------------------------------------------------------------------------------------


def test_next_user_turn_walks_the_turns():
    entry = entry_by_id("multi_turn_base_0")
    env = make_env(entry.id)
    for turn in entry.turns[1:]:
        assert run(env.next_user_turn([])) == turn
    assert run(env.next_user_turn([])) is None
    assert run(env.next_user_turn([])) is None


def test_missed_function_is_revealed_in_its_turn():
    entry = entry_by_id("multi_turn_miss_func_0")  # sort is held back until turn 3
    assert entry.missed_function == {"3": ["sort"]}
    env = make_env(entry.id)
    start_tools = {t["function"]["name"] for t in entry_to_task(entry, "t").tools}
    assert "sort" not in start_tools
    assert call(env, "sort", file_name="final_report.pdf").error_type == "unknown_tool"
    for _ in range(2):
        run(env.next_user_turn([]))
    reveal = run(env.next_user_turn([]))
    assert reveal[0]["role"] == "user" and '"name": "sort"' in reveal[0]["content"]
    call(env, "cd", folder="workspace")
    assert call(env, "sort", file_name="x").error_type is None  # now callable


# ---- snapshot / restore ------------------------------------------------------------------------


def test_snapshot_restore_round_trip():
    env = make_env("multi_turn_base_0")
    assert env.supports_snapshot
    call(env, "cd", folder="document")
    before = call(env, "ls").text
    saved = env.snapshot()
    call(env, "touch", file_name="new.txt")
    run(env.next_user_turn([]))
    assert "new.txt" in call(env, "ls").text
    env.restore(saved)
    assert "new.txt" not in call(env, "ls").text and call(env, "ls").text == before
    assert env._state.turn == 0
    env.restore(saved)  # a snapshot can be restored more than once
    call(env, "touch", file_name="other.txt")
    env.restore(saved)
    assert "other.txt" not in call(env, "ls").text
