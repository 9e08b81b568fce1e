"""What crosses the tool boundary: a parsed call going in, a result coming out.

A tool never raises into a rollout: every failure is a ``ToolResult`` with ``is_error`` set and an
``error_type`` from ``ERROR_TYPES``, and its text is what the model reads next turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# parse: the <tool_call> block was not JSON / lacked a name; unknown_tool: no tool of that name;
# invalid_arguments: failed the tool's JSON schema; exception: the tool raised; timeout: it ran too
# long; transport: a remote environment could not be reached; not_offered: the episode's route
# offers no such tool (the router's ANSWER route offers none), so the call never ran.
ERROR_TYPES = (
    "parse",
    "unknown_tool",
    "invalid_arguments",
    "exception",
    "timeout",
    "transport",
    "not_offered",
)


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for. A block that could not be parsed still yields a ``ToolCall``
    (``name`` may be empty, ``parse_error`` says why) so the model is told, not ignored."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""  # the text between the tags, verbatim
    parse_error: str | None = None
    id: str = ""  # position in the turn ("call_0", ...), echoed on the result


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool = False
    error_type: str | None = None  # one of ERROR_TYPES when is_error
    name: str = ""  # the tool that produced it ("" for a call that could not be parsed)
    call_id: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    # The environment ends the episode with this result (a submit/book/commit tool; OpenEnv's
    # ``StepResult.done``): the turn's results still reach the transcript, no model turn follows.
    done: bool = False
    # A reward for this call (verl's per-call tool rewards): the episode's return adds the sum of
    # its kept steps' rewards to the environment's final score (``envs.base``).
    reward: float = 0.0

    def __post_init__(self) -> None:
        if self.is_error and self.error_type not in ERROR_TYPES:
            raise ValueError(f"error_type must be one of {ERROR_TYPES}, got {self.error_type!r}")

    def to_message(self) -> dict[str, Any]:
        """The chat message the model sees (role ``tool``)."""
        return {"role": "tool", "name": self.name, "content": self.text}
