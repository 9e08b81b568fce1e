"""SFT examples: chat-templated token ids with a loss mask on assistant tokens only.

Each assistant turn's span is found by rendering the conversation up to it (with the generation
prompt) and through it; the span is the difference, up to and including its end-of-turn token.
The embedded RLLA test split is refused wherever it appears. Message rows may carry ``tools``
(OpenAI specs, as the agent episodes of ``sft.agent`` do): they are rendered like an episode's
opening prompt (``rollout.render.with_tools``), so tool specs reach the model exactly as in RL.
Messages go through ``rollout.render.chat_view``: a template that renders structured
``tool_calls`` writes each call once (from the structure), one that ignores them (SmolLM2's
ChatML) gets the turn as written, so its ids are those of the plain messages.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolgrpo.data.loader import (
    DataError,
    embedded_path,
    prompt_key,
    read_rows,
    test_prompt_keys,
)
from toolgrpo.data.loader import load_tasks as load_rl_tasks
from toolgrpo.data.task import ROLES
from toolgrpo.rollout.render import chat_view, with_tools
from toolgrpo.rollout.tool_parsers import get_format
from toolgrpo.sft.agent import env_test_prompts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTExample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on assistant tokens (content + end-of-turn)
    source: str


def _ids(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    gen: bool,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    kwargs: dict[str, Any] = {"add_generation_prompt": gen, "tokenize": True}
    if tools:
        kwargs["tools"] = tools
    ids = tokenizer.apply_chat_template(list(messages), **kwargs)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def tokenize_conversation(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    end_ids: set[int],
    tools: Sequence[dict[str, Any]] | None = None,
    tool_format: str = "hermes",
) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and a mask that is 1 on assistant tokens; with
    ``tools``, the specs are rendered as an episode's opening prompt renders them. Assistant
    turns write their calls in ``tool_format`` (``rollout.tool_parsers``)."""
    spec: list[dict[str, Any]] | None = None
    messages = chat_view(tokenizer, messages, tool_format)
    if tools:
        messages, spec = with_tools(tokenizer, messages, tools, tool_format)
    full = _ids(tokenizer, messages, False, spec)
    mask = [0] * len(full)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(_ids(tokenizer, messages[:i], True, spec)) if i else 0
        through = _ids(tokenizer, messages[: i + 1], False, spec)
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


Conversation = tuple[list[dict[str, Any]], str, list[dict[str, Any]] | None]
# Embedded SFT sets besides rlla:sft (scripts/make_agent_sft.py).
EMBEDDED = {"agent:sft": ("agent_sft.jsonl", "envs")}


def _conversations(spec: str, target: str) -> list[Conversation]:
    """(messages, source, tools) triples from RLLA-schema rows or message JSONL rows."""
    convs: list[Conversation] = []
    path = embedded_path(*EMBEDDED[spec]) if spec in EMBEDDED else spec
    rows = None if spec.startswith("rlla:") else list(read_rows(path))
    if rows is not None and rows and isinstance(rows[0], dict) and "messages" in rows[0]:
        for i, r in enumerate(rows):
            if not isinstance(r, dict) or not isinstance(r.get("messages"), list):
                raise DataError(f"{spec} row {i}: 'messages' must be a list")
            for m in r["messages"]:
                if not isinstance(m, dict) or m.get("role") not in ROLES:
                    raise DataError(f"{spec} row {i}: each message needs a role in {ROLES}")
                if not isinstance(m.get("content"), str):
                    raise DataError(f"{spec} row {i}: each message needs a string 'content'")
            tools = r.get("tools") or None
            if tools is not None and not (
                isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
            ):
                raise DataError(f"{spec} row {i}: 'tools' must be a list of function specs")
            convs.append(([dict(m) for m in r["messages"]], f"{spec}#{i}", tools))
        return convs
    for t in load_rl_tasks(spec, bad_rows="error").tasks:
        answer = t.ground_truth
        if target == "output_sft":
            answer = t.meta.get("output_sft")
            if not answer:
                raise DataError(f"{t.task_id}: no SFT output; use data.target=ground_truth")
        elif target != "ground_truth":
            raise DataError(f"data.target must be ground_truth or output_sft, got {target!r}")
        convs.append(([*t.messages, {"role": "assistant", "content": answer}], t.task_id, None))
    return convs


def refuse_test_split(messages: Sequence[dict[str, Any]], source: str) -> None:
    """The RLLA and environment test splits are held out: training on them would make every
    eval number a lie."""
    prompt = [m["content"] for m in messages if m["role"] in ("system", "user")]
    if prompt_key(prompt) in test_prompt_keys():
        raise DataError(
            f"{source}: this row is in the held-out RLLA test split; refusing to train on it"
        )
    users = prompt_key(m["content"] for m in messages if m["role"] == "user")
    if users in env_test_prompts():
        raise DataError(
            f"{source}: this row asks a held-out calculator/search/direct test question; "
            "refusing to train on it"
        )


def build_examples(
    tokenizer: Any,
    specs: Sequence[str],
    target: str,
    max_length: int,
    end_ids: set[int],
    max_samples: int = -1,
    tool_format: str = "hermes",
) -> tuple[list[SFTExample], int]:
    """Tokenised examples and how many were dropped for exceeding ``max_length``; the rows'
    assistant turns write tool calls in ``tool_format`` (``toolgrpo sft`` uses hermes)."""
    try:
        get_format(tool_format)
    except ValueError as e:
        raise DataError(str(e)) from None
    examples, too_long = [], 0
    for spec in specs:
        if spec == "rlla:test":
            raise DataError("rlla:test is the held-out RLLA test split; refusing to train on it")
        if spec in EMBEDDED and tool_format != "hermes":
            raise DataError(f"{spec} writes its tool calls as hermes blocks, not {tool_format}")
        for messages, source, tools in _conversations(spec, target):
            refuse_test_split(messages, source)
            try:
                ids, mask = tokenize_conversation(tokenizer, messages, end_ids, tools, tool_format)
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{source}: {e}") from e
            if len(ids) > max_length:
                too_long += 1
                continue
            examples.append(SFTExample(ids, mask, source))
            if 0 < max_samples <= len(examples):
                break  # the first max_samples are all that is kept: tokenise no more
        if 0 < max_samples <= len(examples):
            break
    if not examples:
        raise DataError(f"no SFT examples fit data.max_length={max_length} in {list(specs)}")
    if too_long:
        log.warning("dropped %d examples longer than %d tokens", too_long, max_length)
    return examples, too_long
