"""Rendering task messages into prompt token ids with the tokenizer's chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class PromptTooLong(ValueError):
    """A prompt over ``data.max_prompt_length`` with ``data.truncation=error``."""


def render_prompt(
    tokenizer: Any,
    messages: Sequence[dict[str, str]],
    max_length: int,
    truncation: str = "left",
) -> list[int]:
    """Chat-templated prompt ids ending in the generation prompt; long prompts lose their left part
    (ToolRL/verl's behaviour) or raise, as configured."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # transformers 5 may return a BatchEncoding
        ids = list(ids["input_ids"])
    if len(ids) <= max_length:
        return ids
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "error":
        raise PromptTooLong(f"prompt has {len(ids)} tokens > data.max_prompt_length={max_length}")
    raise ValueError(f"data.truncation must be 'left' or 'error', got {truncation!r}")
