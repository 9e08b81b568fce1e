"""Rendering task messages into prompt token ids with the tokenizer's chat template."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from toolgrpo.data.loader import DataError

log = logging.getLogger(__name__)


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


def filter_overlong(tokenizer: Any, tasks: Sequence[Any], max_length: int) -> list[Any]:
    """Tasks whose rendered prompt fits ``max_length`` (verl's ``filter_overlong_prompts``)."""
    kept = [t for t in tasks if len(render_prompt(tokenizer, t.messages, 10**9)) <= max_length]
    if not kept:
        raise DataError(f"every prompt exceeds data.max_prompt_length={max_length}")
    if len(kept) < len(tasks):
        log.warning(
            "dropped %d of %d prompts over %d tokens",
            len(tasks) - len(kept),
            len(tasks),
            max_length,
        )
    return kept
