"""``reverse_word``: the model is asked to reverse a word and may call a ``reverse`` tool.

Importing this module registers the type; toolgrpo imports it through the package's
``toolgrpo.envs`` entry point, ``--import toolgrpo_env_example.reverse`` or ``trainer.imports``.
Data rows are ordinary verl rows with ``task_type: reverse_word`` and the reversed word as the
ground truth (``make_rows`` writes some).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, Transcript
from toolgrpo.envs.registry import EnvConfigError, register_env
from toolgrpo.envs.tool_env import ToolEnv
from toolgrpo.tools.schema import tool

SYSTEM_PROMPT = (
    "You reverse words. You may call the reverse tool:\n"
    '<tool_call>{"name": "reverse", "arguments": {"text": "abc"}}</tool_call>\n'
    "Reply with the final answer only, as <answer>WORD</answer>."
)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@tool
def reverse(text: str) -> str:
    """Reverse a string.

    Args:
        text: the string to reverse
    """
    return text[::-1]


def check_options(options: Mapping[str, Any]) -> None:
    """Called once when the run starts: an unknown option stops it with one line."""
    unknown = sorted(set(options) - {"case_sensitive"})
    if unknown:
        raise EnvConfigError(f"unknown reverse_word option(s) {unknown}; known: case_sensitive")


def score(transcript: Transcript, ground_truth: str, case_sensitive: bool) -> EnvReward:
    """1 for the right last ``<answer>``, else 0; ``used_tool`` shows up as a metric."""
    said = [m.get("content") or "" for m in transcript.messages if m.get("role") == "assistant"]
    found = _ANSWER.findall(said[-1]) if said else []
    answer = found[-1].strip() if found else ""
    if not case_sensitive:
        answer, ground_truth = answer.lower(), ground_truth.lower()
    used = any(m.get("role") == "tool" for m in transcript.messages)
    return EnvReward(float(answer == ground_truth), {"used_tool": float(used)})


@register_env("reverse_word")
def make_reverse_env(task: Task, options: Mapping[str, Any]) -> ToolEnv:
    """One episode per task: the task's messages behind the system prompt, one pure tool."""
    check_options(options)
    case_sensitive = bool(options.get("case_sensitive", True))
    return ToolEnv(
        [{"role": "system", "content": SYSTEM_PROMPT}, *task.messages],
        [reverse],
        lambda t: score(t, task.ground_truth, case_sensitive),
        stateless=True,  # a pure tool: rollback needs no saved state
        reward_range=(0.0, 1.0),
    )


make_reverse_env.validate_options = check_options  # type: ignore[attr-defined]


def make_rows(words: list[str]) -> list[dict[str, Any]]:
    """verl-style data rows for ``words`` (write them as JSONL for ``data.train_files``)."""
    return [
        {
            "data_source": "reverse_word",
            "task_type": "reverse_word",
            "prompt": [{"role": "user", "content": f"Reverse the word {w!r}."}],
            "reward_model": {"ground_truth": w[::-1]},
        }
        for w in words
    ]
