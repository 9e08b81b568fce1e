"""What the router knows about a dataset, built once at startup: the family of every tool its
tasks offer (RLLA system text, task specs, and each environment's own tools) and the weak labels.
Bad sidecars are refused here, naming the key; a failing labeler only costs the labels."""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from toolgrpo.config.loader import ConfigError
from toolgrpo.config.router import RouterConfig
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env, EnvStart
from toolgrpo.envs.registry import EnvRouter
from toolgrpo.rollout.env_calls import STARTUP_TIMEOUT_S, startup_probe
from toolgrpo.router.families import FamilyFileError, FamilyMap, ToolInfo, read_family_file
from toolgrpo.router.labeler import ChatClient, LabelerError, Labels, label_tasks, task_tools
from toolgrpo.router.routes import FAMILIES, LABELS
from toolgrpo.safe_io import write_text

log = logging.getLogger(__name__)
RESET_TIMEOUT_S = STARTUP_TIMEOUT_S  # construction, reset and close of a tool-listing env


async def _reset(env: Env) -> EnvStart:
    return await env.reset()


def env_tools(tasks: Sequence[Task], envs: EnvRouter) -> list[ToolInfo]:
    """Tools of environments whose tasks carry none themselves (calculator, search): one reset
    of one task per such task type."""
    from toolgrpo.router.families import spec_tools

    found: list[ToolInfo] = []
    seen: set[str] = set()
    for task in tasks:
        if task.task_type in seen or task.task_type == "rlla" or task_tools(task):
            continue
        seen.add(task.task_type)
        try:  # built, reset and closed, each within its deadline (the env is closed either way)
            _, start = asyncio.run(startup_probe(envs, task, _reset, RESET_TIMEOUT_S))
        except Exception as e:  # a remote env may be down at startup: families fall back
            log.warning("router: could not list the tools of %s: %s", task.task_type, e)
            continue
        found += spec_tools(start.tools)
    return found


def build_families(
    tasks: Sequence[Task],
    envs: EnvRouter | None,
    families_file: str = "",
    label_tools: dict[str, str] | None = None,
) -> FamilyMap:
    fm = FamilyMap()
    for t in tasks:
        fm.add(task_tools(t))
    if envs is not None:
        fm.add(env_tools(tasks, envs))
    fm.overrides.update({k: v for k, v in (label_tools or {}).items() if k in fm.known})
    if families_file:
        try:
            fm.overrides.update(read_family_file(families_file))
        except FamilyFileError as e:
            raise ConfigError(f"router.families_file: {e}") from None
        unknown = fm.unknown_overrides()
        if unknown:
            hints = [
                f"{u!r} (did you mean {close[0]!r}?)" if close else repr(u)
                for u in unknown[:8]
                for close in [difflib.get_close_matches(u, list(fm.known), n=1)]
            ]
            more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
            raise ConfigError(
                f"router.families_file={families_file!r} names tools that no training task "
                f"offers: {', '.join(hints)}{more}"
            )
    return fm


def read_labels(path: str | Path) -> Labels:
    """A labels file from ``toolgrpo label``: ``{"tools": {...}, "examples": {task_id: label}}``."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"router.label_file: cannot read {p}: {e}") from None
    examples = data.get("examples") if isinstance(data, dict) else None
    if not isinstance(examples, dict):
        raise ConfigError(f"router.label_file: {p} has no 'examples' object (task_id -> label)")
    bad = {k: v for k, v in examples.items() if str(v).upper() not in LABELS}
    if bad:
        first = next(iter(bad.items()))
        raise ConfigError(
            f"router.label_file: {p} has {len(bad)} labels outside {', '.join(LABELS)}, e.g. "
            f"{first[0]!r}: {first[1]!r}"
        )
    tools = data.get("tools") if isinstance(data.get("tools"), dict) else {}
    tools = {k: str(v).upper() for k, v in tools.items() if str(v).upper() in FAMILIES}
    return Labels(tools, {k: str(v).upper() for k, v in examples.items()})


def load_labels(
    rc: RouterConfig, tasks: Sequence[Task], envs: EnvRouter | None = None
) -> Labels | None:
    """The label file if it exists; else, with ``router.labeler`` set, fresh labels (written to
    the label file when one is named). A labeler failure is logged and training goes on."""
    if rc.label_file and Path(rc.label_file).is_file():
        return read_labels(rc.label_file)
    lab = rc.labeler
    if not lab.base_url:
        return None
    client = ChatClient(lab.base_url, lab.model, os.environ.get(lab.api_key_env), lab.timeout_s)
    try:
        labels = label_tasks(tasks, client, extra_tools=env_tools(tasks, envs) if envs else ())
    except LabelerError as e:
        log.error("router labeler failed: %s; training continues without labels", e)
        return None
    if rc.label_file:
        write_text(rc.label_file, json.dumps(labels.to_json(lab.model), indent=1))
    return labels
