"""Chat-template rendering for episodes: the opening prompt with tools, and each turn's delta.

A template that knows ``tools=`` (Qwen2.5, Llama 3.1, ...) renders the tool specs itself; for one
that does not (SmolLM2's plain ChatML) the specs go into the system message as a hermes-style
block, so every model sees the same contract: JSON specs in, ``<tool_call>`` JSON out.

Messages and tool specs are data: ``encode_prompt`` and ``encode_delta`` keep a special token's
text inside them plain (``rollout.escape``), so only the template writes control tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from toolgrpo.rollout.escape import Escaper

_TOOLS_HEADER = (
    "You can use the functions listed below. Their JSON signatures are inside <tools></tools>:\n"
    "<tools>\n{specs}\n</tools>\n"
    "To call a function, write one JSON object per call inside <tool_call></tool_call> tags:\n"
    '<tool_call>\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n'
    "</tool_call>\n"
    "Each result comes back in a message from the tool; then continue, or give your answer."
)


def template_supports_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in template if isinstance(template, str) else False


def tools_block(tools: Sequence[dict[str, Any]]) -> str:
    specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return _TOOLS_HEADER.format(specs=specs)


def with_tools(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages and the ``tools=`` argument to render them with."""
    msgs = [dict(m) for m in messages]
    if not tools:
        return msgs, None
    if template_supports_tools(tokenizer):
        return msgs, list(tools)
    block = tools_block(tools)
    if msgs and msgs[0].get("role") == "system":
        msgs[0]["content"] = f"{msgs[0]['content']}\n\n{block}"
    else:
        msgs.insert(0, {"role": "system", "content": block})
    return msgs, None


def render_text(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str:
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(list(messages), **kwargs)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Text that already carries the template's special tokens → ids (no BOS added). Every
    special token's text in it becomes the special token: for trusted text only."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[str, list[int]]:
    """An episode's opening prompt (with the generation prompt) as ``(text, ids)``; a special
    token's text inside the messages or tool specs stays plain text."""
    esc = Escaper.of(tokenizer)
    return esc.encode(render_text(tokenizer, esc.hide(list(messages)), esc.hide(tools), True))


def encode_delta(
    tokenizer: Any,
    stream_text: str,
    history: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> tuple[str, list[int], bool]:
    """``delta_text`` of ``new_messages`` (tool results, environment user turns) as
    ``(text, ids, exact)``; a special token's text inside them stays plain text."""
    esc = Escaper.of(tokenizer)
    hidden = esc.hide(list(new_messages))
    delta, exact = delta_text(tokenizer, stream_text, history, hidden, tools, esc.hide)
    text, ids = esc.encode(delta)
    return text, ids, exact


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(
        list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


def delta_text(
    tokenizer: Any,
    stream_text: str,
    history: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    hide: Callable[[Any], Any] | None = None,
) -> tuple[str, bool]:
    """The text to append after the tokens so far (decoded as ``stream_text``) so the episode
    continues with ``new_messages`` and the next generation prompt.

    Returns ``(delta, exact)``: ``exact`` is True when the full re-rendered conversation extends the
    token stream exactly; otherwise (a template that rewrites earlier turns, a sampled text that
    does not re-render the same) the delta is the template's own rendering of the new turns and
    the caller records a mismatch. ``hide`` (``Escaper.hide``) is applied to the history the last
    fallback renders again, so no earlier data can reach the delta unescaped.
    """
    full = render_text(tokenizer, [*history, *new_messages], tools, True)
    if full.startswith(stream_text):
        return full[len(stream_text) :], True
    base = render_text(tokenizer, history, tools, False)
    if full.startswith(base):
        return full[len(base) :], False
    # The template rewrites history when new turns arrive: render the new turns on their own.
    first = list(history[:1])
    if hide is not None:
        first, tools = hide(first), hide(tools)
    alone = render_text(tokenizer, [*first, *new_messages], tools, True)
    head = render_text(tokenizer, first, tools, False)
    return alone[len(head) :] if alone.startswith(head) else alone, False
