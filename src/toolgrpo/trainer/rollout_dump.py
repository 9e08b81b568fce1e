"""Rollout dumps (verl's ``trainer.rollout_data_dir``): each step's episodes as ``<step>.jsonl``.

Trajectories are what a tool-using agent is debugged by; one JSON object per episode keeps the
task, the messages, the tool results and which tokens were trained, so nobody writes code to read
one. ``toolgrpo report`` renders these files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from toolgrpo import safe_io
from toolgrpo.rollout.episode import Episode

DUMP_VERSION = 1


def mask_spans(tokenizer: Any, ids: Sequence[int], mask: Sequence[int]) -> list[dict[str, Any]]:
    """The response as runs of equal mask: ``{"text", "trained", "tokens"}`` each, in order."""
    spans: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            text = tokenizer.decode(list(ids[start:i]), skip_special_tokens=False)
            spans.append({"text": text, "trained": bool(mask[start]), "tokens": i - start})
            start = i
    return spans


def _num(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN
    return v


def _tool_calls(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each tool message with the assistant turn that asked for it (by position)."""
    out, turn = [], 0
    for m in messages:
        if m.get("role") == "assistant":
            turn += 1
        elif m.get("role") == "tool":
            out.append({"turn": turn, "name": m.get("name", ""), "result": m.get("content", "")})
    return out


def episode_records(
    ep: Episode, tokenizer: Any, policy: str = "actor", route: str | None = None
) -> list[dict[str, Any]]:
    """An episode, its rolled-back negatives (flagged) and its fission continuations (each a row
    of its own group, ``fork_of`` naming this episode's uid), as dump rows."""
    base = {"task_id": ep.task_id, "task_type": ep.task_type, "uid": ep.uid, "policy": policy}
    row = {
        **base,
        "route": route,
        "negative": False,
        "prompt": tokenizer.decode(ep.prompt_ids, skip_special_tokens=False),
        "messages": ep.messages,
        "tool_calls": _tool_calls(ep.messages),
        "spans": mask_spans(tokenizer, ep.response_ids, ep.response_mask),
        "reward": _num(ep.reward),
        "reward_parts": {k: _num(v) for k, v in ep.reward_parts.items()},
        "stop_reason": ep.stop_reason,
        "num_turns": ep.num_turns,
        "num_tool_calls": ep.tool_calls,
        "tool_errors": ep.tool_errors,
        "env_failure": ep.env_failure,
        "repaired": ep.rollback.repaired,  # a tool failure was rolled back or relabelled
        "policy_version": ep.policy_version,
        "fork_of": ep.fork_of,
    }
    rows = [row]
    for neg in ep.negatives:
        rows.append(
            {
                **base,
                "route": route,
                "negative": True,
                "prompt": row["prompt"],
                "messages": [],
                "tool_calls": [],
                "spans": mask_spans(tokenizer, neg.response_ids, neg.response_mask),
                "reward": None,
                "reward_parts": {},
                "stop_reason": "rolled_back",
                "errors": list(neg.error_messages),
                "tool_position": neg.tool_position,
            }
        )
    for fork in ep.forks:  # fission: continuations from the failed call, their own GRPO group
        rows.extend(episode_records(fork, tokenizer, policy, route))
    return rows


def completion_record(
    comp: Any, task: Any, uid: str, score: Any, tokenizer: Any, policy: str, route: str | None
) -> dict[str, Any]:
    """A single-turn RLLA completion as a dump row: one trained span, the RLLA reward parts."""
    parts = {k: _num(v) for k, v in asdict(score).items() if k != "total"}
    return {
        "task_id": task.task_id,
        "task_type": task.task_type,
        "uid": uid,
        "policy": policy,
        "route": route,
        "negative": False,
        "prompt": tokenizer.decode(comp.prompt_ids, skip_special_tokens=False),
        "messages": [],
        "tool_calls": [],
        "spans": mask_spans(tokenizer, comp.token_ids, [1] * len(comp.token_ids)),
        "reward": _num(score.total),
        "reward_parts": parts,
        "stop_reason": comp.finish_reason,
        "num_turns": 1,
    }


def bound(rows: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """At most ``limit`` rows (-1 = all), whole GRPO groups first so a group reads side by side;
    a group that would overflow the limit is cut, never dropped to nothing."""
    if limit < 0 or len(rows) <= limit:
        return rows
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["uid"], []).append(r)
    out: list[dict[str, Any]] = []
    for g in groups.values():
        out.extend(g[: limit - len(out)])
        if len(out) >= limit:
            break
    return out


class RolloutDumper:
    """Writes ``<dir>/<step>.jsonl`` (replaced if the step is re-run after a resume); a step's
    later generation batches (dynamic sampling) are appended, each bounded by ``limit``."""

    def __init__(self, directory: str | Path, limit: int = -1) -> None:
        self.dir = Path(directory)
        self.limit = limit

    def write(self, step: int, rows: list[dict[str, Any]], append: bool = False) -> Path:
        """The step's file replaced through a fresh temporary (``safe_io``): a link at it, or
        at any temporary's name, is never written through."""
        path = self.dir / f"{step}.jsonl"
        safe_io.refuse_link(path)
        head = path.read_text() if append and path.is_file() else ""
        lines = [
            json.dumps({"step": step, "v": DUMP_VERSION, **r}, default=str) + "\n"
            for r in bound(rows, self.limit)
        ]
        return safe_io.write_text(path, head + "".join(lines))

    def write_episodes(
        self,
        step: int,
        episodes: Sequence[Episode],
        tokenizer: Any,
        policies: Sequence[str] | None = None,
        routes: Sequence[str | None] | None = None,
        append: bool = False,
    ) -> Path:
        rows: list[dict[str, Any]] = []
        for i, ep in enumerate(episodes):
            pol = policies[i] if policies is not None else "actor"
            route = routes[i] if routes is not None else None
            rows += episode_records(ep, tokenizer, pol, route)
        return self.write(step, rows, append)


def make_dumper(trainer_cfg: Any) -> RolloutDumper | None:
    """The run's dumper, or None when ``trainer.rollout_data_dir`` is empty."""
    if not trainer_cfg.rollout_data_dir:
        return None
    return RolloutDumper(trainer_cfg.rollout_data_dir, trainer_cfg.rollout_data_samples_per_step)
