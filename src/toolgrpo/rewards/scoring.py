"""Scoring a task's decoded trajectory: picks the reward by ``data_source`` and adds flag-free
diagnostics (format pass, exact tool calls) so metrics mean the same under every reward flag."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, fields

from toolgrpo.data.task import Task
from toolgrpo.envs.registry import env_types
from toolgrpo.rewards.rlla import compute_score, extract_answer, parse_tool_calls
from toolgrpo.rewards.types import RllaFlags

_PLAIN = RllaFlags(**{f.name: False for f in fields(RllaFlags)})


@dataclass(frozen=True)
class Score:
    total: float
    format: float
    correctness: float
    length: float
    format_ok: bool  # the RLLA format check passes (flag-independent)
    exact_call: bool | None  # predicted calls == GT calls; None when the GT calls no tool


def supports(data_source: str) -> bool:
    return "rlla" in data_source


def check_task(task: Task) -> None:
    """Refuse at load time a task no reward can score (unknown source, malformed ground truth).
    Task types with a built-in or registered environment are scored there, not here."""
    if task.task_type != "rlla" and task.task_type in env_types():
        return
    if not supports(task.data_source):
        raise ValueError(f"no reward for data_source {task.data_source!r} (known: rlla)")
    compute_score("", task.ground_truth, 0, _PLAIN)  # raises ValueError on a malformed GT


def score(task: Task, solution_str: str, step: int, flags: RllaFlags | None) -> Score:
    """The task reward (RLLA score for RLLA rows) for one decoded prompt+response string."""
    if not supports(task.data_source):
        raise ValueError(f"no reward for data_source {task.data_source!r}")
    parts = compute_score(solution_str, task.ground_truth, step, flags)
    plain = compute_score(solution_str, task.ground_truth, 0, _PLAIN)
    exact: bool | None = None
    if "<tool_call>" in task.ground_truth:
        try:
            exact = parse_tool_calls(extract_answer(solution_str)) == parse_tool_calls(
                task.ground_truth
            )
        except ValueError:
            exact = False
    return Score(
        total=float(parts.total),
        format=float(parts.format),
        correctness=float(parts.correctness),
        length=float(parts.length),
        format_ok=plain.format == 1.0,
        exact_call=exact,
    )


def is_finite(s: Score) -> bool:
    return all(finite_in_float32(v) for v in (s.total, s.format, s.correctness, s.length))


def finite_in_float32(x: float) -> bool:
    """Finite once cast to float32, the dtype scores train in: ``1e39`` is a finite Python
    float but ``inf`` in float32, so ``reward.nan_policy`` must see it as non-finite too.
    ``struct`` rounds as the cast does and raises where the cast would overflow."""
    if not math.isfinite(x):
        return False
    try:
        struct.pack("<f", x)
    except OverflowError:
        return False
    return True
