"""Weak labels from any OpenAI-compatible chat endpoint: a family per tool, and per example the
route its ground truth implies (``router_target_action`` ∈ ANSWER, SEARCH, CALCULATE, MIXED).

RLLA ground truths say it themselves: a ``<response>`` only is ANSWER, calls are labelled by the
families of the tools called. Other tasks (calculator, search: the ground truth is just the
answer) ask the endpoint. Replies are parsed leniently; a garbled reply falls back to the
heuristic (tools) or no label (examples); an endpoint that is down, or gives nothing usable at
all, raises ``LabelerError`` with the reason.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from toolgrpo.data.task import Task
from toolgrpo.rewards.rlla import ground_truth_type, parse_tool_calls
from toolgrpo.router.families import FamilyMap, ToolInfo, message_tools, spec_tools
from toolgrpo.router.routes import ANSWER, CALCULATE, FAMILIES, LABELS, MIXED, SEARCH

log = logging.getLogger(__name__)

FAMILY_PROMPT = (
    "You sort the tools of an assistant into families. SEARCH: looks information up (search, "
    "retrieval, lookup, fetching records, news, prices). CALCULATE: computes (arithmetic, math, "
    "statistics, unit conversion, solving equations). OTHER: anything else (actions, "
    "generation, validation, messaging). Reply with one JSON object mapping every tool name "
    "you are given to SEARCH, CALCULATE or OTHER, and nothing else."
)
EXAMPLE_PROMPT = (
    "You decide what answering a request needs. Reply with one word: ANSWER (no tool: it can be "
    "answered directly), SEARCH (facts must be looked up), CALCULATE (exact computation is "
    "needed) or MIXED (tools of several kinds)."
)


class LabelerError(RuntimeError):
    """The endpoint cannot be used (down, HTTP errors, or not one usable reply)."""


@dataclass(frozen=True)
class ChatClient:
    """``POST {base_url}/chat/completions`` with a timeout and one retry on transport errors."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 30.0
    retries: int = 1

    def chat(self, system: str, user: str, http: httpx.Client) -> str:
        url = self.base_url.rstrip("/") + "/chat/completions"
        body = {
            "model": self.model,
            "temperature": 0.0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        }
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        for attempt in range(self.retries + 1):
            try:
                resp = http.post(url, json=body, headers=headers, timeout=self.timeout_s)
                break
            except httpx.TransportError as e:
                if attempt == self.retries:
                    raise LabelerError(f"labeler endpoint {url} unreachable: {e!r}") from None
        if resp.status_code != 200:
            raise LabelerError(f"labeler endpoint {url} answered HTTP {resp.status_code}")
        try:
            content = resp.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise LabelerError(f"labeler endpoint {url} sent a non-OpenAI reply") from None
        if not isinstance(content, str):
            raise LabelerError(f"labeler endpoint {url} sent no text content")
        return content


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in a reply (code fences and chatter around it allowed)."""
    start = text.find("{")
    while start >= 0:
        try:
            value, _ = json.JSONDecoder().raw_decode(text[start:])
            if isinstance(value, dict):
                return value
        except ValueError:
            pass
        start = text.find("{", start + 1)
    return None


def parse_families_reply(text: str, names: Sequence[str]) -> dict[str, str]:
    """``{name: family}`` for the asked names the reply classifies validly (others omitted)."""
    obj = _json_object(text) or {}
    out = {}
    for n in names:
        fam = obj.get(n)
        if isinstance(fam, str) and fam.strip().upper() in FAMILIES:
            out[n] = fam.strip().upper()
    return out


def parse_label_reply(text: str) -> str | None:
    obj = _json_object(text)
    if obj is not None and isinstance(obj.get("label"), str):
        text = obj["label"]
    m = re.search(r"\b(ANSWER|SEARCH|CALCULATE|MIXED)\b", text.upper())
    return m.group(1) if m else None


def label_from_ground_truth(task: Task, families: FamilyMap) -> str | None:
    """The route an RLLA ground truth implies; None for ground truths that are bare answers."""
    if "rlla" not in task.data_source:
        return None
    if ground_truth_type(task.ground_truth) in ("R", "N"):
        return ANSWER
    try:
        calls = parse_tool_calls(task.ground_truth)
    except ValueError:
        return None
    fams = {families.family(str(c.get("name", ""))) for c in calls}
    if fams == {SEARCH}:
        return SEARCH
    if fams == {CALCULATE}:
        return CALCULATE
    return MIXED


def task_tools(task: Task) -> list[ToolInfo]:
    return message_tools(task.messages) + spec_tools(task.tools)


@dataclass
class Labels:
    tools: dict[str, str] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)  # task_id -> one of LABELS
    stats: dict[str, int] = field(default_factory=dict)

    def to_json(self, model: str = "") -> dict[str, Any]:
        return {"version": 1, "model": model, **vars(self)}


def label_tasks(
    tasks: Sequence[Task],
    client: ChatClient,
    families: FamilyMap | None = None,
    tools_per_request: int = 20,
    max_example_queries: int = -1,
    progress: Callable[[str], None] | None = None,
    extra_tools: Sequence[ToolInfo] = (),
) -> Labels:
    """Ask ``client`` for tool families (the tasks' own and ``extra_tools``, e.g. environment
    tools), then label every task (see the module docstring)."""
    fm = families or FamilyMap()
    tools = {t.name: t for task in tasks for t in task_tools(task)}
    tools.update({t.name: t for t in extra_tools})
    for t in tools.values():
        fm.add([t])
    stats = {"requests": 0, "failed": 0, "tools_labelled": 0, "examples_asked": 0}
    stats["answers_parsed"] = 0
    out = Labels(stats=stats)
    with httpx.Client() as http:

        def ask(system: str, user: str) -> str | None:
            stats["requests"] += 1
            try:
                return client.chat(system, user, http)
            except LabelerError as e:
                if stats["requests"] == 1:
                    raise  # the first request failed: the endpoint is down or not OpenAI-like
                stats["failed"] += 1
                log.warning("labeler request failed (%s); going on without its answer", e)
                return None

        names = sorted(tools)
        for s in range(0, len(names), tools_per_request):
            chunk = names[s : s + tools_per_request]
            listing = [{"name": n, "description": tools[n].description} for n in chunk]
            reply = ask(FAMILY_PROMPT, json.dumps(listing, ensure_ascii=False))
            got = parse_families_reply(reply or "", chunk)
            out.tools.update(got)
            stats["tools_labelled"] += len(got)
            if progress:
                progress(f"tools {min(s + tools_per_request, len(names))}/{len(names)}")
        fm.overrides.update(out.tools)
        for task in tasks:
            label = label_from_ground_truth(task, fm)
            budget_left = max_example_queries < 0 or stats["examples_asked"] < max_example_queries
            if label is None and budget_left:
                stats["examples_asked"] += 1
                label = parse_label_reply(ask(EXAMPLE_PROMPT, _example_text(task)) or "")
                stats["answers_parsed"] += int(label is not None)
            if label in LABELS:
                out.examples[task.task_id] = label
    stats["examples_labelled"] = len(out.examples)
    if stats["requests"] and stats["tools_labelled"] == 0 and stats["answers_parsed"] == 0:
        raise LabelerError(
            f"labeler endpoint {client.base_url} answered {stats['requests']} requests but no "
            "reply could be parsed (garbage?)"
        )
    return out


def _example_text(task: Task) -> str:
    request = "\n".join(str(m["content"]) for m in task.messages if m.get("role") == "user")
    offered = ", ".join(t.name for t in task_tools(task)) or "(the environment's own)"
    return (
        f"Request:\n{request}\n\nReference answer: {task.ground_truth}\n"
        f"Task type: {task.task_type}\nTools offered: {offered}"
    )
