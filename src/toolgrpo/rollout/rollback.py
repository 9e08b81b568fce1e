"""Tool-call rollback: when a turn's tool results look like a failure, put the episode and its
environment back to where they were before that assistant turn and sample it again (mode
``retry``), or keep the failure with its error feedback, let the episode go on from it and train
the failing turn only in a negative (mode ``relabel``). Mode ``fission`` (``rollout.fission``)
forks a failure into a group of its own instead, and takes nothing from this module's guard.

No failed attempt is hidden (``failure_fate``): each is kept as a ``NegativeSample`` (an extra
member of its task's GRPO group scored ``negative_reward``, only the failing turn trained), or it
stands in the episode, trained under the episode's own reward. Only ``save_negative_samples=false``
erases failures, and the metrics count each one (``rollback/erased``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from toolgrpo.config.schema import (
    ROLLBACK_ERROR_JSON_KEYS,
    ROLLBACK_ERROR_PATTERNS,
    ROLLBACK_ERROR_TYPES,
    ROLLBACK_MODES,
)
from toolgrpo.envs.base import Env
from toolgrpo.rollout.episode import Episode, NegativeSample, RollbackStats
from toolgrpo.rollout.rollback_checks import (
    NegativeRewardTooHigh,
    SnapshotUnsupported,
    check_negative_reward,
    check_snapshot_support,
    unsupported_message,
)
from toolgrpo.rollout.tool_failures import compile_patterns, error_type, json_error
from toolgrpo.tools.types import ToolCall, ToolResult

__all__ = [  # the startup checks and the rows' types, where callers have always found them
    "NegativeRewardTooHigh",
    "NegativeSample",
    "RollbackStats",
    "SnapshotUnsupported",
    "check_negative_reward",
    "check_snapshot_support",
]

# What becomes of one failed attempt (``failure_fate``).
Fate = Literal["negative", "erased", "capped", "stands"]


@dataclass(frozen=True)
class RollbackPolicy:
    """What counts as a failed tool turn and what to do about it (from ``MultiTurnConfig``)."""

    max_retries: int = 2  # re-samplings (or relabels) of one failing turn; then it stands
    save_negatives: bool = True
    # Over all G episodes of a task; None = every failed attempt. Past the cap a failure stands.
    max_negatives_per_group: int | None = None
    negative_reward: float = -1.0
    # retry: rewind and re-sample | relabel: go on from the error feedback, the failing turn
    # trained only in its negative | fission: fork the first failure into a group of its own
    mode: str = "retry"
    fission_group_size: int = 4  # continuations sampled from one fork point
    max_forks_per_step: int | None = 8  # fork groups one step may add; None = every failure
    patterns: tuple[re.Pattern[str], ...] = field(
        default_factory=lambda: compile_patterns(ROLLBACK_ERROR_PATTERNS)
    )
    error_types: frozenset[str] = frozenset(ROLLBACK_ERROR_TYPES)
    json_error_keys: tuple[str, ...] = ROLLBACK_ERROR_JSON_KEYS

    def __post_init__(self) -> None:
        if self.mode not in ROLLBACK_MODES:
            raise ValueError(f"rollback mode {self.mode!r} is not one of {ROLLBACK_MODES}")
        if self.mode == "relabel" and not self.save_negatives:
            raise ValueError("relabel trains each failing turn only in its negative sample")
        if self.fission_group_size < 2:
            raise ValueError(f"fission_group_size must be >= 2, got {self.fission_group_size}")

    @property
    def keeps_negatives(self) -> bool:
        """Negative rows are added (fission adds continuation groups instead)."""
        return self.mode != "fission" and self.save_negatives and self.max_negatives_per_group != 0

    @classmethod
    def from_config(cls, mt: Any) -> RollbackPolicy | None:
        """``None`` when rollback is off, allows no retry (``retry``, ``relabel``) or no fork
        (``fission``): the loop then takes no snapshots and needs none."""
        mode = str(mt.rollback_mode)
        forks = mt.max_fission_forks_per_step
        if not mt.enable_tool_rollback or (mode != "fission" and mt.max_tool_retries == 0):
            return None
        if mode == "fission" and forks == 0:
            return None
        cap = mt.max_negative_samples_per_group
        return cls(
            max_retries=int(mt.max_tool_retries),
            save_negatives=bool(mt.save_negative_samples),
            max_negatives_per_group=None if cap is None else int(cap),
            negative_reward=float(mt.negative_reward),
            mode=mode,
            fission_group_size=int(mt.fission_group_size),
            max_forks_per_step=None if forks is None else int(forks),
            patterns=compile_patterns(mt.rollback_error_patterns),
            error_types=frozenset(mt.rollback_error_types),
            json_error_keys=tuple(mt.rollback_error_json_keys),
        )

    def failures(self, results: Sequence[ToolResult]) -> list[ToolResult]:
        """Results that trigger a rollback: a flagged error of a listed type, or an ordinary
        result whose text matches a pattern (a code tool may print a traceback and "succeed")
        or whose JSON sets an error field (a simulator's ``{"error": "..."}`` reply)."""
        return [
            r
            for r in results
            if (r.error_type in self.error_types if r.is_error else self._matches(r.text))
        ]

    def _matches(self, text: str) -> bool:
        return any(p.search(text) for p in self.patterns) or json_error(text, self.json_error_keys)


@dataclass
class NegativeBudget:
    """The negatives one GRPO group may still keep (``limit`` None: no cap); shared by the
    group's concurrent episodes (asyncio runs them on one thread, so a plain counter is safe)."""

    limit: int | None
    used: int = 0

    def take(self) -> bool:
        if self.limit is not None and self.used >= self.limit:
            return False
        self.used += 1
        return True


def failure_fate(policy: RollbackPolicy, attempts: int, budget: NegativeBudget | None) -> Fate:
    """What becomes of a failed attempt, the turn having been retried (or forked) ``attempts``
    times: ``stands`` once it has had ``max_retries`` (it stays in the episode, trained under the
    episode's reward); else ``erased`` when negatives are off (retried without a trace: design
    004's option, which hides failures); else ``capped`` when the group's budget is spent (it
    stands, as without rollback: the cap bounds extra rows, it never erases); else
    ``negative`` (kept as a negative sample, then retried or forked). Takes from ``budget``."""
    if attempts >= policy.max_retries:
        return "stands"
    if not policy.save_negatives:
        return "erased"
    if budget is not None and not budget.take():
        return "capped"
    return "negative"


@dataclass(frozen=True)
class Checkpoint:
    """The agent before an assistant turn; the episode's lists only grow, so lengths suffice."""

    response_len: int
    num_turns: int
    messages_len: int
    stream_text: str
    env_state: Any
    steps_len: int = 0  # ``Episode.step_rewards`` before the turn


def negative_sample(
    ep: Episode,
    cp: Checkpoint,
    calls: Sequence[ToolCall],
    failed: Sequence[ToolResult],
    attempt: int,
) -> NegativeSample:
    """The failed attempt as it stands right after its tool call ran (before the results are
    appended): pure, reads the episode only."""
    n = cp.response_len
    turn = slice(n, len(ep.response_ids))
    return NegativeSample(
        task_id=ep.task_id,
        task_type=ep.task_type,
        uid=ep.uid,
        prompt_ids=list(ep.prompt_ids),
        response_ids=list(ep.response_ids),
        response_mask=[0] * n + list(ep.response_mask[turn]),
        logprobs=[0.0] * n + list(ep.logprobs[turn]),
        error_messages=[r.text for r in failed],
        error_types=[error_type(r) for r in failed],
        tool_position=f"turn_{ep.num_turns}",
        assistant_turns=ep.num_turns,
        user_turns=sum(m.get("role") == "user" for m in ep.messages),
        tool_calls=list(calls),
        attempt=attempt,
    )


class TurnGuard:
    """The episode loop's hook: ``begin_turn`` before each assistant turn, ``after_tools`` once
    its calls ran (returns the stream text to resume from when it rolled back), ``finish`` at
    the end. Stats and negatives go onto the episode."""

    def __init__(self, policy: RollbackPolicy, budget: NegativeBudget | None) -> None:
        self.policy = policy
        self.budget = budget
        self._cp: Checkpoint | None = None
        self._attempts = 0  # failed attempts of the current turn that were retried or forked
        self._ok = False  # the current attempt ran tools and all of them succeeded
        self._rewound = False  # retry: the next turn re-samples this one from its checkpoint
        self._forked = False  # relabel: the next turn goes on from this one's error feedback

    async def begin_turn(self, ep: Episode, env: Env, stream_text: str) -> None:
        if self._rewound:  # a retry: same checkpoint
            self._rewound = self._ok = False
            return
        if not self._forked:  # a new turn: settle the last one
            self._settle(ep)
        state = await env.asnapshot() if self.policy.mode == "retry" else None
        self._cp = Checkpoint(
            len(ep.response_ids),
            ep.num_turns,
            len(ep.messages),
            stream_text,
            state,
            len(ep.step_rewards),
        )
        self._forked = self._ok = False

    async def after_tools(
        self, ep: Episode, env: Env, calls: Sequence[ToolCall], results: Sequence[ToolResult]
    ) -> str | None:
        failed = self.policy.failures(results)
        self._ok = bool(results) and not failed and not any(r.is_error for r in results)
        cp = self._cp
        if not failed or cp is None or env.fatal_error:
            return None
        ep.rollback.failed += 1
        relabel = self.policy.mode == "relabel"
        if relabel and (ep.num_turns >= env.max_turns or any(r.done for r in results)):
            return None  # no turn follows to go on from: the failure stands
        fate = failure_fate(self.policy, self._attempts, self.budget)
        ep.rollback.capped += int(fate == "capped")
        if fate in ("stands", "capped"):
            return None
        if fate == "negative":
            ep.negatives.append(negative_sample(ep, cp, calls, failed, self._attempts))
        ep.rollback.erased += int(fate == "erased")
        ep.rollback.rollbacks += int(self._attempts == 0)
        ep.rollback.retries += 1
        self._attempts += 1
        if relabel:  # the failing turn is trained in its negative only; the episode goes on
            relabel_turn(ep, cp)
            ep.rollback.forks += 1
            self._forked = True
            return None
        ep.rollback.discarded_calls += len(results)
        ep.rollback.discarded_errors += sum(r.is_error for r in results)
        await env.arestore(cp.env_state)
        rewind(ep, cp)
        self._rewound = True
        return cp.stream_text

    def finish(self, ep: Episode) -> None:
        self._settle(ep)

    def _settle(self, ep: Episode) -> None:
        """Recovered: the turn was rolled back (or forked) and its last attempt ran at least one
        tool call, none of whose results is an error (of any type) or a failure by the patterns.
        A retry that calls no tool, or one ended by the environment, did not recover."""
        if self._attempts and self._ok:
            ep.rollback.recovered += 1
        self._attempts, self._ok, self._cp = 0, False, None


def rewind(ep: Episode, cp: Checkpoint) -> None:
    """Cut the episode back to the checkpoint (``ep.messages`` is the loop's own list)."""
    n = cp.response_len
    del ep.response_ids[n:], ep.response_mask[n:], ep.logprobs[n:]
    del ep.messages[cp.messages_len :]
    del ep.step_rewards[cp.steps_len :]  # an undone step's reward goes with it
    ep.num_turns = cp.num_turns


def relabel_turn(ep: Episode, cp: Checkpoint) -> None:
    """Relabel: the failing turn (everything since the checkpoint) stays in the episode's tokens
    as context for what follows, but leaves its training row (mask 0, log-prob 0): its
    negative trains it, so the episode's reward never reinforces the failing call."""
    n = cp.response_len
    k = len(ep.response_ids) - n
    ep.response_mask[n:] = [0] * k
    ep.logprobs[n:] = [0.0] * k


def make_guard(
    env: Env, task_type: str, policy: RollbackPolicy | None, budget: NegativeBudget | None
) -> TurnGuard | None:
    """The episode's guard, after ``reset`` (when a remote environment knows if it can
    snapshot); ``None`` when rollback is off, is ``fission`` (``fission.make_recorder``) or the
    environment never runs a tool. Only ``retry`` restores state: ``relabel`` works with
    environments that cannot snapshot."""
    if policy is None or policy.mode == "fission" or env.single_turn or env.owns_turn:
        return None
    if policy.mode == "retry" and not env.supports_snapshot:
        raise SnapshotUnsupported(unsupported_message(task_type, env))
    return TurnGuard(policy, budget)
