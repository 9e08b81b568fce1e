"""Tool families (SEARCH, CALCULATE, OTHER): a keyword heuristic, a sidecar JSON that overrides it,
and the tools a task offers, read from RLLA system text or from ``tools=`` specs.

Families decide what a route emphasises and what a tool call costs, so they need no labels: the
heuristic covers the shipped environments and most RLLA tools; the sidecar fixes the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgrpo.router.routes import CALCULATE, FAMILIES, OTHER, SEARCH, check_name

# Word stems, matched at the start of words of the name (split on case and punctuation) and of
# the description; short words must match whole. A hit in the name or in the description's first
# word (its verb: "Calculates", "Retrieves") counts double: that is where a tool says what it does.
_CALC_STEMS = (
    "calc", "comput", "solv", "math", "arithmet", "equation", "multiply", "multipli", "divide",
    "average", "median", "variance", "deviation", "factorial", "fibonacci", "probabil",
    "distance", "density", "matrix", "integra", "derivativ", "convert", "conversion", "interest",
    "percent", "subtract", "sqrt", "expression", "formula", "evaluat", "permutation",
    "combination", "estimat",
)  # fmt: skip
_CALC_WORDS = ("sum", "add", "mean", "prime", "ratio", "gcd", "lcm", "root", "count", "solve")
_SEARCH_STEMS = (
    "search", "retriev", "fetch", "lookup", "query", "news", "wiki", "document", "passage",
    "information", "detail", "browse", "article", "locat", "weather", "price", "quote",
)  # fmt: skip
_SEARCH_WORDS = ("get", "find", "finds", "list", "info", "open", "read", "look", "web", "show")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _hits(words: Iterable[str], stems: tuple[str, ...], whole: tuple[str, ...]) -> int:
    return sum(1 for w in words if w in whole or any(w.startswith(s) for s in stems))


def _score(name: list[str], desc: list[str], stems: tuple[str, ...], whole: tuple[str, ...]) -> int:
    return 2 * _hits(name + desc[:1], stems, whole) + _hits(desc[1:], stems, whole)


def heuristic_family(name: str, description: str = "") -> str:
    """SEARCH, CALCULATE or OTHER from keyword hits; a tie (none included) is OTHER."""
    name_words, desc_words = _words(name), _words(description)[:24]
    calc = _score(name_words, desc_words, _CALC_STEMS, _CALC_WORDS)
    search = _score(name_words, desc_words, _SEARCH_STEMS, _SEARCH_WORDS)
    if calc > search:
        return CALCULATE
    if search > calc:
        return SEARCH
    return OTHER


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str = ""


# ---- RLLA text prompts -----------------------------------------------------------------------
TOOLS_HEADER = "**Available Tools**"
_ENTRY = re.compile(r"(?m)^(?=\d+\. Name: )")
_ENTRY_FIELDS = re.compile(
    r"\d+\. Name: (?P<name>.*)\nDescription: (?P<desc>(?:.|\n)*?)\nParameters:"
)


@dataclass(frozen=True)
class ToolsBlock:
    """The ``**Available Tools**`` section of an RLLA system prompt, split into its entries."""

    start: int  # offset of the header in the system text
    end: int  # offset just after the section (the blank line before the next header)
    intro: str  # header and the "you can use the following tools" line
    entries: tuple[str, ...]  # "N. Name: ...\nDescription: ...\nParameters: ..." each
    tools: tuple[ToolInfo, ...]


def find_tools_block(system: str) -> ToolsBlock | None:
    """The tools section of an RLLA system text, or None when the text has none."""
    start = system.find(TOOLS_HEADER)
    if start < 0:
        return None
    nxt = system.find("\n\n**", start + len(TOOLS_HEADER))
    end = len(system) if nxt < 0 else nxt
    parts = _ENTRY.split(system[start:end])
    intro, entries = parts[0], tuple(p.rstrip("\n") for p in parts[1:])
    tools = []
    for e in entries:
        m = _ENTRY_FIELDS.match(e)
        name = m.group("name") if m else e.split("\n", 1)[0].split("Name:", 1)[-1]
        tools.append(ToolInfo(name.strip(), (m.group("desc") if m else "").strip()))
    return ToolsBlock(start, end, intro, entries, tuple(tools))


def spec_tools(specs: Sequence[Mapping[str, Any]]) -> list[ToolInfo]:
    """Tools of OpenAI function specs (``{"type": "function", "function": {...}}`` or bare)."""
    out = []
    for s in specs:
        fn = s.get("function", s) if isinstance(s, Mapping) else {}
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            out.append(ToolInfo(fn["name"], str(fn.get("description") or "")))
    return out


def message_tools(messages: Sequence[Mapping[str, Any]]) -> list[ToolInfo]:
    """Tools listed in the RLLA tools block of the system message (none if there is none)."""
    for m in messages:
        if m.get("role") == "system":
            block = find_tools_block(str(m.get("content") or ""))
            return list(block.tools) if block else []
    return []


# ---- the map used at run time --------------------------------------------------------------
class FamilyFileError(ValueError):
    """A families sidecar that cannot be used (unreadable, unknown family, unknown tool)."""


def read_family_file(path: str | Path) -> dict[str, str]:
    """``{tool: family}``, from a flat JSON object or from the ``tools`` key of a labels file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FamilyFileError(f"cannot read tool families from {p}: {e}") from None
    if isinstance(data, dict) and isinstance(data.get("tools"), dict):
        data = data["tools"]
    if not isinstance(data, dict):
        raise FamilyFileError(f"{p}: want a JSON object mapping tool names to families")
    out = {}
    for name, fam in data.items():
        try:
            out[str(name)] = check_name(str(fam), FAMILIES, f"family for tool {name!r} in {p}")
        except ValueError as e:
            raise FamilyFileError(str(e)) from None
    return out


@dataclass
class FamilyMap:
    """Tool name → family: sidecar overrides, then the heuristic over the tools seen (name and
    description), then the heuristic over the name alone (a tool the model made up)."""

    overrides: dict[str, str] = field(default_factory=dict)
    known: dict[str, str] = field(default_factory=dict)

    def add(self, tools: Iterable[ToolInfo]) -> None:
        for t in tools:
            if t.name not in self.known:
                self.known[t.name] = heuristic_family(t.name, t.description)

    def family(self, name: str) -> str:
        if name in self.overrides:
            return self.overrides[name]
        if name in self.known:
            return self.known[name]
        return heuristic_family(name)

    def unknown_overrides(self) -> list[str]:
        """Sidecar tools that no task offers (a typo, or a sidecar for other data)."""
        return sorted(set(self.overrides) - set(self.known))
