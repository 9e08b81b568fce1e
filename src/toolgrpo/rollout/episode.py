"""One task played to the end as one training sample.

The episode's response is every token after the opening prompt: the policy's own samples (mask 1,
with the log-probs they were drawn with) and the rendered deltas between turns — tool results,
follow-up user turns, the template's turn markers (mask 0, log-prob 0). The last delta (after the
final turn's tool results) carries no generation prompt: no turn follows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from toolgrpo.tools.types import ToolCall

# done: a tool result (or a text environment's step) ended the episode; env_error: the
# environment failed (``Episode.env_failure`` says how) and the episode is left out of training.
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


@dataclass(frozen=True)
class NegativeSample:
    """A rolled-back attempt, as a training row: the parent's prompt and response up to and
    including the failing turn (no tool output), only that turn's tokens with mask 1."""

    task_id: str
    task_type: str
    uid: str  # the parent's GRPO group
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]  # what the failing turn was sampled with; 0.0 where mask 0
    error_messages: list[str]
    error_types: list[str]
    tool_position: str  # "turn_N": the failing assistant turn, 1-based
    assistant_turns: int
    user_turns: int
    tool_calls: list[ToolCall]
    attempt: int  # 0 for the first failure of that turn, 1 for its first retry, ...


@dataclass
class RollbackStats:
    """Per episode. Rolled-back calls stay in the episode's ``tool_calls``/``tool_errors`` (the
    policy made them); ``discarded_*`` says how many of those are not in the final transcript.
    Every failed attempt is one of: a negative, ``erased``, ``capped``, forked or left standing."""

    rollbacks: int = 0  # turns rolled back (or relabelled) at least once
    retries: int = 0  # re-sampled attempts (relabel: turns after a relabelled failure)
    recovered: int = 0  # rolled-back turns whose last attempt ran tools that all succeeded
    discarded_calls: int = 0
    discarded_errors: int = 0
    failed: int = 0  # failed attempts, whatever became of them
    erased: int = 0  # retried without a trace (save_negative_samples=false)
    capped: int = 0  # left standing because the group's negative budget was spent
    # relabel: failing turns moved out of this row into their negative; fission: 1 when this
    # episode's first failure was forked into a group of continuations (``Episode.forks``)
    forks: int = 0

    @property
    def repaired(self) -> bool:
        """The episode's kept trajectory is not its first try: a failure was undone or
        relabelled (a fission fork leaves its parent as sampled)."""
        return self.rollbacks > 0


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
    rollback: RollbackStats = field(default_factory=RollbackStats)  # tool rollback
    negatives: list[NegativeSample] = field(default_factory=list)  # rolled-back failed attempts
    # The rewards the environment's steps returned (``ToolResult.reward``, ``TextStep.reward``),
    # one per step of the kept trajectory; the episode's return adds their sum to its reward.
    step_rewards: list[float] = field(default_factory=list)
    # Fission: the continuations sampled from this episode's first failed call (their own GRPO
    # group, ``rollout.fission``); on a continuation, ``fork_of`` is its parent's uid.
    forks: list[Episode] = field(default_factory=list)
    fork_of: str | None = None
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

    @property
    def step_return(self) -> float:
        """The sum of the steps' rewards (0.0 when no step returned one)."""
        return math.fsum(self.step_rewards)
