"""The ``direct`` task set (issue 16): questions answered from the prompt alone, with no tools.
Its files regenerate byte for byte, train and test share no prompt, and the environment scores the
gold answer 1 and anything else 0."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolgrpo.data.loader import embedded_path, load_tasks
from toolgrpo.envs.base import Transcript
from toolgrpo.envs.direct import answers_match
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rewards.scoring import check_task
from toolgrpo.tools.parser import parse_tool_calls

ROOT = Path(__file__).resolve().parents[2]


def rows(name: str) -> list[dict]:
    path = embedded_path(f"{name}.jsonl", "envs")
    return [json.loads(line) for line in path.read_text().splitlines()]


def play_answer(task, text: str) -> float:
    env = EnvRouter().make(task)
    start = asyncio.run(env.reset())
    msgs = [*start.messages, {"role": "assistant", "content": text}]
    return asyncio.run(env.reward(Transcript(msgs, "", "answer", 1))).score


@pytest.mark.parametrize("spec, size", [("direct:train", 400), ("direct:test", 100)])
def test_direct_loads_by_embedded_name(spec, size):
    """Pins: ``direct:train``/``direct:test`` were unknown dataset names and task type."""
    data = load_tasks([spec], bad_rows="error", check=check_task)
    assert len(data.tasks) == size and not data.problems
    assert {t.task_type for t in data.tasks} == {"direct"}
    kinds = {r["extra_info"]["kind"] for r in rows(spec.replace(":", "_"))}
    assert kinds == {"arithmetic", "age", "counting", "capital", "stated_fact"}


def test_train_and_test_prompts_are_disjoint():
    train = {r["prompt"][0]["content"] for r in rows("direct_train")}
    test = {r["prompt"][0]["content"] for r in rows("direct_test")}
    assert len(train) == 400 and len(test) == 100 and not train & test


def test_env_scores_gold_one_and_wrong_zero():
    tasks = load_tasks(["direct:test"]).tasks[:25]
    for t in tasks:
        assert play_answer(t, f"<answer>{t.ground_truth}</answer>") == 1.0, t.ground_truth
        assert play_answer(t, "<answer>Zebulon 999</answer>") == 0.0
        assert play_answer(t, t.ground_truth) == 0.0  # no <answer> tag: not an answer


def test_env_offers_no_tools_and_a_stray_call_is_an_unknown_tool_error():
    task = load_tasks(["direct:test"]).tasks[0]
    env = EnvRouter().make(task)
    start = asyncio.run(env.reset())
    assert start.tools == [] and env.max_turns == 2
    assert start.messages[0]["role"] == "system" and "<answer>" in start.messages[0]["content"]
    calls = parse_tool_calls('<tool_call>{"name": "calculate", "arguments": {}}</tool_call>')
    (res,) = asyncio.run(env.step(calls))
    assert res.is_error and res.error_type == "unknown_tool"


@pytest.mark.parametrize(
    "answer, gold, ok",
    [
        ("7", "7", True),
        ("7.0", "7", True),
        ("8", "7", False),
        ("The hallway", "the hallway", True),
        ("hallway.", "the hallway", True),
        ("kitchen", "the hallway", False),
        ("", "the hall", False),
    ],
)
def test_answers_match(answer, gold, ok):
    assert answers_match(answer, gold) is ok


def test_generator_reproduces_the_direct_files(tmp_path):
    """The direct files come from the seeded script, byte for byte (and the others stay put)."""
    script = ROOT / "scripts" / "make_env_data.py"
    subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    for name in ("direct_train", "direct_test", "calculator_train", "search_train"):
        shipped = embedded_path(f"{name}.jsonl", "envs").read_bytes()
        assert (tmp_path / f"{name}.jsonl").read_bytes() == shipped, name
