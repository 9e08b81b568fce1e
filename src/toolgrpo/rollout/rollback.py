"""Tool-call rollback (issue #6): when a turn's tool results look like a failure, put the episode
and its environment back to where they were before that assistant turn and sample it again
(mode ``retry``), or keep the failure with its error feedback and let the episode go on from it
(mode ``fission``, after Fission-GRPO).

No failed attempt is hidden (``failure_fate``): each is kept as a ``NegativeSample`` (an extra
member of its task's GRPO group scored ``negative_reward``, only the failing turn trained), or it
stands in the episode, trained under the episode's own reward. Only ``save_negative_samples=false``
erases failures, and the metrics count each one (``rollback/erased``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from toolgrpo.config.schema import (
    ROLLBACK_ERROR_JSON_KEYS,
    ROLLBACK_ERROR_PATTERNS,
    ROLLBACK_ERROR_TYPES,
    ROLLBACK_MODES,
)
from toolgrpo.data.task import Task
from toolgrpo.envs.base import Env
from toolgrpo.envs.registry import EnvConfigError, EnvRouter
from toolgrpo.rollout.tool_failures import compile_patterns, error_type, json_error
from toolgrpo.tools.types import ToolCall, ToolResult

if TYPE_CHECKING:
    from toolgrpo.rollout.episode import Episode

# What becomes of one failed attempt (``failure_fate``).
Fate = Literal["negative", "erased", "capped", "stands"]


class SnapshotUnsupported(EnvConfigError):
    """Rollback is on but an environment cannot snapshot its state: a setup error, so it stops
    the run instead of silently wasting episodes."""


@dataclass(frozen=True)
class RollbackPolicy:
    """What counts as a failed tool turn and what to do about it (from ``MultiTurnConfig``)."""

    max_retries: int = 2  # re-samplings (or forks) of one failing turn; then the failure stands
    save_negatives: bool = True
    # Over all G episodes of a task; None = every failed attempt. Past the cap a failure stands.
    max_negatives_per_group: int | None = None
    negative_reward: float = -1.0
    mode: str = "retry"  # retry: rewind and re-sample | fission: go on from the error feedback
    patterns: tuple[re.Pattern[str], ...] = field(
        default_factory=lambda: compile_patterns(ROLLBACK_ERROR_PATTERNS)
    )
    error_types: frozenset[str] = frozenset(ROLLBACK_ERROR_TYPES)
    json_error_keys: tuple[str, ...] = ROLLBACK_ERROR_JSON_KEYS

    def __post_init__(self) -> None:
        if self.mode not in ROLLBACK_MODES:
            raise ValueError(f"rollback mode {self.mode!r} is not one of {ROLLBACK_MODES}")
        if self.mode == "fission" and not self.save_negatives:
            raise ValueError("fission trains each failing turn only in its negative sample")

    @property
    def keeps_negatives(self) -> bool:
        return self.save_negatives and self.max_negatives_per_group != 0

    @classmethod
    def from_config(cls, mt: Any) -> RollbackPolicy | None:
        """``None`` when rollback is off or allows no retry: the loop then takes no snapshots
        and needs none."""
        if not mt.enable_tool_rollback or mt.max_tool_retries == 0:
            return None
        cap = mt.max_negative_samples_per_group
        return cls(
            max_retries=int(mt.max_tool_retries),
            save_negatives=bool(mt.save_negative_samples),
            max_negatives_per_group=None if cap is None else int(cap),
            negative_reward=float(mt.negative_reward),
            mode=str(mt.rollback_mode),
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
    Every failed attempt is one of: a negative, ``erased``, ``capped`` or left standing."""

    rollbacks: int = 0  # turns rolled back (or forked) at least once
    retries: int = 0  # re-sampled attempts (fission: turns after a fork)
    recovered: int = 0  # rolled-back turns whose last attempt ran tools that all succeeded
    discarded_calls: int = 0
    discarded_errors: int = 0
    failed: int = 0  # failed attempts, whatever became of them
    erased: int = 0  # retried without a trace (save_negative_samples=false)
    capped: int = 0  # left standing because the group's negative budget was spent
    forks: int = 0  # fission: failing turns moved out of this row into their negative

    @property
    def repaired(self) -> bool:
        """The episode's kept trajectory is not its first try: a failure was undone or forked."""
        return self.rollbacks > 0


@dataclass(frozen=True)
class Checkpoint:
    """The agent before an assistant turn; the episode's lists only grow, so lengths suffice."""

    response_len: int
    num_turns: int
    messages_len: int
    stream_text: str
    env_state: Any


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
        self._forked = False  # fission: the next turn goes on from this one's error feedback

    async def begin_turn(self, ep: Episode, env: Env, stream_text: str) -> None:
        if self._rewound:  # a retry: same checkpoint
            self._rewound = self._ok = False
            return
        if not self._forked:  # a new turn: settle the last one
            self._settle(ep)
        state = await env.asnapshot() if self.policy.mode == "retry" else None
        self._cp = Checkpoint(
            len(ep.response_ids), ep.num_turns, len(ep.messages), stream_text, state
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
        fission = self.policy.mode == "fission"
        if fission and (ep.num_turns >= env.max_turns or any(r.done for r in results)):
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
        if fission:  # the failing turn is trained in its negative only; the episode goes on
            fork(ep, cp)
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
    ep.num_turns = cp.num_turns


def fork(ep: Episode, cp: Checkpoint) -> None:
    """Fission: the failing turn (everything since the checkpoint) stays in the episode's tokens
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
    snapshot); ``None`` when rollback is off or the environment never runs a tool. Only
    ``retry`` restores state: ``fission`` works with environments that cannot snapshot."""
    if policy is None or env.single_turn:
        return None
    if policy.mode == "retry" and not env.supports_snapshot:
        raise SnapshotUnsupported(unsupported_message(task_type, env))
    return TurnGuard(policy, budget)


def check_snapshot_support(router: EnvRouter, tasks: Sequence[Task]) -> None:
    """At startup: every task type that runs tools must have an environment that can snapshot.
    One environment per type is built (not reset); a type that only learns at reset whether it
    can (a remote one) is checked then, by ``make_guard``."""
    seen: dict[str, Task] = {}
    for t in tasks:
        seen.setdefault(t.task_type, t)
    for task_type, task in sorted(seen.items()):
        env = router.make(task)
        if env.single_turn or env.supports_snapshot or env.snapshot_known_at_reset:
            continue
        raise SnapshotUnsupported(unsupported_message(task_type, env, router.spec(task_type).type))


class NegativeRewardTooHigh(EnvConfigError):
    """``negative_reward`` above the worst score an environment gives: a rolled-back attempt
    would be ranked above a real failure."""


def check_negative_reward(router: EnvRouter, tasks: Sequence[Task], negative_reward: float) -> None:
    """At startup, when negatives are kept: per task type that runs tools, ``negative_reward``
    must not exceed the lowest score of the environment's declared ``reward_range``. Types whose
    range is unknown (None) are not checked; their negatives' advantages are still clamped <= 0.
    An environment that fails to build is skipped here (the episode loop reports it)."""
    by_type: dict[str, list[Task]] = {}
    for t in tasks:
        by_type.setdefault(t.task_type, []).append(t)
    for task_type, group in sorted(by_type.items()):
        env = _first_env(router, group)
        if env is None or env.single_turn or env.reward_range is None:
            continue
        low = float(env.reward_range[0])
        if negative_reward > low:
            raise NegativeRewardTooHigh(
                f"actor_rollout_ref.rollout.multi_turn.negative_reward={negative_reward:g} is "
                f"above the lowest reward ({low:g}) of task type {task_type!r} "
                f"({type(env).__name__}, rewards in [{low:g}, {env.reward_range[1]:g}]): a failed "
                f"attempt would outrank a real failure; set negative_reward <= {low:g}"
            )


def _first_env(router: EnvRouter, tasks: Sequence[Task]) -> Env | None:
    for task in tasks:
        try:
            return router.make(task)
        except Exception:  # a bad row: the next one of its type tells us the range
            continue
    return None


def unsupported_message(task_type: str, env: Env, env_type: str = "") -> str:
    kind = (
        f"environment type {env_type!r} ({type(env).__name__})" if env_type else type(env).__name__
    )
    return (
        "actor_rollout_ref.rollout.multi_turn.enable_tool_rollback needs environments that can "
        f"snapshot their state, but task type {task_type!r} uses {kind}, which cannot; turn "
        "rollback off or leave that task type out of data.train_files"
    )
