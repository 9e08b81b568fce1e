"""One task played to the end as one training sample.

The episode's response is every token after the opening prompt: the policy's own samples (mask 1,
with the log-probs they were drawn with) and the rendered deltas between turns — tool results,
follow-up user turns, the template's turn markers (mask 0, log-prob 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolgrpo.rollout.rollback import NegativeSample, RollbackStats

# done: a tool result ended the episode (``ToolResult.done``); env_error: the environment failed
# (``Episode.env_failure`` says how) and the episode is left out of training.
STOP_REASONS = (
    "answer",
    "done",
    "max_turns",
    "context",
    "length",
    "env_error",
    "prompt_too_long",
)


class EnvFailureError(RuntimeError):
    """More of a step's episodes failed in their environments than
    ``multi_turn.max_env_failure_ratio`` allows: the run stops (the CLI prints one line)."""


@dataclass
class Episode:
    task_id: str
    task_type: str
    uid: str  # the GRPO group: all episodes of one task in one step share it
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1 = sampled by the policy
    logprobs: list[float] = field(default_factory=list)  # sampling log-probs (0.0 where mask 0)
    # The conversation: assistant turns as written plus OpenAI-style ``tool_calls``, tool results
    # with ``tool_call_id`` (``rollout.turns``); records only, the tokens never come from them.
    messages: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    num_turns: int = 0  # assistant turns
    truncated: bool = False
    stop_reason: str = "answer"
    policy_version: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_error_types: dict[str, int] = field(default_factory=dict)
    tool_seconds: float = 0.0  # wall time inside the environment's tool calls (env.step)
    prefix_mismatches: int = 0  # turns whose re-rendered text did not extend the tokens exactly
    rollback: RollbackStats = field(default_factory=RollbackStats)  # tool rollback (issue #6)
    negatives: list[NegativeSample] = field(default_factory=list)  # rolled-back failed attempts
    meta: dict[str, Any] = field(default_factory=dict)
    # Why the environment failed (constructor, reset/step raised, transport, its own timeout,
    # reward raised): not the model's fault, so the episode is neither scored nor trained on.
    env_failure: str | None = None

    def append(self, ids: list[int], logprobs: list[float] | None) -> None:
        """Sampled ids (with their log-probs, mask 1) or a rendered delta (``None``: mask 0)."""
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(logprobs)} log-probs")
        self.response_ids.extend(ids)
        self.response_mask.extend([1 if logprobs is not None else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def sampled_tokens(self) -> int:
        return sum(self.response_mask)
