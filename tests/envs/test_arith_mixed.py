"""``arith_mixed``: arithmetic where the calculator helps only on half the tasks. The shipped
files load by name with a balanced ``needs_tool`` label, regenerate byte for byte from the seeded
script and share no question with ``direct``; the environment offers the calculator, whose answer
to a hard task is the ground truth, and scores the final ``<answer>`` exactly."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from toolgrpo.data.loader import embedded_path, load_tasks
from toolgrpo.data.task import Task
from toolgrpo.envs.arith_mixed import SYSTEM_PROMPT, needs_tool
from toolgrpo.envs.base import Transcript
from toolgrpo.envs.calculator import calculator_tools
from toolgrpo.envs.direct import tools_prompt
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.rewards.scoring import check_task
from toolgrpo.tools.parser import parse_tool_calls

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def rows(split: str) -> list[dict]:
    path = embedded_path(f"arith_mixed_{split}.jsonl", "envs")
    return [json.loads(line) for line in path.read_text().splitlines()]


def reward(task: Task, text: str) -> float:
    env = EnvRouter().make(task)
    start = asyncio.run(env.reset())
    msgs = [*start.messages, {"role": "assistant", "content": text}]
    return asyncio.run(env.reward(Transcript(msgs, "", "answer", 1))).score


@pytest.mark.parametrize("spec, size", [("arith_mixed:train", 400), ("arith_mixed:test", 100)])
def test_loads_by_embedded_name_with_a_balanced_needs_tool_label(spec, size):
    data = load_tasks([spec], bad_rows="error", check=check_task)
    assert len(data.tasks) == size and not data.problems
    assert {(t.task_type, t.data_source) for t in data.tasks} == {("arith_mixed", "arith_mixed")}
    labels = [needs_tool(t) for t in data.tasks]
    assert labels.count(True) == labels.count(False) == size // 2  # Task.meta carries it
    raw = rows(spec.split(":")[1])
    assert [r["extra_info"]["needs_tool"] for r in raw] == labels
    kinds = {(r["extra_info"]["kind"], r["extra_info"]["needs_tool"]) for r in raw}
    easy = {("small_sum", False), ("small_product", False), ("stated", False)}
    assert kinds == easy | {("product", True), ("division", True)}


def test_needs_tool_for_the_other_task_types():
    def task(task_type: str, **meta) -> Task:
        return Task("t", ({"role": "user", "content": "q"},), "1", task_type, task_type, meta=meta)

    assert [needs_tool(task(t)) for t in ("calculator", "search", "direct", "rlla")] == [
        True,
        True,
        False,
        None,
    ]
    assert needs_tool(task("arith_mixed", needs_tool=False)) is False


def test_easy_tasks_are_small_or_state_their_answer():
    for r in rows("train") + rows("test"):
        q, gold = r["prompt"][0]["content"], r["reward_model"]["ground_truth"]
        kind, numbers = r["extra_info"]["kind"], re.findall(r"\d+", q)
        if kind == "stated":
            assert gold in numbers
        elif kind in ("small_sum", "small_product"):
            assert all(len(n) == 1 for n in numbers)
        else:
            assert r["extra_info"]["needs_tool"] and gold not in numbers
            assert max(len(n) for n in numbers) >= 4


def test_disjoint_splits_and_no_direct_question():
    train = {r["prompt"][0]["content"] for r in rows("train")}
    test = {r["prompt"][0]["content"] for r in rows("test")}
    direct = {
        json.loads(line)["prompt"][0]["content"]
        for split in ("train", "test")
        for line in embedded_path(f"direct_{split}.jsonl", "envs").read_text().splitlines()
    }
    assert len(train) == 400 and len(test) == 100 and not train & test
    assert not (train | test) & direct


def test_env_offers_the_calculator_and_it_answers_the_hard_tasks():
    tasks = load_tasks(["arith_mixed:test"]).tasks
    env = EnvRouter().make(tasks[0])
    start = asyncio.run(env.reset())
    assert start.tools == [t.spec() for t in calculator_tools()] and env.max_turns == 4
    assert start.messages[0]["content"] == SYSTEM_PROMPT == tools_prompt(("calculator",))
    for t in tasks:
        if not needs_tool(t):
            continue
        a, b = re.findall(r"\d+", t.messages[-1]["content"])
        op = "/" if "divided" in t.messages[-1]["content"] else "*"
        call = {"name": "calculate", "arguments": {"expression": f"{a} {op} {b}"}}
        (res,) = asyncio.run(
            env.step(parse_tool_calls(f"<tool_call>{json.dumps(call)}</tool_call>"))
        )
        assert not res.is_error and res.text == t.ground_truth


def test_reward_is_the_final_answer_checked_as_a_number():
    tasks = load_tasks(["arith_mixed:test"]).tasks[:20]
    for t in tasks:
        assert reward(t, f"<answer>{t.ground_truth}</answer>") == 1.0
        assert reward(t, f"<answer>{int(t.ground_truth) + 1}</answer>") == 0.0  # no tolerance
        assert reward(t, t.ground_truth) == 0.0  # no <answer> tag
    big = next(t for t in tasks if int(t.ground_truth) >= 1000)
    assert reward(big, f"<answer>{int(big.ground_truth):,}</answer>") == 1.0  # 1,234 = 1234
    assert reward(big, f"<answer>{big.ground_truth}.0</answer>") == 1.0
    assert reward(big, "<answer>about 6 million</answer>") == 0.0


@pytest.mark.parametrize(
    "options, match",
    [
        ({"timeout_s": -1}, "arith_mixed option timeout_s must be a number > 0"),
        ({"timeout_s": True}, "timeout_s must be a number"),
        ({"offer_tools": True}, r"unknown arith_mixed option\(s\) \['offer_tools'\]"),
    ],
)
def test_bad_options_are_refused_when_the_router_is_built(options, match):
    with pytest.raises(EnvConfigError, match=match):
        EnvRouter({"arith_mixed": options})
    assert EnvRouter({"arith_mixed": {"timeout_s": 3}}).specs["arith_mixed"].max_turns == 4


def test_script_regenerates_the_shipped_files(tmp_path, monkeypatch):
    """Seeded: the same bytes from the script (its part of ``make_env_data.py``, run alone)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.delitem(sys.modules, "env_data_arith", raising=False)
    from env_data_arith import write_arith_mixed

    write_arith_mixed(tmp_path, seed=0)
    for split in ("train", "test"):
        shipped = embedded_path(f"arith_mixed_{split}.jsonl", "envs").read_bytes()
        assert (tmp_path / f"arith_mixed_{split}.jsonl").read_bytes() == shipped, split
    write_arith_mixed(tmp_path, seed=1)  # another seed, other questions
    assert (tmp_path / "arith_mixed_test.jsonl").read_bytes() != shipped
