"""What the router head reads for a task: the prompt the model itself would open the episode with
(system prompt, tool list and question) before any route rewrites it, or the bare question.

The head can only tell tasks apart by what its features carry. An environment task's bare
messages are the user's question alone; the environment's opening adds the system prompt and the
tools it offers, which is where "this task comes with a calculator" shows. Openings are rendered
as the episode loop renders them, in the run's tool-call format (``multi_turn.format``: the
calling instructions a template without ``tools=`` gets), and cached per task id (an environment
opens once per task).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvStart
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rollout.prompts import env_starts, render_prompt
from toolgrpo.rollout.render import encode, render_text, with_tools
from toolgrpo.rollout.tool_parsers import get_format

FEATURE_INPUTS = ("opening", "question")


def opening_ids(
    tokenizer: Any, start: EnvStart, max_length: int, tool_format: str = "hermes"
) -> list[int]:
    """The opening as the episode loop renders it (tools in the template, or listed with the
    ``tool_format``'s calling instructions), left-truncated."""
    messages, tools = with_tools(tokenizer, start.messages, start.tools, tool_format)
    ids = encode(tokenizer, render_text(tokenizer, messages, tools, True))
    return ids[-max_length:]


def _key(task: Task) -> tuple[str, str]:
    return (task.task_type, task.task_id)


class RouterInputs:
    """Prompt ids for the head, per task: ``opening`` (environment tasks: the environment's
    opening; single-turn tasks: their own messages, which already hold the system prompt) or
    ``question`` (the task's messages only). Openings use the episodes' ``tool_format``."""

    def __init__(
        self,
        tokenizer: Any,
        max_length: int,
        envs: EnvRouter | None,
        source: str = "opening",
        tool_format: str = "hermes",
    ) -> None:
        if source not in FEATURE_INPUTS:
            raise ValueError(f"router input {source!r} is not one of {', '.join(FEATURE_INPUTS)}")
        get_format(tool_format)  # an unknown format fails here, not at the first task
        self.tokenizer, self.max_length = tokenizer, max_length
        self.envs, self.source, self.tool_format = envs, source, tool_format
        self._cache: dict[tuple[str, str], list[int]] = {}

    def _question(self, task: Task) -> list[int]:
        return render_prompt(self.tokenizer, task.messages, self.max_length, "left")

    def __call__(self, tasks: Sequence[Task]) -> list[list[int]]:
        if self.source == "question" or self.envs is None:
            return [self._question(t) for t in tasks]
        todo = [t for t in tasks if _key(t) not in self._cache]
        if todo:
            fresh = {_key(t): t for t in todo}  # a task twice in one call opens once
            starts = env_starts(self.envs, list(fresh.values()))
            for task, start in zip(fresh.values(), starts, strict=True):
                # An environment that cannot open fails its episode; the head still routes it.
                ids = (
                    self._question(task)
                    if start is None
                    else opening_ids(self.tokenizer, start, self.max_length, self.tool_format)
                )
                self._cache[_key(task)] = ids
        return [self._cache[_key(t)] for t in tasks]
