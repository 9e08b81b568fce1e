"""SFT examples: chat-templated token ids with a loss mask on assistant tokens only.

Each assistant turn's span is found by rendering the conversation up to it (with the generation
prompt) and through it; the span is the difference, up to and including its end-of-turn token.
The embedded RLLA test split is refused wherever it appears.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolgrpo.data.loader import DataError, prompt_key, read_rows, test_prompt_keys
from toolgrpo.data.loader import load_tasks as load_rl_tasks
from toolgrpo.data.task import ROLES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTExample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on assistant tokens (content + end-of-turn)
    source: str


def _ids(tokenizer: Any, messages: Sequence[dict[str, str]], gen: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=gen, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def tokenize_conversation(
    tokenizer: Any, messages: Sequence[dict[str, str]], end_ids: set[int]
) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and a mask that is 1 on assistant tokens."""
    full = _ids(tokenizer, messages, False)
    mask = [0] * len(full)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(_ids(tokenizer, messages[:i], True)) if i else 0
        through = _ids(tokenizer, messages[: i + 1], False)
        if full[: len(through)] != through:
            raise ValueError("chat template is not prefix-stable; cannot locate assistant turns")
        end = len(through)
        # Train up to and including the end-of-turn token; whitespace after it is template.
        for k in range(start, end):
            if full[k] in end_ids:
                end = k + 1
                break
        for k in range(start, end):
            mask[k] = 1
    if not any(mask):
        raise ValueError("no assistant turn to train on")
    return full, mask


def _conversations(spec: str, target: str) -> list[tuple[list[dict[str, str]], str]]:
    """(messages, source) pairs from RLLA-schema rows or message JSONL rows."""
    convs = []
    rows = None if spec.startswith("rlla:") else list(read_rows(spec))
    if rows is not None and rows and isinstance(rows[0], dict) and "messages" in rows[0]:
        for i, r in enumerate(rows):
            if not isinstance(r, dict) or not isinstance(r.get("messages"), list):
                raise DataError(f"{spec} row {i}: 'messages' must be a list")
            for m in r["messages"]:
                if not isinstance(m, dict) or m.get("role") not in ROLES:
                    raise DataError(f"{spec} row {i}: each message needs a role in {ROLES}")
                if not isinstance(m.get("content"), str):
                    raise DataError(f"{spec} row {i}: each message needs a string 'content'")
            convs.append(([dict(m) for m in r["messages"]], f"{spec}#{i}"))
        return convs
    for t in load_rl_tasks(spec, bad_rows="error").tasks:
        answer = t.ground_truth
        if target == "output_sft":
            answer = t.meta.get("output_sft")
            if not answer:
                raise DataError(f"{t.task_id}: no SFT output; use data.target=ground_truth")
        elif target != "ground_truth":
            raise DataError(f"data.target must be ground_truth or output_sft, got {target!r}")
        convs.append(([*t.messages, {"role": "assistant", "content": answer}], t.task_id))
    return convs


def refuse_test_split(messages: Sequence[dict[str, str]], source: str) -> None:
    """The RLLA test split is held out: training on it would make every eval number a lie."""
    prompt = [m["content"] for m in messages if m["role"] in ("system", "user")]
    if prompt_key(prompt) in test_prompt_keys():
        raise DataError(
            f"{source}: this row is in the held-out RLLA test split; refusing to train on it"
        )


def build_examples(
    tokenizer: Any,
    specs: Sequence[str],
    target: str,
    max_length: int,
    end_ids: set[int],
    max_samples: int = -1,
) -> tuple[list[SFTExample], int]:
    """Tokenised examples and how many were dropped for exceeding ``max_length``."""
    examples, too_long = [], 0
    for spec in specs:
        if spec == "rlla:test":
            raise DataError("rlla:test is the held-out RLLA test split; refusing to train on it")
        for messages, source in _conversations(spec, target):
            refuse_test_split(messages, source)
            try:
                ids, mask = tokenize_conversation(tokenizer, messages, end_ids)
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{source}: {e}") from e
            if len(ids) > max_length:
                too_long += 1
                continue
            examples.append(SFTExample(ids, mask, source))
    if max_samples > 0:
        examples = examples[:max_samples]
    if not examples:
        raise DataError(f"no SFT examples fit data.max_length={max_length} in {list(specs)}")
    if too_long:
        log.warning("dropped %d examples longer than %d tokens", too_long, max_length)
    return examples, too_long
