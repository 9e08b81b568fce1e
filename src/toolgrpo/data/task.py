"""The unit of work every layer above speaks: one prompt with what is needed to score it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Task:
    """One prompt; ``task_id`` is stable across runs, GRPO group uids are made per step."""

    task_id: str
    messages: tuple[dict[str, str], ...]
    ground_truth: str
    data_source: str = "rlla"
    task_type: str = "rlla"
    tools: tuple[dict[str, Any], ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class RowProblem:
    """A dataset row that was refused, with its position so the user can find it."""

    source: str
    index: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source} row {self.index}: {self.reason}"
