"""Single-turn rollouts: render each task's prompt, sample n completions, decode for scoring."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.rollout.generator import Completion, Generator, SamplingParams
from toolgrpo.rollout.prompts import render_prompt


def rollout_tasks(
    generator: Generator,
    tokenizer: Any,
    tasks: Sequence[Task],
    params: SamplingParams,
    max_prompt_length: int,
    truncation: str = "left",
) -> list[Completion]:
    """``params.n`` completions per task, grouped by task in task order."""
    prompts = [render_prompt(tokenizer, t.messages, max_prompt_length, truncation) for t in tasks]
    return generator.generate(prompts, params)


def solution_text(tokenizer: Any, completion: Completion) -> str:
    """The decoded prompt + response with special tokens kept, as verl hands it to a reward."""
    return tokenizer.decode(completion.prompt_ids + completion.token_ids, skip_special_tokens=False)
