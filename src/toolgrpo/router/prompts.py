"""Route-conditioned prompts: the same task, with its system message rewritten for the route.

Two prompt shapes are handled: RLLA text prompts (tools listed in an ``**Available Tools**`` block
of the system text) and environment prompts (tools passed as ``tools=`` specs beside a system
prompt that explains how to call them). Pure functions: messages and specs in, messages and
specs out; generation itself is never changed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from toolgrpo.envs.base import EnvStart
from toolgrpo.router.families import FamilyMap, ToolsBlock, find_tools_block, spec_tools
from toolgrpo.router.routes import ANSWER, CALCULATE, ROUTES, SEARCH, check_name

ANSWER_NOTE_RLLA = (
    "**Route: answer directly**\nNo tools are available for this request. Think it through "
    "inside <think> </think>, then answer the user directly inside <response> </response>, "
    "without calling any tool."
)
ANSWER_NOTE = (
    "No tools are available for this request: think it through and answer directly, without "
    "calling any tool."
)
_FAMILY_WORDS = {
    SEARCH: ("search", "looking information up", "search and retrieval tools", "calculation"),
    CALCULATE: ("calculate", "exact computation", "calculation tools", "search and lookup"),
}
# A sentence (or a whole line) of a non-RLLA system prompt that is about calling tools.
_TOOL_TALK = re.compile(r"(?i)\btools?\b|tool_call|function call")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def route_note(route: str, favoured: Sequence[str], avoided: Sequence[str], rlla: bool) -> str:
    """The instruction appended to the system message for ``route``."""
    if route == ANSWER:
        return ANSWER_NOTE_RLLA if rlla else ANSWER_NOTE
    name, need, prefer, avoid = _FAMILY_WORDS[route]
    text = f"This request calls for {need}. Prefer the {prefer}"
    text += f" ({', '.join(favoured)})" if favoured else ""
    text += f"; avoid {avoid} helpers"
    text += f" ({', '.join(avoided)})" if avoided else ""
    text += " unless nothing else can answer it."
    return f"**Route: {name}**\n{text}" if rlla else text


def _drop_tool_talk(system: str) -> str:
    """The system text without its sentences about calling tools (lines with a ``<tool_call>``
    example, "To call a tool ...", "... use the tools."), for the ANSWER route."""
    kept_lines = []
    for line in system.split("\n"):
        if "tool_call>" in line:
            continue
        sentences = [s for s in _SENTENCE_END.split(line) if not _TOOL_TALK.search(s)]
        if sentences or not line.strip():
            kept_lines.append(" ".join(sentences))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept_lines)).strip()


_NUMBERED = re.compile(r"^(\d+)\.\s+(.*)$")
_CALL_TALK = re.compile(r"(?i)\btools?\b|tool_call|function call|\bparameters?\b")
_CALL_EXAMPLE = re.compile(r"(?ms)^<tool_call>\s*$.*?^</tool_call>\s*$\n?")


def _answer_rlla_text(system: str) -> str:
    """RLLA's instructions without their tool parts, for the ANSWER route: the ``<tool_call>``
    lines of the output format, the "Decide on Tool Usage" step and the notes' sentences about
    tool calls (lists renumbered), so the prompt no longer asks for what the route forbids."""
    system = _CALL_EXAMPLE.sub("", system)
    out: list[str] = []
    number = 0
    for line in system.split("\n"):
        m = _NUMBERED.match(line)
        if not m:
            number = 0  # a numbered list ends at the first other line
            out.append(line)
            continue
        kept = [x for x in _SENTENCE_END.split(m.group(2)) if not _CALL_TALK.search(x)]
        if kept:
            number += 1
            out.append(f"{number}. {' '.join(kept)}")
    return "\n".join(out)


def _renumber(entries: Sequence[str]) -> list[str]:
    return [re.sub(r"^\d+\.", f"{i}.", e, count=1) for i, e in enumerate(entries, 1)]


def _rewrite_block(system: str, block: ToolsBlock, keep: Sequence[bool] | None) -> str:
    """``system`` without its tools section (``keep`` None) or with only the kept entries."""
    head, tail = system[: block.start], system[block.end :]
    if keep is None or not any(keep):
        return f"{head.rstrip()}\n\n{tail.lstrip(chr(10))}".strip()
    entries = _renumber([e for e, k in zip(block.entries, keep, strict=True) if k])
    section = block.intro + "\n".join(entries)
    return head + section + tail


def condition_start(
    start: EnvStart, route: str, families: FamilyMap, family_tools_only: bool = False
) -> EnvStart:
    """The opening messages and ``tools=`` specs for ``route``.

    ANSWER drops every tool (the RLLA block, the specs, and for environment prompts the sentences
    on how to call them) and asks for a direct answer. SEARCH / CALCULATE keep the tools, name
    the favoured family's and discourage the other family's; ``family_tools_only`` drops the
    other family's tools altogether (tools of neither family stay).
    """
    route = check_name(route, ROUTES, "route")
    msgs = [dict(m) for m in start.messages]
    specs = [dict(s) for s in start.tools]
    at = next((i for i, m in enumerate(msgs) if m.get("role") == "system"), None)
    system = str(msgs[at].get("content") or "") if at is not None else ""
    block = find_tools_block(system)
    offered = list(block.tools if block else ()) + spec_tools(specs)
    if route == ANSWER:
        note = route_note(route, (), (), rlla=block is not None)
    else:
        other = CALCULATE if route == SEARCH else SEARCH
        if family_tools_only:
            offered = [t for t in offered if families.family(t.name) != other]
        favoured = _names(offered, families, route)
        avoided = _names(offered, families, other)
        note = route_note(route, favoured, avoided, rlla=block is not None)
    if route == ANSWER or (family_tools_only and not offered):  # no tool left to offer
        if block:
            system = _answer_rlla_text(_rewrite_block(system, block, None))
        else:
            system = _drop_tool_talk(system)
        specs = []
    elif family_tools_only:
        if block:
            keep = [families.family(t.name) != other for t in block.tools]
            system = _rewrite_block(system, block, keep)
        specs = [s for s in specs if _spec_family(s, families) != other]
    system = f"{system.rstrip()}\n\n{note}" if system.strip() else note
    if at is None:
        msgs.insert(0, {"role": "system", "content": system})
    else:
        msgs[at]["content"] = system
    return EnvStart(msgs, specs)


def condition_messages(
    messages: Sequence[Mapping[str, Any]],
    route: str,
    families: FamilyMap,
    family_tools_only: bool = False,
) -> list[dict[str, Any]]:
    """``condition_start`` for a text-only prompt (single-turn RLLA rollouts)."""
    start = EnvStart([dict(m) for m in messages], [])
    return condition_start(start, route, families, family_tools_only).messages


def _names(tools: Sequence[Any], families: FamilyMap, family: str) -> list[str]:
    return list(dict.fromkeys(t.name for t in tools if families.family(t.name) == family))


def _spec_family(spec: Mapping[str, Any], families: FamilyMap) -> str | None:
    found = spec_tools([spec])
    return families.family(found[0].name) if found else None
