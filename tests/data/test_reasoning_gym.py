"""reasoning-gym data sources (``toolgrpo.data.reasoning_gym``) and the ``reasoning_gym``
environment that plays them with the calculator (``toolgrpo.envs.reasoning_gym``)."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import read_metrics, train_overrides
from toolgrpo.data.loader import DataError, load_tasks
from toolgrpo.data.reasoning_gym import parse_spec
from toolgrpo.envs.base import Transcript
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.tools.types import ToolCall

MT = "actor_rollout_ref.rollout.multi_turn.enable"


def transcript(task, reply: str) -> Transcript:
    messages = [*task.messages, {"role": "assistant", "content": reply}]
    return Transcript(messages, "", "answer", 1)


def test_spec_defaults_sizes_seeds_and_config():
    train, split = parse_spec("reasoning_gym:products")
    assert (train.dataset, train.size, train.seed, train.config, split) == (
        "products",
        1000,
        0,
        "{}",
        "train",
    )
    test, split = parse_spec("reasoning_gym:products:test?seed=3&size=7&max_digits=3")
    assert (test.size, test.seed, split) == (7, 7, "test")  # 2 * 3 + 1: never a train seed
    assert test.config == '{"max_digits": 3}'


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("reasoning_gym:products:valid", "split 'valid'"),
        ("reasoning_gym:products?size=0", "size must be between"),
        ("reasoning_gym:products?seed=-1", "seed must be a whole number"),
        ("reasoning_gym:products?size=2&size=3", "given twice"),
        ("reasoning_gym:prodcts?size=2", "did you mean products"),
        ("reasoning_gym:products?size=2&colour=red", "refused its options"),
        ("reasoning_gym:", "want reasoning_gym:NAME"),
    ],
)
def test_bad_specs_are_one_clear_error(spec, needle):
    with pytest.raises(DataError, match=needle):
        load_tasks([spec])


def test_tasks_are_seeded_and_splits_differ():
    a = load_tasks(["reasoning_gym:basic_arithmetic?size=6&seed=4"]).tasks
    b = load_tasks(["reasoning_gym:basic_arithmetic?size=6&seed=4"]).tasks
    test = load_tasks(["reasoning_gym:basic_arithmetic:test?size=6&seed=4"]).tasks
    assert len(a) == 6 and [t.messages for t in a] == [t.messages for t in b]
    assert [t.messages for t in a] != [t.messages for t in test]
    t = a[0]
    assert t.task_type == "reasoning_gym" and t.task_id == "reasoning_gym:basic_arithmetic:train#0"
    assert t.data_source == "reasoning_gym:basic_arithmetic" and t.ground_truth


def test_the_env_offers_the_calculator_and_scores_with_the_datasets_verifier():
    (task,) = load_tasks(["reasoning_gym:products?size=1&seed=2"]).tasks
    env = EnvRouter().make(task)
    start = asyncio.run(env.reset())
    assert start.messages[0]["role"] == "system" and start.messages[1] == task.messages[0]
    assert {t["function"]["name"] for t in start.tools} == {"calculate", "solve"}
    product = task.messages[0]["content"].split(": ")[1].split(".")[0]  # "a * b"
    (res,) = asyncio.run(env.step([ToolCall("calculate", {"expression": product})]))
    assert not res.is_error and res.text == task.ground_truth
    right = asyncio.run(env.reward(transcript(task, f"<answer>{res.text}</answer>")))
    assert right.score == 1.0 and right.parts == {"exact": 1.0, "has_answer": 1.0}
    wrong = asyncio.run(env.reward(transcript(task, "<answer>12</answer>")))
    assert wrong.score == 0.0 and wrong.parts["exact"] == 0.0
    none = asyncio.run(env.reward(transcript(task, task.ground_truth)))  # no <answer> tags
    assert none.score == 0.0 and none.parts["has_answer"] == 0.0


def test_partial_credit_is_the_datasets_own():
    (task,) = load_tasks(["reasoning_gym:fraction_simplification?size=1"]).tasks
    env = EnvRouter().make(task)
    right = asyncio.run(env.reward(transcript(task, f"<answer>{task.ground_truth}</answer>")))
    near = asyncio.run(env.reward(transcript(task, "<answer>1/2</answer>")))
    assert right.score == 1.0 and 0.0 <= near.score < 1.0


def test_options_and_tasks_from_elsewhere_are_refused():
    (task,) = load_tasks(["reasoning_gym:products?size=1"]).tasks
    no_tools = EnvRouter({"reasoning_gym": {"calculator": False}}).make(task)
    assert asyncio.run(no_tools.reset()).tools == []
    with pytest.raises(EnvConfigError, match="unknown reasoning_gym option"):
        EnvRouter({"reasoning_gym": {"calculater": False}})
    with pytest.raises(EnvConfigError, match="timeout_s must be a number"):
        EnvRouter({"reasoning_gym": {"timeout_s": "soon"}})
    (calc,) = load_tasks(["calculator:test"], max_samples=1).tasks
    stray = type(calc)(calc.task_id, calc.messages, calc.ground_truth, task_type="reasoning_gym")
    with pytest.raises(EnvConfigError, match="no reasoning-gym source"):
        EnvRouter().make(stray)


def test_a_reasoning_gym_dataset_trains_two_steps(tiny_model_dir, tmp_path):
    from toolgrpo.cli import main

    out = tmp_path / "out"
    spec = "reasoning_gym:basic_arithmetic?size=4&seed=1"
    over = train_overrides(tiny_model_dir, spec, out, 2, **{MT: "true"})
    assert main(["train", *over]) == 0
    recs = read_metrics(out)
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["rollout/env_failures"] == 0.0 for r in recs)
    assert all("episode/reasoning_gym/turns/mean" in r for r in recs)
