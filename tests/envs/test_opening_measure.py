"""The startup prompt-length check (``data.filter_overlong_prompts``) resets one environment per
task type where the environment derives the other tasks' openings (``Env.opening_for``: server
environments, whose every reset opens a session); others are still reset per task. Before, every
task's environment was reset, so a run over 1000 MCP tasks started 1000 servers at startup."""

from __future__ import annotations

from collections import Counter

from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvReward, EnvStart
from toolgrpo.envs.registry import EnvRouter, register_env
from toolgrpo.models.tiny import build_tiny_tokenizer
from toolgrpo.rollout.prompts import env_starts, filter_overlong, opening_length

SPEC = {"type": "function", "function": {"name": "t", "description": "d", "parameters": {}}}
RESETS: Counter[str] = Counter()


class Opening(Env):
    """System prompt + the task's messages + one tool; ``derives`` says whether it can tell
    another task's opening without a reset; ``down`` makes every reset fail."""

    derives = True
    down = False

    def __init__(self, task: Task, options) -> None:
        self.task = task

    async def reset(self) -> EnvStart:
        RESETS[self.task.task_type] += 1
        if type(self).down:
            raise ConnectionError("server down")
        return EnvStart(self._messages(self.task), [SPEC])

    @staticmethod
    def _messages(task: Task) -> list[dict[str, str]]:
        return [{"role": "system", "content": "sys"}, *(dict(m) for m in task.messages)]

    def opening_for(self, task: Task, start: EnvStart) -> EnvStart | None:
        if not type(self).derives:
            return None
        return EnvStart(self._messages(task), start.tools)

    async def step(self, calls):
        return []

    async def reward(self, transcript) -> EnvReward:
        return EnvReward(0.0)


class PerTask(Opening):
    derives = False


class Down(Opening):
    down = True


register_env("opening_derives")(Opening)
register_env("opening_per_task")(PerTask)
register_env("opening_down")(Down)


def tasks(task_type: str, n: int) -> list[Task]:
    return [
        Task(
            f"{task_type}{i}",
            ({"role": "user", "content": "word " * (10 * i)},),
            "",
            "t",
            task_type,
        )
        for i in range(n)
    ]


def test_one_reset_per_task_type_where_the_environment_derives_the_rest():
    RESETS.clear()
    router = EnvRouter({t: {"type": f"opening_{t}"} for t in ("derives", "per_task", "down")})
    all_tasks = tasks("derives", 6) + tasks("per_task", 4) + tasks("down", 5)
    starts = env_starts(router, all_tasks)
    assert RESETS == {"derives": 1, "per_task": 4, "down": 1}  # a dead server is asked once
    assert starts[10:] == [None] * 5
    for task, start in zip(all_tasks[:10], starts[:10], strict=True):
        assert start.messages == Opening._messages(task) and start.tools == [SPEC]


def test_the_filter_drops_by_the_derived_openings():
    RESETS.clear()
    tok = build_tiny_tokenizer()
    got = tasks("derives", 6)
    lengths = [opening_length(tok, EnvStart(Opening._messages(t), [SPEC])) for t in got]
    limit = sorted(lengths)[3]
    kept = filter_overlong(tok, got, limit, EnvRouter({"derives": {"type": "opening_derives"}}))
    fits = [t.task_id for t, n in zip(got, lengths, strict=True) if n <= limit]
    assert [t.task_id for t in kept] == fits
    assert 0 < len(kept) < len(got) and RESETS == {"derives": 1}
