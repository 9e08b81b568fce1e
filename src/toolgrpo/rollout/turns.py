"""What the episode loop does between two assistant turns: which calls of a turn run, the turn
and the environment's results for them as messages (OpenAI-style ``tool_calls`` and
``tool_call_id``), and the rendered delta appended as mask-0 tokens (data in it escaped:
``rollout.escape``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from toolgrpo.envs.base import Env
from toolgrpo.rollout.env_calls import bounded
from toolgrpo.rollout.episode import Episode
from toolgrpo.rollout.escape import PlainTokenizer
from toolgrpo.rollout.limits import EpisodeLimits
from toolgrpo.rollout.render import encode_delta
from toolgrpo.rollout.tool_parsers import get_format, openai_tool_calls
from toolgrpo.tools.executor import truncate_text
from toolgrpo.tools.types import ToolCall, ToolResult


def turn_calls(text: str, cut: bool, tool_format: str = "hermes") -> list[ToolCall]:
    """The calls a turn makes. A turn cut at its token cap (``cut``) runs the calls it completed
    before the cut; an unfinished last one is where the cap fell, not a malformed call."""
    return get_format(tool_format).turn_calls(text, cut)


def assistant_message(
    text: str, calls: Sequence[ToolCall], messages: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """A turn as its message: the text as the model wrote it (what the tokens hold) and, when it
    calls tools, those calls structured, with ids that go on counting through the episode."""
    if not calls:
        return {"role": "assistant", "content": text}
    first = sum(len(m.get("tool_calls") or ()) for m in messages)
    return {"role": "assistant", "content": text, "tool_calls": openai_tool_calls(calls, first)}


def result_call_ids(
    structured: Sequence[dict[str, Any]], calls: Sequence[ToolCall], results: Sequence[ToolResult]
) -> list[str]:
    """The structured call id each result answers: by the call id the environment echoed, else
    by position (results beyond one per call answer none: "")."""
    by_call = {c.id: s["id"] for c, s in zip(calls, structured, strict=True) if c.id}
    ids = [s["id"] for s in structured]
    return [
        by_call.get(r.call_id) or (ids[i] if i < len(ids) else "") for i, r in enumerate(results)
    ]


async def run_calls(
    env: Env, calls: list[ToolCall], refuse: Callable[[ToolCall], str | None] | None
) -> list[ToolResult]:
    """The environment's results for the calls the episode's condition lets through, and a
    ``not_offered`` error for each it refuses, in call order (refused calls still count as
    calls: the model wrote them). A sync ``step`` runs in a thread (``env_calls.bounded``)."""
    refusals = [refuse(c) if refuse is not None else None for c in calls]
    if not any(r is not None for r in refusals):
        return await bounded(env.step, [calls], None, "step")  # exactly as the env gives them
    allowed = [c for c, r in zip(calls, refusals, strict=True) if r is None]
    ran = list(await bounded(env.step, [allowed], None, "step")) if allowed else []
    out: list[ToolResult] = []
    for c, r in zip(calls, refusals, strict=True):
        if r is not None:
            out.append(ToolResult(r, True, "not_offered", c.name, c.id))
        elif ran:
            out.append(ran.pop(0))
    return out + ran  # any results beyond one per call, as the environment gave them


def append_delta(
    ep: Episode,
    tokenizer: Any,
    stream_text: str,
    messages: list[dict[str, Any]],
    new: list[dict[str, Any]],
    tools: Any,
    limits: EpisodeLimits,
    final: bool = False,
    spent: int = 0,
) -> str | None:
    """Append the rendered text between turns (``new`` messages and the next generation prompt)
    as mask-0 tokens; ``None`` (nothing appended) when it would fill the response budget (of
    which ``spent`` tokens went before this episode's response: a fission fork's parent's).
    ``final``: the episode ends with ``new``, so no generation prompt follows them (the row,
    the reward's transcript text and the rollout dump end where the conversation does)."""
    delta, delta_ids, exact = encode_delta(
        tokenizer, stream_text, messages, new, tools, not final, limits.tool_format
    )
    if spent + len(ep.response_ids) + len(delta_ids) >= limits.max_response_length:
        return None
    ep.prefix_mismatches += int(not exact)
    ep.append(delta_ids, None)
    return delta


def tool_message(
    tokenizer: Any, r: ToolResult, limits: EpisodeLimits, call_id: str = ""
) -> dict[str, Any]:
    """A result as the tool message the template renders, cut to ``max_tool_response_length``
    tokens as the episode will hold them (special tokens' texts count as plain text), naming
    the structured call it answers (``call_id``) when there is one."""
    text = truncate_text(
        PlainTokenizer(tokenizer),
        r.text,
        limits.max_tool_response_length,
        limits.tool_response_truncate_side,
    )
    msg = {"role": "tool", "name": r.name, "content": text}
    return {**msg, "tool_call_id": call_id} if call_id else msg


def count_tools(ep: Episode, results: Sequence[ToolResult]) -> None:
    ep.tool_calls += len(results)
    for r in results:
        if r.is_error:
            ep.tool_errors += 1
            key = r.error_type or "unknown"
            ep.tool_error_types[key] = ep.tool_error_types.get(key, 0) + 1
