"""JSON forms of the types that cross a remote environment's socket.

Kept apart from the server and the client so both sides (and tests) agree on one definition, and
so neither needs to import FastAPI or websockets just to encode a ``Task``.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from toolgrpo.data.task import Task
from toolgrpo.envs.base import EnvReward, EnvStart, Transcript
from toolgrpo.tools.types import ToolCall, ToolResult

# The handshake reply's header saying when the client sends the task's answer: "reset" (the
# served env needs it from the start) or "reward" (withheld until the episode is scored).
GROUND_TRUTH_HEADER = "x-toolgrpo-ground-truth"


class WireError(ValueError):
    """A message that does not have the shape the protocol promises."""


def _need(d: Any, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise WireError(f"{what}: missing field {key!r}")
    if not isinstance(d[key], kind):
        raise WireError(f"{what}: field {key!r} has type {type(d[key]).__name__}")
    return d[key]


def task_to_dict(task: Task) -> dict[str, Any]:
    return {
        "task_id": task.task_id,
        "messages": [dict(m) for m in task.messages],
        "ground_truth": task.ground_truth,
        "data_source": task.data_source,
        "task_type": task.task_type,
        "tools": [dict(t) for t in task.tools],
        "meta": dict(task.meta),
    }


def task_from_dict(d: Any) -> Task:
    return Task(
        task_id=str(_need(d, "task_id", (str, int), "task")),
        messages=tuple(dict(m) for m in _need(d, "messages", list, "task")),
        ground_truth=str(d.get("ground_truth", "")),
        data_source=str(d.get("data_source", "rlla")),
        task_type=str(d.get("task_type", "rlla")),
        tools=tuple(dict(t) for t in d.get("tools") or ()),
        meta=dict(d.get("meta") or {}),
    )


def call_to_dict(call: ToolCall) -> dict[str, Any]:
    return {
        "name": call.name,
        "arguments": call.arguments,
        "raw": call.raw,
        "parse_error": call.parse_error,
        "id": call.id,
    }


def call_from_dict(d: Any) -> ToolCall:
    args = d.get("arguments") if isinstance(d, dict) else None
    return ToolCall(
        name=str(_need(d, "name", str, "call")),
        arguments=args if isinstance(args, dict) else {},
        raw=str(d.get("raw") or ""),
        parse_error=d.get("parse_error"),
        id=str(d.get("id") or ""),
    )


def result_to_dict(result: ToolResult) -> dict[str, Any]:
    return {
        "text": result.text,
        "is_error": result.is_error,
        "error_type": result.error_type,
        "name": result.name,
        "call_id": result.call_id,
        "metrics": dict(result.metrics),
        "done": result.done,
    }


def result_from_dict(d: Any) -> ToolResult:
    try:
        return ToolResult(
            text=str(_need(d, "text", str, "result")),
            is_error=bool(d.get("is_error", False)),
            error_type=d.get("error_type"),
            name=str(d.get("name") or ""),
            call_id=str(d.get("call_id") or ""),
            metrics={str(k): float(v) for k, v in (d.get("metrics") or {}).items()},
            done=d.get("done") is True,  # absent (older peers) or not a true boolean: not done
        )
    except (TypeError, ValueError) as e:  # bad error_type, non-numeric metric
        raise WireError(f"result: {e}") from e


def start_to_dict(start: EnvStart) -> dict[str, Any]:
    return {"messages": start.messages, "tools": start.tools}


def start_from_dict(d: Any) -> EnvStart:
    return EnvStart(
        messages=list(_need(d, "messages", list, "start")), tools=list(d.get("tools") or [])
    )


def transcript_to_dict(t: Transcript) -> dict[str, Any]:
    return {
        "messages": t.messages,
        "text": t.text,
        "stop_reason": t.stop_reason,
        "num_turns": t.num_turns,
        "step": t.step,
    }


def transcript_from_dict(d: Any) -> Transcript:
    return Transcript(
        messages=list(_need(d, "messages", list, "transcript")),
        text=str(d.get("text", "")),
        stop_reason=str(d.get("stop_reason", "answer")),
        num_turns=int(d.get("num_turns", 0)),
        step=int(d.get("step", 0)),
    )


def reward_to_dict(r: EnvReward) -> dict[str, Any]:
    return {"score": float(r.score), "parts": {k: float(v) for k, v in r.parts.items()}}


def reward_from_dict(d: Any) -> EnvReward:
    score = _need(d, "score", (int, float), "reward")
    parts = d.get("parts") or {}
    if not isinstance(parts, dict):
        raise WireError("reward: field 'parts' is not an object")
    return EnvReward(float(score), {str(k): float(v) for k, v in parts.items()})


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (the server's safe default binding)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
