"""Chat-template rendering for episodes: the opening prompt with tools, and each turn's delta.

A template that knows ``tools=`` (Qwen2.5, Llama 3.1, ...) renders the tool specs itself; for one
that does not (SmolLM2's plain ChatML) the specs go into the system message as a ``<tools>`` block
with the calling instructions of the episode's tool-call format (``rollout.tool_parsers``;
``hermes`` by default: JSON specs in, ``<tool_call>`` JSON out).

Assistant turns are rendered as the model wrote them: their structured ``tool_calls`` are the
record, not the text, so re-rendering never changes what the policy generated (``as_generated``);
a template that rewrites reasoning (Qwen3 drops earlier turns' ``<think>`` blocks) is handed the
turn as sampled too (``stream_messages``), so the history stays the sampled tokens, as in verl.
Tool results take the role the family's template gives them (``result_role``): ``ipython`` for
Llama 3.1, ``tool`` elsewhere, or a user turn for a template with no such role (Gemma's).

Messages and tool specs are data: ``encode_prompt`` and ``encode_delta`` keep a special token's
text inside them plain (``rollout.escape``), so only the template writes control tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from toolgrpo.rollout.escape import Escaper
from toolgrpo.rollout.tool_parsers import call_id, get_format

_TOOLS_LISTING = (
    "You can use the functions listed below. Their JSON signatures are inside <tools></tools>:\n"
    "<tools>\n{specs}\n</tools>\n"
)


def template_supports_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in template if isinstance(template, str) else False


def template_renders_tool_calls(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tool_calls" in template if isinstance(template, str) else False


def tools_block(tools: Sequence[dict[str, Any]], tool_format: str = "hermes") -> str:
    specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return _TOOLS_LISTING.format(specs=specs) + get_format(tool_format).how_to_call


def with_tools(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    tool_format: str = "hermes",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages and the ``tools=`` argument to render them with."""
    msgs = [dict(m) for m in messages]
    if not tools:
        return msgs, None
    if template_supports_tools(tokenizer):
        return msgs, list(tools)
    block = tools_block(tools, tool_format)
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
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tool_format: str = "hermes",
) -> tuple[str, list[int]]:
    """An episode's opening prompt (with the generation prompt) as ``(text, ids)``; a special
    token's text inside the messages or tool specs stays plain text."""
    esc = Escaper.of(tokenizer)
    msgs = esc.hide(stream_messages(tokenizer, messages, tool_format))
    return esc.encode(render_text(tokenizer, msgs, esc.hide(tools), True))


def encode_delta(
    tokenizer: Any,
    stream_text: str,
    history: Sequence[dict[str, Any]],
    new_messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool = True,
    tool_format: str = "hermes",
) -> tuple[str, list[int], bool]:
    """``delta_text`` of ``new_messages`` (tool results, environment user turns) as
    ``(text, ids, exact)``; a special token's text inside them stays plain text. Without
    ``add_generation_prompt`` (the episode's last delta) no assistant turn is opened after them."""
    esc = Escaper.of(tokenizer)
    hidden = esc.hide(stream_messages(tokenizer, new_messages, tool_format))
    delta, exact = delta_text(
        tokenizer,
        stream_text,
        stream_messages(tokenizer, history, tool_format),
        hidden,
        tools,
        esc.hide,
        add_generation_prompt,
    )
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
    add_generation_prompt: bool = True,
) -> tuple[str, bool]:
    """The text to append after the tokens so far (decoded as ``stream_text``) so the episode
    continues with ``new_messages`` and the next generation prompt (none when
    ``add_generation_prompt`` is false: the episode ends with them).

    Returns ``(delta, exact)``: ``exact`` is True when the full re-rendered conversation extends the
    token stream exactly; otherwise (a template that rewrites earlier turns, a sampled text that
    does not re-render the same) the delta is the template's own rendering of the new turns and
    the caller records a mismatch. ``hide`` (``Escaper.hide``) is applied to the history the last
    fallback renders again, so no earlier data can reach the delta unescaped.
    """
    gen = add_generation_prompt
    full = render_text(tokenizer, [*history, *new_messages], tools, gen)
    if full.startswith(stream_text):
        return full[len(stream_text) :], True
    base = render_text(tokenizer, history, tools, False)
    if full.startswith(base):
        return full[len(base) :], False
    # The template rewrites history when new turns arrive: render the new turns on their own.
    first = list(history[:1])
    if hide is not None:
        first, tools = hide(first), hide(tools)
    alone = render_text(tokenizer, [*first, *new_messages], tools, gen)
    head = render_text(tokenizer, first, tools, False)
    return alone[len(head) :] if alone.startswith(head) else alone, False


def as_generated(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the token stream holds them: assistant turns as the text the model wrote,
    without the structured ``tool_calls`` parsed from it (a template that renders those would
    write the calls twice, or differently from the sampled tokens)."""
    return [
        {k: v for k, v in m.items() if k != "tool_calls"} if m.get("role") == "assistant" else m
        for m in messages
    ]


def stream_messages(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tool_format: str = "hermes"
) -> list[dict[str, Any]]:
    """Messages as the token stream renders them: assistant turns as sampled (``as_generated``;
    with an empty ``reasoning_content`` for a template that reads it, so Qwen3's keeps each
    turn's ``<think>`` block where the model wrote it instead of moving or dropping it) and
    tool results in the family's turn (``with_result_role``)."""
    msgs = as_generated(messages)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and "reasoning_content" in template:
        msgs = [{**m, "reasoning_content": ""} if m.get("role") == "assistant" else m for m in msgs]
    return with_result_role(tokenizer, msgs, tool_format)


_PROBE = "toolgrpo-result-probe"
_RESULT_ROLES: dict[tuple[str, str], str | None] = {}


def result_role(tokenizer: Any, tool_format: str = "hermes") -> str | None:
    """The role tool results are rendered with: the format's (``ipython`` for ``llama3_json``)
    or ``tool``, the first the template renders after an assistant turn; ``None`` when it
    renders neither (Gemma's template alternates user and model turns only)."""
    template = getattr(tokenizer, "chat_template", None)
    preferred = get_format(tool_format).result_role
    key = (template if isinstance(template, str) else repr(template), preferred)
    if key not in _RESULT_ROLES:
        roles = dict.fromkeys((preferred, "tool"))
        _RESULT_ROLES[key] = next((r for r in roles if _renders_role(tokenizer, r)), None)
    return _RESULT_ROLES[key]


def _renders_role(tokenizer: Any, role: str) -> bool:
    probe = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": role, "name": "f", "content": _PROBE, "tool_call_id": call_id(0)},
    ]
    try:
        return _PROBE in render_text(tokenizer, probe, None, True)
    except Exception:  # the template's raise_exception (a role it refuses), or its own bug
        return False


def with_result_role(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tool_format: str = "hermes"
) -> list[dict[str, Any]]:
    """Tool messages in the role ``result_role`` names; with none, each run of results becomes
    one user turn of ``<tool_response>`` blocks (the hermes convention Qwen's templates write)."""
    if not any(m.get("role") == "tool" for m in messages):
        return list(messages)
    role = result_role(tokenizer, tool_format)
    if role == "tool":
        return list(messages)
    out: list[dict[str, Any]] = []
    folding = False
    for m in messages:
        if m.get("role") != "tool":
            out.append(m)
            folding = False
        elif role is not None:
            out.append({**m, "role": role})
        else:
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if folding:
                block = f"{out.pop()['content']}\n{block}"
            out.append({"role": "user", "content": block})
            folding = True
    return out


def chat_view(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tool_format: str = "hermes"
) -> list[dict[str, Any]]:
    """An episode's messages for rendering elsewhere (SFT data, another trainer). A template
    that renders ``tool_calls`` gets each calling turn's text outside its calls plus the calls,
    their arguments as objects (Hugging Face's convention); one that ignores them (SmolLM2's
    ChatML) gets the turn as the model wrote it, calls included, so nothing is lost. Tool
    results take the family's role (``with_result_role``)."""
    if not template_renders_tool_calls(tokenizer):
        return with_result_role(tokenizer, as_generated(messages), tool_format)
    parse = get_format(tool_format).parse
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [
                {**c, "function": _arguments_as_object(c["function"])} for c in m["tool_calls"]
            ]
            m = {**m, "content": parse(str(m.get("content") or "")).content, "tool_calls": calls}
        out.append(dict(m))
    return with_result_role(tokenizer, out, tool_format)


def _arguments_as_object(fn: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's JSON-string arguments as the object templates expect (kept as the string when
    they are not a JSON object: a call the model wrote malformed)."""
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            value = json.loads(args)
        except ValueError:
            return dict(fn)
        if isinstance(value, dict):
            return {**fn, "arguments": value}
    return dict(fn)
